"""kipside as the SASL server (--sasl-credentials), logging in to a SASL-enforcing relay as each
client's principal (--sasl-upstream), with real clients.

One kipside serves the whole module, at debug log level and printing every span, so the last
test can search everything it wrote, and its admin endpoint, for the passwords used here.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator

import confluent_kafka as ck
import pytest
from conftest import fresh_topic

from .clients import Msg, assert_exactly_once_in_order, make_messages
from .clients_confluent import ck_config, ck_produce
from .clients_kafka_python import kp_produce, kp_producer, kp_send
from .clients_read_back import consume_assigned, produce_and_read_back
from .sasl_setup import SECRETS, SaslSetup, ck_sasl, py_sasl, sasl_kipside

pytestmark = pytest.mark.integration

PARTITIONS = 2
RULES = """
coalescing:
  lanes: 1  # every partition on one lane, so one request can carry two producers' batches
  linger_ms: 20
principals:
  - principal: "User:dave"
    topics: ["dave.*"]
    transactional_ids: ["dave-*"]
tracing:
  enabled: true
  api_keys: [Produce, Fetch, InitProducerId, SaslHandshake, SaslAuthenticate, Metadata]
"""


@pytest.fixture(scope="module")
def terminating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslSetup]:
    folder = tmp_path_factory.mktemp("sasl-termination")
    rules = folder / "rules.yaml"
    rules.write_text(RULES)
    extra = ("--rules", str(rules), "--admin", "0", "--log-level", "debug", "--trace-console")
    with sasl_kipside(folder, termination=True, extra=extra) as setup:
        yield setup


def upstream_users(setup: SaslSetup, topic: str) -> set[str | None]:
    """Who kipside logged in as on the relay connections that carried `topic`."""
    return {c.user for c in setup.relay.carried() if topic in c.topics}


@pytest.mark.parametrize(
    ("client", "mechanism"),
    [
        ("confluent-kafka", "PLAIN"),
        ("kafka-python", "SCRAM-SHA-256"),
        ("aiokafka", "SCRAM-SHA-512"),
    ],
)
def test_clients_authenticate_to_kipside(
    terminating: SaslSetup, client: str, mechanism: str
) -> None:
    """Each client logs in to kipside as alice; kipside carries its records as alice-up, the
    login --sasl-upstream gives User:alice; every record read back once, in order."""
    setup = terminating
    conf = ck_sasl(mechanism, "alice")
    topic = fresh_topic(setup.bootstrap, "term", PARTITIONS, conf=conf)
    msgs = make_messages(30, PARTITIONS, tag=client)
    if client != "confluent-kafka":
        conf = py_sasl(mechanism, "alice")
    got, marks = produce_and_read_back(client, setup.bootstrap, topic, msgs, PARTITIONS, conf)
    assert_exactly_once_in_order(msgs, got, marks)
    assert upstream_users(setup, topic) == {"alice-up"}
    assert [c.refused for c in setup.relay.carried() if c.refused] == []


def test_legacy_handshake_v0_client(terminating: SaslSetup) -> None:
    """kafka-python told the broker is Kafka 0.11 sends SaslHandshake v0 and raw SCRAM tokens:
    kipside answers them itself, then Kafka framing resumes."""
    setup = terminating
    mark = setup.kipside.log_mark()
    topic = fresh_topic(setup.bootstrap, "term-v0", PARTITIONS, conf=ck_sasl("PLAIN", "bob"))
    msgs = make_messages(10, PARTITIONS, tag="v0")
    # Not idempotent: Tansu 0.6.0 fails InitProducerId v0 (tansu_bugs.py), the version a
    # client that believes the broker is 0.11 sends.
    legacy = {"api_version": (0, 11), "enable_idempotence": False}
    kp_produce(setup.bootstrap, topic, msgs, **legacy, **py_sasl("SCRAM-SHA-512", "bob"))
    got, marks = consume_assigned(
        setup.bootstrap, topic, PARTITIONS, len(msgs), conf=ck_sasl("PLAIN", "bob")
    )
    assert_exactly_once_in_order(msgs, got, marks)
    assert upstream_users(setup, topic) == {"bob-up"}
    assert setup.kipside.wait_for_log(lambda line: "authenticated as User:bob" in line, mark)


def failing_client(setup: SaslSetup, conf: dict[str, object]) -> str:
    """The errors a confluent-kafka client reports when kipside refuses it."""
    errors: list[str] = []
    client = ck.Producer(
        {**ck_config(setup.bootstrap), **conf, "error_cb": lambda e: errors.append(str(e))}
    )
    with pytest.raises(ck.KafkaException):
        client.list_topics(timeout=3)
    client.flush(1)
    return " | ".join(errors)


def test_wrong_password(terminating: SaslSetup) -> None:
    setup = terminating
    mark = setup.kipside.log_mark()
    seen = failing_client(setup, ck_sasl("SCRAM-SHA-256", "alice", password="not-alices-Qp13"))
    assert "Authentication failed during authentication due to invalid credentials" in seen
    lines = setup.kipside.wait_for_log(lambda line: "authentication failed" in line, mark)
    assert lines and "wrong password for user 'alice'" in lines[0], lines
    assert "not-alices-Qp13" not in setup.kipside.log() + setup.kipside.stdout_path.read_text()


def test_request_before_authentication_closes(terminating: SaslSetup) -> None:
    setup = terminating
    mark = setup.kipside.log_mark()
    failing_client(setup, {})  # plaintext: Metadata without SASL
    lines = setup.kipside.wait_for_log(lambda line: "before authenticating" in line, mark)
    assert lines and "sent Metadata before authenticating; kipside requires SASL" in lines[0]


def test_principal_without_upstream_login(terminating: SaslSetup) -> None:
    """carol is in the credentials file, but --sasl-upstream has no login for User:carol."""
    setup = terminating
    mark = setup.kipside.log_mark()
    seen = failing_client(setup, ck_sasl("PLAIN", "carol"))
    assert "kipside has no login to the brokers for User:carol" in seen
    lines = setup.kipside.wait_for_log(lambda line: "has no upstream login" in line, mark)
    assert lines and "User:carol has no upstream login in" in lines[0], lines
    assert not [c for c in setup.relay.carried() if c.user == "carol"]


def test_two_principals_never_share(terminating: SaslSetup) -> None:
    """alice and bob produce at once, three idempotent producers each, to one topic: no
    upstream connection carries both, while one principal's producers share lanes and
    requests. (Three: two producers waiting on each other's answers alternate on a lane.)"""
    setup = terminating
    topic = fresh_topic(setup.bootstrap, "share", 4, conf=ck_sasl("PLAIN", "alice"))
    producers = {
        f"{user}-{i}": ck.Producer(
            ck_config(
                setup.bootstrap,
                **ck_sasl("PLAIN", user),
                **{"client.id": f"{user}-{i}", "enable.idempotence": True, "linger.ms": 0},
            )
        )
        for user in ("alice", "bob")
        for i in (1, 2, 3)
    }
    for producer in producers.values():  # connected and with a producer id before the race
        producer.produce(topic, b"warm-up", partition=0)
        assert producer.flush(15) == 0

    def send(name: str) -> None:
        # Small requests, one at a time, each waiting on the lane behind the others'; producer
        # N writes partition N, so a principal's producers' batches can share a request, and
        # alice's and bob's go to the same partitions.
        producer, partition = producers[name], int(name[-1])
        for i in range(20):
            producer.produce(topic, f"{name}-{i}".encode(), partition=partition)
            assert producer.flush(10) == 0

    # A broker that takes 20 ms per answer keeps a lane busy, so batches queue behind it.
    setup.relay.response_delay_ms = 20
    threads = [threading.Thread(target=send, args=(name,)) for name in producers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        setup.relay.response_delay_ms = 0
    carried = [c for c in setup.relay.carried() if topic in c.topics]
    by_user: dict[str | None, list[int]] = {}
    for connection in carried:
        by_user.setdefault(connection.user, []).append(connection.number)
        owner = {"alice-up": "alice-", "bob-up": "bob-"}[str(connection.user)]
        strangers = {c for c in connection.client_ids if c.startswith(("alice-", "bob-"))}
        assert {c for c in strangers if not c.startswith(owner)} == set(), connection
    assert set(by_user) == {"alice-up", "bob-up"}, by_user
    pids = {
        user: set().union(*(c.producer_ids for c in carried if c.user == user))
        for user in ("alice-up", "bob-up")
    }
    assert len(pids["alice-up"]) >= 3 and len(pids["bob-up"]) >= 3, pids  # lanes outlive topics
    assert not pids["alice-up"] & pids["bob-up"]
    # One principal's producers share: some upstream request carried several of alice's.
    assert any(c.mixed_produce_requests for c in carried if c.user == "alice-up")
    assert any(c.mixed_produce_requests for c in carried if c.user == "bob-up")


def test_principal_rules_refuse_what_dave_may_not_use(terminating: SaslSetup) -> None:
    """dave may use topics dave.* and transactional ids dave-*: the errors his client sees for
    anything else are Kafka's authorization errors, and nothing refused reached the relay."""
    setup = terminating
    dave = ck_sasl("PLAIN", "dave")
    mine = fresh_topic(setup.bootstrap, "dave.ok", 1, conf=dave)
    other = fresh_topic(setup.bootstrap, "other", 1, conf=ck_sasl("PLAIN", "alice"))
    ck_produce(setup.bootstrap, mine, make_messages(3, 1), conf=dave)
    errors: list[ck.KafkaError | None] = []
    producer = ck.Producer({**ck_config(setup.bootstrap), **dave, "message.timeout.ms": 5000})
    producer.produce(other, b"x", on_delivery=lambda error, _m: errors.append(error))
    assert producer.flush(10) == 0
    assert [e and e.code() for e in errors] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    transactional = ck.Producer(
        {**ck_config(setup.bootstrap), **dave, "transactional.id": "other-1"}
    )
    with pytest.raises(ck.KafkaException) as refused:
        transactional.init_transactions(10)
    assert refused.value.args[0].code() == ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    allowed = ck.Producer({**ck_config(setup.bootstrap), **dave, "transactional.id": "dave-1"})
    allowed.init_transactions(10)
    allowed.begin_transaction()
    allowed.produce(mine, b"in-txn", partition=0)
    allowed.commit_transaction(10)
    carried = [c for c in setup.relay.carried() if c.user == "dave-up"]
    assert not any(other in c.topics for c in carried)
    assert not any("other-1" in c.transactional_ids for c in carried)
    assert any("dave-1" in c.transactional_ids for c in carried)


def produce_mixed(setup: SaslSetup, mine: str, other: str, msgs: list[Msg]) -> None:
    """dave's kafka-python producer sends each message to `mine` and to `other` (refused), so
    that the two topics' batches ride in one ProduceRequest: every delivery to `mine` succeeds,
    every one to `other` fails with TopicAuthorizationFailedError."""
    from kafka.errors import TopicAuthorizationFailedError

    producer = kp_producer(setup.bootstrap, linger_ms=50, **py_sasl("PLAIN", "dave"))
    try:
        allowed, refused = [], []
        for m in msgs:  # every send of `other` rides in a request with dave.mixed's batches
            allowed += kp_send(producer, mine, [m])
            refused.append(producer.send(other, value=m.value, partition=m.partition))
        producer.flush(timeout=30)
        for future in allowed:
            future.get(timeout=1)
        for future in refused:
            with pytest.raises(TopicAuthorizationFailedError):
                future.get(timeout=1)
    finally:
        producer.close(timeout=5)


def fetch_mixed(
    setup: SaslSetup, conf: dict[str, object], mine: str, other: str, count: int
) -> tuple[list[tuple[str | None, bytes | None]], set[tuple[str | None, int]]]:
    """A confluent-kafka consumer (`conf`: dave's login) assigned both topics' partitions
    fetches them in one FetchRequest; returns what it read (at least `count` records) and the
    errors it reported (at least one)."""
    consumer = ck.Consumer(
        {**ck_config(setup.bootstrap), **conf, "group.id": f"g-{mine}", "fetch.wait.max.ms": 50}
    )
    try:
        # Offset 0, not OFFSET_BEGINNING: librdkafka would look the beginning up with a
        # ListOffsets per topic first, and never fetch a topic whose lookup failed.
        consumer.assign([ck.TopicPartition(t, p, 0) for t in (mine, other) for p in (0, 1)])
        read: list[tuple[str | None, bytes | None]] = []
        errors: set[tuple[str | None, int]] = set()
        deadline = time.monotonic() + 20
        while len(read) < count or not errors:
            assert time.monotonic() < deadline, (len(read), errors)
            message = consumer.poll(0.2)
            if message is None:
                continue
            if (error := message.error()) is not None:
                errors.add((message.topic(), error.code()))
            else:
                read.append((message.topic(), message.value()))
    finally:
        consumer.close()
    return read, errors


def test_mixed_requests_serve_the_allowed_part(terminating: SaslSetup) -> None:
    """Requests naming a topic dave may use and one he may not, as Apache Kafka answers them:
    the refused topic's partitions get TOPIC_AUTHORIZATION_FAILED and the allowed ones are
    served in the same request. kafka-python puts every partition bound for a broker in one
    ProduceRequest (librdkafka sends one per partition, so confluent-kafka never mixes topics
    in a ProduceRequest); a confluent-kafka consumer assigned both topics fetches them in one
    FetchRequest. dave's records are read back once and in order, each refused record's
    delivery fails with TopicAuthorizationFailedError, the consumer reads every allowed record
    and reports the refused topic only; the relay never saw the refused topic from dave-up."""
    setup = terminating
    dave, alice = ck_sasl("PLAIN", "dave"), ck_sasl("PLAIN", "alice")
    mine = fresh_topic(setup.bootstrap, "dave.mixed", PARTITIONS, conf=dave)
    other = fresh_topic(setup.bootstrap, "mixed-other", PARTITIONS, conf=alice)
    ck_produce(setup.bootstrap, other, make_messages(4, PARTITIONS, tag="alice"), conf=alice)
    mark = setup.kipside.log_mark()
    msgs = make_messages(20, PARTITIONS, tag="dave")
    produce_mixed(setup, mine, other, msgs)
    part = "refused in part (the allowed partitions go on) by the principals rule for User:dave"
    assert setup.kipside.wait_for_log(lambda line: "Produce v" in line and part in line, mark)
    got, marks = consume_assigned(setup.bootstrap, mine, PARTITIONS, len(msgs), conf=dave)
    assert_exactly_once_in_order(msgs, got, marks)

    read, errors = fetch_mixed(setup, dave, mine, other, len(msgs))
    assert sorted(read) == sorted((mine, m.value) for m in msgs)
    assert errors == {(other, ck.KafkaError.TOPIC_AUTHORIZATION_FAILED)}
    assert setup.kipside.wait_for_log(lambda line: "Fetch v" in line and part in line, mark)
    carried = [c for c in setup.relay.carried() if c.user == "dave-up"]
    assert not any(other in c.topics for c in carried)


def test_secrets_nowhere(terminating: SaslSetup) -> None:
    """After every test above (passwords right and wrong, files and environment variables):
    no password in kipside's log (debug level), its spans (printed to stdout), /rules,
    /status.json or /metrics."""
    setup = terminating
    stdout = setup.kipside.stdout_path.read_text()
    match = re.search(r"kipside: admin listening on (http://\S+)", stdout)
    assert match, stdout
    pages = {}
    for path in ("/rules", "/status.json", "/metrics", "/"):
        with urllib.request.urlopen(match.group(1) + path, timeout=5) as response:
            pages[path] = response.read().decode()
    json.loads(pages["/status.json"])
    assert "SaslAuthenticate" in stdout  # the spans were printed
    everything = {"log": setup.kipside.log(), "stdout": stdout, **pages}
    leaks = [(where, s) for where, text in everything.items() for s in SECRETS if s in text]
    assert leaks == []
