"""TLS and SASL on both sides of kipside, in front of a 3-broker cluster, with two principals
(the whole deployment at once; docs/running.md shows the same deployment, run by
tests/integration/secure_deployment.py).

Clients log in to kipside over TLS with SCRAM-SHA-512, and kipside terminates their SASL
(--sasl-credentials): the mode docs/security.md recommends when connections should share lanes
and coalesced requests, because kipside then knows each client's principal; in passthrough
each SASL client keeps a connection of its own and nothing is shared. kipside reaches every
broker over TLS (--upstream-ca) and logs in there as the client's principal's upstream user
(--sasl-upstream: alice-up, bob-up). The brokers are relaykit.secure's SIMULATION: ONE Tansu
presented as nodes 1, 2, 3, each node's address a TLS relay, then a SASL-enforcing relay that
records who logged in on each connection, the producer ids the broker granted there and what
each request carried.

- test_two_principals_coalesce_apart: three confluent-kafka producers as alice, two
  confluent-kafka and one kafka-python producer as bob, all idempotent, at once, to one
  9-partition topic (three partitions per node; each of a principal's producers writes one
  partition per node, and alice's and bob's write the same ones), a record per node at a
  time. Every producer's records are read back once and in order; kipside sent fewer
  ProduceRequests upstream than it received, and requests on alice's (and on bob's)
  connections carried batches of several producers of hers (his); every
  upstream connection logged in as one user, and every ProduceRequest on it carried only
  producer ids the broker granted to that user: no connection and no request carries two
  principals.
- test_transaction_preregistration_per_principal: alice and bob run transactional producers
  whose ids match one pre-registration rule, writing the same topic at once: kipside
  pre-registers for each; every AddPartitionsToTxn (the client's and kipside's own) went on a
  connection logged in as its transactional id's owner; committed records read back once, in
  order.

Run: .venv/bin/pytest tests/integration/test_secure_cluster.py -q -p no:cacheprovider
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import confluent_kafka as ck
import pytest
from conftest import ONE_TO_ONE, create_topics, fresh_topic, needs_kipside
from relaykit.sasl import Carried
from testkit.metrics import scrape

from .clients import FLUSH_TIMEOUT, Msg, assert_exactly_once_in_order, make_messages
from .clients_confluent import ck_config
from .clients_kafka_python import kp_producer, kp_send
from .clients_read_back import consume_assigned
from .secure_deployment import (
    TXN_OUTPUT,
    Deployment,
    ck_settings,
    kp_settings,
    secure_deployment,
)

pytestmark = [
    pytest.mark.integration,
    needs_kipside("these tests are about kipside's TLS and SASL"),
]

PARTITIONS = 9  # three per node: partition P on node P % 3 + 1
# client id -> (the user it logs in to kipside as, the partitions it writes: one per node);
# "-kp-" ones are kafka-python. A ProduceRequest carries one batch per partition, so a
# principal's producers write different partitions; three, as two producers waiting on each
# other's answers would only alternate on a lane. alice's and bob's share partitions.
PRODUCERS = {
    "alice-ck-1": ("alice", (0, 1, 2)),
    "alice-ck-2": ("alice", (3, 4, 5)),
    "alice-ck-3": ("alice", (6, 7, 8)),
    "bob-ck-1": ("bob", (0, 1, 2)),
    "bob-ck-2": ("bob", (3, 4, 5)),
    "bob-kp-1": ("bob", (6, 7, 8)),
}
UPSTREAM_OWNER = {"alice-up": "alice", "bob-up": "bob", "kipside": None}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with secure_deployment(tmp_path_factory.mktemp("secure-cluster")) as d:
        yield d


def produce_as(d: Deployment, client_id: str, topic: str, msgs: list[Msg], start: Any) -> None:
    """One idempotent producer logged in as PRODUCERS[client_id]'s user, sending a record to
    each of its partitions at a time and waiting for their delivery (so each round is one
    small request per node, the kind coalescing is for); every producer has its first round
    delivered before any goes on, so they overlap. Asserts every delivery."""
    user, partitions = PRODUCERS[client_id]
    rounds = [msgs[i : i + len(partitions)] for i in range(0, len(msgs), len(partitions))]
    if "-kp-" in client_id:
        producer = kp_producer(
            d.bootstrap, **kp_settings(d.files, user), client_id=client_id, enable_idempotence=True
        )
        try:
            for n, chunk in enumerate(rounds):
                futures = kp_send(producer, topic, chunk)
                producer.flush(timeout=FLUSH_TIMEOUT)
                for future in futures:
                    future.get(timeout=1)
                if n == 0:
                    start.wait()
        finally:
            producer.close(timeout=5)
        return
    errors: list[str] = []
    settings = {"client.id": client_id, "enable.idempotence": True, "linger.ms": 1}
    p = ck.Producer(ck_config(d.bootstrap, **ck_settings(d.files, user), **settings))

    def report(err: Any, _msg: Any) -> None:
        if err:
            errors.append(str(err))

    for n, chunk in enumerate(rounds):
        for m in chunk:
            p.produce(topic, m.value, m.key, m.partition, report, headers=list(m.headers))
        assert p.flush(FLUSH_TIMEOUT) == 0
        if n == 0:
            start.wait()
    assert errors == []


def run_all(targets: dict[str, Any]) -> None:
    """Run each callable in its own thread at once; re-raise the first failure."""
    failures: list[BaseException] = []

    def run(fn: Any) -> None:
        try:
            fn()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(fn,), daemon=True) for fn in targets.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(FLUSH_TIMEOUT + 30)
    assert not any(t.is_alive() for t in threads), "a client did not finish"
    if failures:
        raise failures[0]


def assert_principals_apart(carried: list[tuple[int, Carried]]) -> None:
    """Every upstream connection logged in as one user, and everything it carried was that
    user's: client ids, producer ids (granted to that user by InitProducerId answers on its
    own connections), transactional ids."""
    granted: dict[str, set[int]] = defaultdict(set)
    for _, c in carried:
        if c.user is not None:
            granted[c.user] |= c.granted_producer_ids
    assert not granted["alice-up"] & granted["bob-up"], granted
    for node, c in carried:
        where = f"node {node} connection {c.number} (logged in as {c.user})"
        assert c.refused == [] and c.failed_logins == 0, where
        if c.user is None:  # ApiVersions only, before the client authenticated
            assert not c.apis, where
            continue
        owner = UPSTREAM_OWNER[c.user]
        for pids in c.produce_requests:
            assert pids <= granted[c.user], f"{where}: a ProduceRequest carried {pids}"
        theirs = {cid for cid in c.client_ids if cid.startswith(("alice-", "bob-"))}
        assert all(cid.startswith(f"{owner}-") for cid in theirs), (where, theirs)
        for api, txn_id, client_id in c.transaction_requests:
            assert txn_id.startswith(f"tx-{owner}-"), (where, api, txn_id, client_id)


def test_two_principals_coalesce_apart(deployment: Deployment) -> None:
    d = deployment
    topic = fresh_topic(d.bootstrap, "secure", PARTITIONS, conf=ck_settings(d.files, "alice"))
    sent = {
        cid: [m._replace(partition=parts[m.partition]) for m in make_messages(60, 3, tag=cid)]
        for cid, (_, parts) in PRODUCERS.items()
    }
    metrics_before = scrape(d.admin_port)
    start = threading.Barrier(len(PRODUCERS), timeout=30)
    # Brokers that take 10 ms per answer keep each lane busy, so batches queue behind it.
    for front in d.brokers.fronts.values():
        front.sasl.response_delay_ms = 10
    try:
        run_all({cid: lambda cid=cid: produce_as(d, cid, topic, sent[cid], start) for cid in sent})
    finally:
        for front in d.brokers.fronts.values():
            front.sasl.response_delay_ms = 0
    metrics = scrape(d.admin_port)

    total = sum(len(msgs) for msgs in sent.values())
    got, marks = consume_assigned(
        d.bootstrap, topic, PARTITIONS, total, conf=ck_settings(d.files, "bob")
    )
    assert len(got) == total
    for cid, msgs in sent.items():
        assert_exactly_once_in_order(msgs, [m for m in got if m.value.startswith(cid.encode())])
    per_partition = {p: sum(m.partition == p for m in got) for p in range(PARTITIONS)}
    assert {p: hi - lo for p, (lo, hi) in marks.items()} == per_partition

    carried = [(n, c) for n, c in d.brokers.carried() if topic in c.topics]
    assert {c.user for _, c in carried} == {"alice-up", "bob-up"}
    assert {n for n, _ in carried} == {1, 2, 3}  # every node's leaders got their batches
    assert_principals_apart(d.brokers.carried())
    if not ONE_TO_ONE:  # --one-to-one: no shared lanes, nothing coalesces
        produce = {"api": "Produce"}
        received = metrics.value("kipside_client_requests_total", **produce) - (
            metrics_before.value("kipside_client_requests_total", 0.0, **produce)
        )
        upstream = metrics.value("kipside_upstream_requests_total", **produce) - (
            metrics_before.value("kipside_upstream_requests_total", 0.0, **produce)
        )
        assert upstream < received, (received, upstream)
        for user in ("alice-up", "bob-up"):
            assert any(c.mixed_produce_requests for _, c in carried if c.user == user), user


def transactions_as(d: Deployment, user: str, topic: str, batches: list[list[Msg]]) -> None:
    """A confluent-kafka transactional producer logged in as `user` (transactional id
    tx-USER-1, which the deployment's pre-registration rule matches), one committed
    transaction per batch."""
    settings = {"transactional.id": f"tx-{user}-1", "client.id": f"{user}-txn", "linger.ms": 5}
    p = ck.Producer(ck_config(d.bootstrap, **ck_settings(d.files, user), **settings))
    p.init_transactions(20)
    for batch in batches:
        p.begin_transaction()
        for m in batch:
            p.produce(topic, m.value, m.key, partition=m.partition, headers=list(m.headers))
        p.commit_transaction(20)


def test_transaction_preregistration_per_principal(deployment: Deployment) -> None:
    d = deployment
    topic = TXN_OUTPUT  # the output the deployment's transactions rule declares
    create_topics(d.bootstrap, [topic], PARTITIONS, conf=ck_settings(d.files, "alice"))
    sent = {user: make_messages(60, PARTITIONS, tag=f"{user}-txn") for user in ("alice", "bob")}
    before = scrape(d.admin_port).value("kipside_txn_preregistrations_total", 0.0)
    run_all(
        {
            user: lambda user=user: transactions_as(
                d, user, topic, [sent[user][i : i + 20] for i in range(0, 60, 20)]
            )
            for user in sent
        }
    )
    preregistered = scrape(d.admin_port).value("kipside_txn_preregistrations_total") - before

    total = sum(len(msgs) for msgs in sent.values())
    got, _ = consume_assigned(
        d.bootstrap, topic, PARTITIONS, total, "read_committed", conf=ck_settings(d.files, "bob")
    )
    for user, msgs in sent.items():
        assert_exactly_once_in_order(msgs, [m for m in got if m.value.startswith(user.encode())])

    assert_principals_apart(d.brokers.carried())
    adds: dict[str, set[str | None]] = defaultdict(set)  # transactional id -> who carried it
    for _, c in d.brokers.carried():
        for api, txn_id, _client in c.transaction_requests:
            if api == "ADD_PARTITIONS_TO_TXN":
                adds[txn_id].add(c.user)
    assert adds == {"tx-alice-1": {"alice-up"}, "tx-bob-1": {"bob-up"}}
    if not ONE_TO_ONE:  # --one-to-one: no shared lanes, no pre-registration
        assert preregistered >= 2 * 3, preregistered  # every transaction of each principal
