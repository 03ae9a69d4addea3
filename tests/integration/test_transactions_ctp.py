"""Transactions end to end: 50 consume-transform-produce transactions by each of the three
client libraries (confluent-kafka, kafka-python, aiokafka) -> kipside -> MarkerWindowRelay ->
Tansu (txn_kit.py says what the stack simulates), and once more by confluent-kafka with a
coordinator that answers DescribeTransactions, as Apache Kafka 3.0+ does.

kipside pre-registers each transaction's declared outputs and consumer group on the client's
first AddPartitionsToTxn/AddOffsetsToTxn and holds it through the simulated marker window:
the relay sees one accepted registration of each kind per transaction, both in one round trip,
the client never sees CONCURRENT_TRANSACTIONS, and the output log, read by hand (txn_log.py),
holds exactly what the committed attempts wrote.

Run: .venv/bin/pytest tests/integration/test_transactions_ctp.py -q -p no:cacheprovider -x
"""

from __future__ import annotations

import confluent_kafka as ck
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient
from conftest import DirectProbe, unique_name
from txn_relay import (
    ACCEPTED,
    ADD_OFFSETS,
    ADD_PARTITIONS,
    END_TXN,
    MarkerWindowRelay,
    TxnCounts,
    TxnEvent,
    TxnSegment,
)

from . import txn_kit as kit
from .clients import Msg, assert_exactly_once_in_order
from .clients_confluent import ck_config
from .clients_read_back import consume_assigned
from .txn_ctp import (
    INPUT_RECORDS,
    TRANSACTIONS,
    CtpRun,
    ctp_topics,
    plan,
    run_ctp_aiokafka,
    run_ctp_confluent,
    run_ctp_kafka_python,
)
from .txn_log import read_log, resolve

pytestmark = pytest.mark.integration


make_stack = kit.make_stack

RTT = 0.020
"""The relay's round trip in these runs (10 ms each way). A call sent after another's answer
came back reaches the relay at least this long after it; calls sent in one round reach it
together, give or take the relay's thread getting the GIL: the client runs in this process,
so a few transactions may show a gap (bench/txn.py, whose relay has a process of its own,
measures every one)."""
RUNS = {
    "confluent-kafka": run_ctp_confluent,
    "kafka-python": run_ctp_kafka_python,
    "aiokafka": run_ctp_aiokafka,
}


def _has_events(segment: TxnSegment) -> bool:
    return bool(
        segment.accepted_add_partitions
        or segment.rejected_add_partitions
        or segment.refused_add_partitions
        or segment.accepted_add_offsets
        or segment.rejected_add_offsets
    )


def _assert_one_registration_per_transaction(relay: MarkerWindowRelay, run: CtpRun) -> int:
    """What kipside sent upstream, per transaction, seen by the relay: exactly one accepted
    AddPartitionsToTxn and AddOffsetsToTxn each, and the window hit. Returns how many
    transactions the window held."""
    assert not relay.problems(), relay.problems()
    segments = relay.segments(run.txn_id)
    ended = [s for s in segments if s.end is not None]
    assert len(ended) == TRANSACTIONS, f"{len(ended)} EndTxn answered, {len(segments)} segments"
    assert [s.end.committed for s in ended if s.end] == [a.committed for a in run.attempts]
    assert all(not _has_events(s) for s in segments if s.end is None), segments[-1]
    over = [
        (i, s)
        for i, s in enumerate(ended)
        if s.accepted_add_partitions != 1 or s.accepted_add_offsets != 1
    ]
    assert not over, f"transactions without exactly 1+1 accepted upstream adds: {over[:5]}"
    serial = _serial_registrations(relay.events(run.txn_id))
    assert len(serial) <= TRANSACTIONS // 20, (
        f"transactions whose registration calls did not reach the relay together: {serial[:5]}: "
        + "; ".join(_show(relay.events(run.txn_id), i) for i in serial[:3])
    )
    rejected = sum(s.rejected_add_partitions + s.rejected_add_offsets for s in ended)
    held_txns = sum(1 for s in ended if s.rejected_add_partitions or s.rejected_add_offsets)
    described = sum(s.described for s in ended)
    if relay.describe_transactions:
        # Asking replaces refusals: more questions than refusals, and never a long run of them.
        assert described > rejected, (described, rejected)
        most = max(s.rejected_add_partitions + s.rejected_add_offsets for s in ended)
        assert most <= 4, most
    else:
        assert described == 0
    return held_txns


def _show(events: list[TxnEvent], n: int) -> str:
    """Transaction n's events, in ms after its first."""
    txns: list[list[TxnEvent]] = [[]]
    for event in events:
        txns[-1].append(event)
        if event.kind == END_TXN and event.error_code == 0:
            txns.append([])
    t = txns[n]
    return f"#{n}: " + ", ".join(f"{(e.at - t[0].at) * 1000:.1f} {e.kind} {e.outcome}" for e in t)


def _serial_registrations(events: list[TxnEvent]) -> list[int]:
    """The transactions whose registration did not go as one round: no AddPartitionsToTxn
    or no AddOffsetsToTxn reached the relay within a round trip of the first accepted add
    (the window may end between two calls of one round: the refused one then goes again, as
    any refused call does)."""
    serial, txn, number = [], list[TxnEvent](), 0
    for event in events:
        if event.kind != END_TXN or event.error_code != 0:
            txn.append(event)
            continue
        adds = [e for e in txn if e.kind in (ADD_PARTITIONS, ADD_OFFSETS)]
        first = next((e.at for e in adds if e.outcome == ACCEPTED), None)
        if first is not None and len({e.kind for e in adds if abs(e.at - first) < RTT}) < 2:
            serial.append(number)
        txn, number = [], number + 1
    return serial


def _assert_counters_agree(stack: kit.TxnStack, counts: TxnCounts) -> float:
    """kipside's own counters agree with the relay's; returns the client's AddPartitionsToTxn."""
    upstream_adds = stack.api_metric("kipside_upstream_requests_total", "AddPartitionsToTxn")
    client_adds = stack.api_metric("kipside_client_requests_total", "AddPartitionsToTxn")
    assert upstream_adds == counts.accepted_add_partitions + counts.rejected_add_partitions
    assert client_adds >= TRANSACTIONS
    return client_adds


def _assert_output_log(stack: kit.TxnStack, run: CtpRun) -> None:
    """The output log, resolved by hand: the committed attempts behind commit markers, the
    aborted ones behind abort markers, nothing undecided."""
    for partition in range(kit.OUT_PARTITIONS):
        log = resolve(read_log(stack.bootstrap, run.output_topic, partition))
        want = [a.output(partition).value for a in run.attempts if a.committed]
        want_aborted = [a.output(partition).value for a in run.attempts if not a.committed]
        assert log.committed == want, f"partition {partition}: committed records differ"
        assert log.aborted == want_aborted, f"partition {partition}: aborted records differ"
        assert not log.still_open, f"partition {partition}: {len(log.still_open)} undecided"
        assert (log.commit_markers, log.abort_markers) == (
            INPUT_RECORDS,
            TRANSACTIONS - INPUT_RECORDS,
        )


def _assert_read_committed_view(
    who: str, view: list[Msg], run: CtpRun, direct_probe: DirectProbe
) -> int:
    """A read_committed consumer's view: every committed record once, in order; the only
    other records allowed are aborted ones, and only where the broker itself shows them."""
    committed = run.expected_outputs(True)
    aborted_values = {m.value for m in run.expected_outputs(False)}
    committed_values = {m.value for m in committed}
    strangers = [m for m in view if m.value not in committed_values | aborted_values]
    assert not strangers, f"{who} read records nobody produced: {strangers[:3]}"
    assert_exactly_once_in_order(committed, [m for m in view if m.value in committed_values])
    shown_aborted = [m for m in view if m.value in aborted_values]
    if shown_aborted:
        ok, detail = direct_probe("read-committed-filters-aborted")
        assert not ok, (
            f"{who} read_committed returned {len(shown_aborted)} aborted records, but the broker "
            f"filters them without kipside ({detail})"
        )
    return len(shown_aborted)


def _assert_read_committed_consumers(
    stack: kit.TxnStack, run: CtpRun, direct_probe: DirectProbe
) -> int:
    """confluent-kafka's read_committed view (and kafka-python's, when it ran the loop);
    returns how many aborted records confluent-kafka's returned (a broker limitation)."""
    expect = INPUT_RECORDS * kit.OUT_PARTITIONS
    read = (stack.bootstrap, run.output_topic, kit.OUT_PARTITIONS, expect, "read_committed", 60)
    view, _ = consume_assigned(*read)
    shown_aborted = _assert_read_committed_view("confluent-kafka", view, run, direct_probe)
    if run.client == "kafka-python":
        view, _ = consume_assigned(*read, client="kafka-python")
        _assert_read_committed_view("kafka-python", view, run, direct_probe)
    return shown_aborted


def _assert_group_offset(stack: kit.TxnStack, run: CtpRun) -> None:
    """The group's offsets, as an admin client reads them: every input consumed."""
    admin = AdminClient(ck_config(stack.bootstrap))
    request_offsets = ConsumerGroupTopicPartitions(
        run.group, [ck.TopicPartition(run.input_topic, 0)]
    )
    (future,) = admin.list_consumer_group_offsets([request_offsets], request_timeout=10).values()
    (tp,) = future.result(timeout=15).topic_partitions
    assert (tp.error, tp.offset) == (None, INPUT_RECORDS)


def _run_ctp(
    client: str, describes: bool, make_stack: kit.StackFactory, request: pytest.FixtureRequest
) -> tuple[kit.TxnStack, CtpRun]:
    """The plan's transactions by `client`, through a stack whose rule pre-registers the run's
    output and group (`describes`: its coordinator answers DescribeTransactions)."""
    prefix = "ctp-" + client.replace("-", "")
    run = CtpRun(
        client=client,
        txn_id=unique_name(prefix),
        input_topic=unique_name("in", request),
        output_topic=unique_name("out", request),
        group=unique_name("g", request),
    )
    stack = make_stack(
        kit.rules_yaml(f"{prefix}-*", [kit.Output(run.output_topic)], run.group, kit.HOLD_MAX_MS),
        describe_transactions=describes,
    )
    ctp_topics(stack, run)
    stack.relay.delay_ms = RTT * 1000 / 2
    RUNS[client](stack, run)
    stack.relay.delay_ms = 0.0  # reading the results back needs no simulated network
    return stack, run


def _summary(
    run: CtpRun, counts: TxnCounts, held_txns: int, client_adds: float, shown_aborted: int
) -> str:
    """The run in one line: upstream registrations per transaction, the window's rejections,
    what the client sent and saw, and the aborted records a read_committed consumer returned."""
    return (
        f"\n[{run.client}] {len(run.attempts)} transactions in {run.seconds:.1f} s; upstream per "
        f"transaction: AddPartitionsToTxn {counts.accepted_add_partitions / TRANSACTIONS:.2f}, "
        f"AddOffsetsToTxn {counts.accepted_add_offsets / TRANSACTIONS:.2f} accepted; "
        f"in-window rejections: {counts.rejected_add_partitions} AddPartitionsToTxn + "
        f"{counts.rejected_add_offsets} AddOffsetsToTxn over {held_txns} held transactions; "
        f"DescribeTransactions {counts.described}; "
        f"client AddPartitionsToTxn {client_adds:.0f}; client-seen CONCURRENT_TRANSACTIONS "
        f"{len(run.client_concurrent)} ({run.client_detail}); "
        f"offset checks {len(run.committed_offsets_seen)}; aborted records a read_committed "
        f"consumer returned (broker limitation): {shown_aborted}"
    )


@pytest.mark.parametrize(
    ("client", "describes"),
    [(client, False) for client in RUNS] + [("confluent-kafka", True)],
    ids=[*RUNS, "confluent-kafka-describes"],
)
def test_consume_transform_produce(
    client: str,
    describes: bool,
    make_stack: kit.StackFactory,
    request: pytest.FixtureRequest,
    direct_probe: DirectProbe,
) -> None:
    """50 consume-transform-produce transactions (every 5th aborted, the input then
    reprocessed), each writing all 8 output partitions and the input offset (half of them
    sending the offsets first), through kipside with a 50 ms simulated marker window after
    every EndTxn.

    Asserts: the output log holds exactly the committed attempts' records (once, in order)
    behind commit markers and the aborted ones behind abort markers; read_committed consumers
    see every committed record exactly once; the group's committed offset follows the commits
    only (checked after every abort and at the end); the client never saw
    CONCURRENT_TRANSACTIONS although the relay answered it to kipside in most transactions;
    kipside sent exactly one accepted AddPartitionsToTxn and one AddOffsetsToTxn upstream per
    transaction, both calls together, after waiting for the window in most transactions;
    where the coordinator answers DescribeTransactions, kipside asked more often than it was
    refused, and no transaction met more than 4 refusals."""
    stack, run = _run_ctp(client, describes, make_stack, request)
    stack.kipside.assert_alive()
    assert not kit.assert_no_kipside_errors(stack.kipside)

    # -- the plan ran: every transaction, every 5th aborted and its input consumed again
    assert len(run.attempts) == TRANSACTIONS
    assert [a.committed for a in run.attempts] == [plan(i) for i in range(TRANSACTIONS)]
    held_txns = _assert_one_registration_per_transaction(stack.relay, run)
    # -- what the client saw: no CONCURRENT_TRANSACTIONS at all
    assert not run.client_concurrent, (
        f"{client} saw CONCURRENT_TRANSACTIONS {len(run.client_concurrent)} times, e.g. "
        f"{run.client_concurrent[:2]}"
    )
    counts = stack.relay.counts()
    client_adds = _assert_counters_agree(stack, counts)
    # The window was met: transactions came back to back, so kipside waited for (or met) it.
    holds = stack.metrics().value("kipside_holds_total", 0.0)
    assert holds >= TRANSACTIONS / 2, f"{holds:.0f} holds in {TRANSACTIONS} transactions"
    _assert_output_log(stack, run)
    shown_aborted = _assert_read_committed_consumers(stack, run, direct_probe)
    _assert_group_offset(stack, run)

    print(_summary(run, counts, held_txns, client_adds, shown_aborted))
