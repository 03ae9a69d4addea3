"""Real transactional clients through kipside to the real broker (Tansu): commit, abort, an
open transaction invisible to read_committed (last stable offset), and the exactly-once
consume-transform-produce loop.

Known broker (Tansu 0.6.0) limitations, seen without kipside (tests/integration/test_tansu_bugs.py):
aiokafka's transactions fail on InitProducerId v0, so transactions are tested with
confluent-kafka and kafka-python; Fetch responses carry no AbortedTransactions, so
test_read_committed_hides_aborted is a strict xfail (tansu_bugs.py).
"""

from __future__ import annotations

import time

import confluent_kafka as ck
import pytest
from conftest import NewTopicFactory, Target, fresh_topic, unique_name

from .clients import Msg, assert_exactly_once_in_order, call_with_deadline, make_messages
from .clients_confluent import ck_config, ck_consumer, ck_produce, group_committed
from .clients_kafka_python import kp_producer, kp_send
from .clients_read_back import consume_assigned
from .raw_batches import raw_fetch_batches
from .tansu_bugs import NO_ABORTED_TRANSACTIONS

pytestmark = pytest.mark.integration

PARTITIONS = 3

# --------------------------------------------------------------------------- transactions

TXN_CLIENTS = ["confluent-kafka", "kafka-python"]  # aiokafka: see the module docstring


class TxnRun:
    """One transactional producer's history: commit, abort, then a third transaction that is
    observed while still open (last stable offset) and then committed."""

    def __init__(self, client: str, topic: str) -> None:
        self.client, self.topic = client, topic
        self.committed1 = make_messages(60, PARTITIONS, tag="commit1")
        self.aborted = make_messages(60, PARTITIONS, tag="abort")
        self.committed2 = make_messages(60, PARTITIONS, tag="commit2")
        self.view_while_open: list[Msg] = []  # read_committed, third transaction still open
        self.uncommitted_while_open: list[Msg] = []


def _run_confluent_txn(bootstrap: str, run: TxnRun) -> None:
    p = ck.Producer(
        ck_config(
            bootstrap,
            **{
                "transactional.id": unique_name("tx"),
                "transaction.timeout.ms": 10000,
                "linger.ms": 5,
                "message.timeout.ms": 9000,
            },
        )
    )
    p.init_transactions(15)
    for batch, commit in ((run.committed1, True), (run.aborted, False)):
        p.begin_transaction()
        ck_produce(bootstrap, run.topic, batch, producer=p)
        (p.commit_transaction if commit else p.abort_transaction)(15)
    p.begin_transaction()
    ck_produce(bootstrap, run.topic, run.committed2, producer=p)
    _observe_open_transaction(bootstrap, run)
    p.commit_transaction(15)


def _run_kafka_python_txn(bootstrap: str, run: TxnRun) -> None:
    producer = kp_producer(
        bootstrap, transactional_id=unique_name("tx"), transaction_timeout_ms=10000
    )
    try:
        call_with_deadline(producer.init_transactions, 15, "init_transactions")
        for batch, end in (
            (run.committed1, "commit_transaction"),
            (run.aborted, "abort_transaction"),
            (run.committed2, "commit_transaction"),
        ):
            producer.begin_transaction()
            futures = kp_send(producer, run.topic, batch)
            producer.flush(timeout=15)
            for f in futures:
                f.get(timeout=1)
            if batch is run.committed2:
                _observe_open_transaction(bootstrap, run)
            call_with_deadline(getattr(producer, end), 15, end)
    finally:
        producer.close(timeout=5)


def _observe_open_transaction(bootstrap: str, run: TxnRun) -> None:
    before = len(run.committed1) + len(run.aborted)
    run.view_while_open, _ = consume_assigned(bootstrap, run.topic, PARTITIONS, 0, "read_committed")
    run.uncommitted_while_open, _ = consume_assigned(
        bootstrap, run.topic, PARTITIONS, before + len(run.committed2)
    )


@pytest.fixture(scope="module", params=TXN_CLIENTS)
def txn_run(request: pytest.FixtureRequest, target: Target) -> TxnRun:
    """The transactional history, run once per client and shared by the tests below."""
    if target.kipside is not None:
        target.kipside.assert_alive()
    topic = fresh_topic(target.bootstrap, f"txn-{request.param}", PARTITIONS)
    run = TxnRun(request.param, topic)
    if request.param == "confluent-kafka":
        _run_confluent_txn(target.bootstrap, run)
    else:
        _run_kafka_python_txn(target.bootstrap, run)
    return run


def _read_committed(bootstrap: str, run: TxnRun, expect: int) -> list[tuple[str, list[Msg]]]:
    """read_committed views by confluent-kafka and, for kafka-python runs, by kafka-python."""
    args = (bootstrap, run.topic, PARTITIONS, expect, "read_committed")
    views = [("confluent-kafka", consume_assigned(*args)[0])]
    if run.client == "kafka-python":
        views.append(("kafka-python", consume_assigned(*args, client="kafka-python")[0]))
    return views


def test_transactions_commit_abort(txn_run: TxnRun, bootstrap: str) -> None:
    """Commit, abort, commit all succeed; every data record was written once with its commit
    or abort marker; an open transaction stays invisible to read_committed (last stable offset);
    read_committed consumers get every committed message, in order."""
    run = txn_run
    # While the third transaction was open: read_committed stopped before it...
    assert not [m for m in run.view_while_open if m.value.startswith(b"commit2")], (
        "read_committed consumer saw records of a transaction that was still open"
    )
    before_open = [m for m in run.view_while_open if not m.value.startswith(b"abort")]
    assert_exactly_once_in_order(run.committed1, before_open)
    # ... while read_uncommitted saw it.
    assert_exactly_once_in_order(
        run.committed1 + run.aborted + run.committed2, run.uncommitted_while_open
    )

    everything = run.committed1 + run.aborted + run.committed2
    got, marks = consume_assigned(bootstrap, run.topic, PARTITIONS, len(everything))
    assert_exactly_once_in_order(everything, got)
    # Each of the 3 transactions touched every partition: one control record (commit or abort
    # marker) per partition per transaction, after the data records.
    data = {p: sum(1 for m in everything if m.partition == p) for p in range(PARTITIONS)}
    assert {p: hi - lo for p, (lo, hi) in marks.items()} == {p: n + 3 for p, n in data.items()}
    for p in range(PARTITIONS):
        batches = raw_fetch_batches(bootstrap, run.topic, p)
        controls = [b for b in batches if b.control]
        assert len(controls) == 3 and all(b.transactional for b in controls), batches
        assert all(b.transactional and b.producer_id >= 0 for b in batches), batches
        assert len({(b.producer_id, b.producer_epoch) for b in batches}) == 1, batches
        assert sum(b.records for b in batches if not b.control) == data[p]

    committed = run.committed1 + run.committed2
    for _who, view in _read_committed(bootstrap, run, len(committed)):
        visible = [m for m in view if not m.value.startswith(b"abort")]
        assert_exactly_once_in_order(committed, visible)  # whether or not aborted ones show


@NO_ABORTED_TRANSACTIONS
def test_read_committed_hides_aborted(txn_run: TxnRun, bootstrap: str) -> None:
    """read_committed consumers see exactly the committed messages: nothing aborted."""
    run = txn_run
    committed = run.committed1 + run.committed2
    for who, view in _read_committed(bootstrap, run, len(committed)):
        aborted = [m for m in view if m.value.startswith(b"abort")]
        assert not aborted, f"{who} read_committed returned {len(aborted)} aborted records"
        assert_exactly_once_in_order(committed, view)
    assert not [m for m in run.view_while_open if m.value.startswith(b"abort")]
    assert_exactly_once_in_order(run.committed1, run.view_while_open)


def test_confluent_consume_transform_produce(bootstrap: str, new_topic: NewTopicFactory) -> None:
    """The exactly-once loop: a group consumer reads, a transactional producer writes the
    transformed records and commits the consumer's offsets inside each transaction
    (AddOffsetsToTxn + TxnOffsetCommit). Output: every input once, in order; the group's
    committed offsets: the input's end."""
    parts = 2
    source, sink = new_topic(parts, prefix="src"), new_topic(parts, prefix="dst")
    group = unique_name("g")
    inputs = make_messages(200, parts, tag="in", headers=False)
    ck_produce(bootstrap, source, inputs)
    consumer = ck_consumer(bootstrap, group, **{"isolation.level": "read_committed"})
    producer = ck.Producer(
        ck_config(
            bootstrap,
            **{"transactional.id": unique_name("tx"), "transaction.timeout.ms": 10000},
        )
    )
    try:
        producer.init_transactions(15)
        consumer.subscribe([source])
        done = 0
        deadline = time.monotonic() + 40
        while done < len(inputs):
            assert time.monotonic() < deadline, f"transformed {done}/{len(inputs)}"
            batch = consumer.consume(num_messages=50, timeout=0.2)
            if not batch:
                continue
            producer.begin_transaction()
            for m in batch:
                assert not m.error(), m.error()
                value = m.value() or b""
                producer.produce(sink, value.upper(), key=m.key(), partition=m.partition() or 0)
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()),
                consumer.consumer_group_metadata(),
                15,
            )
            producer.commit_transaction(15)
            done += len(batch)
    finally:
        call_with_deadline(consumer.close, 15, "consumer close")
    want = [Msg(m.partition, m.key, m.value.upper()) for m in inputs]
    got, _ = consume_assigned(bootstrap, sink, parts, len(want), "read_committed")
    assert_exactly_once_in_order(want, got)
    assert group_committed(bootstrap, group, source) == {p: 100 for p in range(parts)}
