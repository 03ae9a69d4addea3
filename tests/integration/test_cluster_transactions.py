"""Several brokers and leader moves, transactions: real transactional producers ->
kipside -> a SIMULATED 3-node cluster (relaykit.cluster: ONE Tansu behind three relay ports;
transaction requests sent to a node that does not coordinate the transactional id get
NOT_COORDINATOR, produce to a node that does not lead the partition NOT_LEADER_OR_FOLLOWER).

- test_transactions_across_nodes_through_moves[client-mode]: four transactions over a
  6-partition topic (two partitions per node): commit, abort, then a commit during which
  every partition leader and the transaction coordinator move halfway, and an abort with
  such a move before its first write and another halfway. With
  confluent-kafka and kafka-python (aiokafka's transactions fail on Tansu 0.6.0
  without kipside too), as plain transactional ids and, for confluent-kafka, as an id a
  `transactions` rule matches (kipside pre-registers the topic's partitions at the
  coordinator of the moment). The log read back from Tansu itself holds each partition's
  records of the committed transactions behind commit markers and of the aborted ones behind
  abort markers, once each and in order (Tansu's read_committed returns aborted records, so
  the log is resolved by hand with txn_log.py); old leaders refused some batches
  and old coordinators some transaction requests, so the producer found the new ones through
  kipside.

Run: .venv/bin/pytest tests/integration/test_cluster_transactions.py -q -p no:cacheprovider
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import confluent_kafka as ck
import pytest
from conftest import DIRECT, ONE_TO_ONE, create_topics, fresh_topic, unique_name
from relaykit.cluster import SimulatedCluster
from relaykit.kafka_answers import NOT_COORDINATOR, NOT_LEADER, TRANSACTION

from kipside.protocol import ApiKey

from .clients import Msg, call_with_deadline, make_messages
from .clients_confluent import ck_config, ck_produce
from .clients_kafka_python import kp_producer, kp_send
from .cluster_kit import PARTITIONS, ClusterStack, cluster_stack, move_next, refusals
from .txn_log import read_log, resolve

pytestmark = pytest.mark.integration

END_TIMEOUT = 15.0
# (client, whether a `transactions` rule matches its transactional id)
MODES = [
    pytest.param("confluent-kafka", False, id="confluent-kafka"),
    pytest.param("kafka-python", False, id="kafka-python"),
    pytest.param("confluent-kafka", True, id="confluent-kafka-preregistered"),
]


@dataclass
class TxnStack:
    stack: ClusterStack
    registered_topic: str  # the output the rule declares, created by the test that uses it


@pytest.fixture(scope="module")
def txn_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxnStack]:
    if DIRECT:
        pytest.skip("KIPSIDE_TEST_DIRECT=1: these tests are about kipside in front of a cluster")
    topic = unique_name("ptx-out")
    rules = f'transactions:\n  - transactional_id: "ptx-*"\n    outputs:\n      - topic: {topic}\n'
    with cluster_stack(tmp_path_factory.mktemp("cluster-txn"), rules) as stack:
        yield TxnStack(stack, topic)


@dataclass
class Transaction:
    commit: bool
    msgs: list[Msg]
    moves: frozenset[str]  # when leaders and the coordinator move: "start" (before the first
    # write: the first AddPartitionsToTxn meets the old coordinator), "half" (after the first
    # half is flushed: later batches meet old leaders, EndTxn the old coordinator)


def _history() -> list[Transaction]:
    return [
        Transaction(True, make_messages(60, PARTITIONS, tag="t1"), frozenset()),
        Transaction(False, make_messages(60, PARTITIONS, tag="t2"), frozenset()),
        Transaction(True, make_messages(60, PARTITIONS, tag="t3"), frozenset({"half"})),
        Transaction(False, make_messages(60, PARTITIONS, tag="t4"), frozenset({"start", "half"})),
    ]


def _mover(cluster: SimulatedCluster, topic: str, txn_id: str) -> Callable[[], None]:
    """Move every partition's leader and the transaction coordinator to their next node."""

    def move() -> None:
        for partition in range(PARTITIONS):
            move_next(cluster, topic, partition)
        live = cluster.nodes()
        now = cluster.coordinator(TRANSACTION, txn_id)
        cluster.move_coordinator(TRANSACTION, txn_id, live[(live.index(now) + 1) % len(live)])

    return move


def _run_confluent(
    bootstrap: str, topic: str, txn_id: str, history: list[Transaction], move: Callable[[], None]
) -> None:
    conf = {"transactional.id": txn_id, "transaction.timeout.ms": 10000, "linger.ms": 5}
    p = ck.Producer(ck_config(bootstrap, **conf, **{"message.timeout.ms": 9000}))
    p.init_transactions(END_TIMEOUT)
    for txn in history:
        p.begin_transaction()
        if "start" in txn.moves:
            move()
        half = len(txn.msgs) // 2
        ck_produce(bootstrap, topic, txn.msgs[:half], producer=p)
        if "half" in txn.moves:
            move()
        ck_produce(bootstrap, topic, txn.msgs[half:], producer=p)  # flushed: even if aborted
        (p.commit_transaction if txn.commit else p.abort_transaction)(END_TIMEOUT)


def _run_kafka_python(
    bootstrap: str, topic: str, txn_id: str, history: list[Transaction], move: Callable[[], None]
) -> None:
    producer = kp_producer(bootstrap, transactional_id=txn_id, transaction_timeout_ms=10000)
    try:
        call_with_deadline(producer.init_transactions, END_TIMEOUT, "init_transactions")
        for txn in history:
            producer.begin_transaction()
            if "start" in txn.moves:
                move()
            half = len(txn.msgs) // 2
            for first, part in ((True, txn.msgs[:half]), (False, txn.msgs[half:])):
                futures = kp_send(producer, topic, part)
                producer.flush(timeout=END_TIMEOUT)
                for f in futures:
                    f.get(timeout=1)
                if first and "half" in txn.moves:
                    move()
            end = "commit_transaction" if txn.commit else "abort_transaction"
            call_with_deadline(getattr(producer, end), END_TIMEOUT, end)
    finally:
        producer.close(timeout=5)


@pytest.mark.parametrize(("client", "registered"), MODES)
def test_transactions_across_nodes_through_moves(
    client: str, registered: bool, txn_stack: TxnStack, request: pytest.FixtureRequest
) -> None:
    stack, cluster = txn_stack.stack, txn_stack.stack.cluster
    if registered:
        topic, txn_id = txn_stack.registered_topic, unique_name("ptx", request)
        create_topics(stack.bootstrap, [topic], PARTITIONS)
    else:
        topic, txn_id = fresh_topic(stack.bootstrap, "txn", PARTITIONS, request), unique_name("tx")
    history = _history()
    before = cluster.records()
    preregistered = stack.metric("kipside_txn_preregistrations_total")
    run = _run_confluent if client == "confluent-kafka" else _run_kafka_python
    run(stack.bootstrap, topic, txn_id, history, _mover(cluster, topic, txn_id))
    after = cluster.records()

    assert cluster.broker is not None
    for p in range(PARTITIONS):
        log = resolve(read_log(cluster.broker.bootstrap, topic, p))
        mine = [[m.value for m in t.msgs if m.partition == p] for t in history]
        assert log.committed == mine[0] + mine[2], f"partition {p}: committed records"
        assert log.aborted == mine[1] + mine[3], f"partition {p}: aborted records"
        assert (log.commit_markers, log.abort_markers, log.still_open) == (2, 2, [])
    # The moves reached the producer: its first add of t4 and its EndTxn of t3 and t4 went to
    # the old coordinator first.
    for api in (ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.END_TXN):
        assert refusals(before, after, api, NOT_COORDINATOR) > 0, api
    assert refusals(before, after, ApiKey.PRODUCE, NOT_LEADER) > 0, "no leader move hit a batch"
    if registered and not ONE_TO_ONE:  # --one-to-one: no shared lanes, no pre-registration
        assert stack.metric("kipside_txn_preregistrations_total") > preregistered
