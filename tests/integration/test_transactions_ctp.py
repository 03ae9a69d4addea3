"""Transactions end to end: 200 consume-transform-produce transactions by real clients ->
kipside -> MarkerWindowRelay -> Tansu (txn_kit.py says what the stack simulates).

kipside pre-registers each transaction's declared outputs and consumer group on the client's
first AddPartitionsToTxn/AddOffsetsToTxn and holds it through the simulated marker window:
the relay sees one accepted registration of each kind per transaction, the client never sees
CONCURRENT_TRANSACTIONS, and the output log, read by hand (txn_log.py), holds exactly what the
committed attempts wrote.

Run: .venv/bin/pytest tests/integration/test_transactions_ctp.py -q -p no:cacheprovider -x
"""

from __future__ import annotations

import confluent_kafka as ck
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient
from conftest import DirectProbe, unique_name
from txn_relay import MarkerWindowRelay, TxnCounts, TxnSegment

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
    run_ctp_confluent,
    run_ctp_kafka_python,
)
from .txn_log import read_log, resolve

pytestmark = pytest.mark.integration


make_stack = kit.make_stack


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
    rejected = sum(s.rejected_add_partitions + s.rejected_add_offsets for s in ended)
    held_txns = sum(1 for s in ended if s.rejected_add_partitions or s.rejected_add_offsets)
    assert rejected > 0 and held_txns > 0, "the simulated marker window was never hit"
    return held_txns


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
    client: str, make_stack: kit.StackFactory, request: pytest.FixtureRequest
) -> tuple[kit.TxnStack, CtpRun]:
    """The plan's 200 transactions by `client`, through a stack whose rule pre-registers the
    run's output and group."""
    prefix = "ctp-" + client.replace("-", "")
    run = CtpRun(
        client=client,
        txn_id=unique_name(prefix),
        input_topic=unique_name("in", request),
        output_topic=unique_name("out", request),
        group=unique_name("g", request),
    )
    stack = make_stack(
        kit.rules_yaml(f"{prefix}-*", [kit.Output(run.output_topic)], run.group, kit.HOLD_MAX_MS)
    )
    ctp_topics(stack, run)
    if client == "confluent-kafka":
        run_ctp_confluent(stack, run)
    else:
        run_ctp_kafka_python(stack, run)
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
        f"client AddPartitionsToTxn {client_adds:.0f}; client-seen CONCURRENT_TRANSACTIONS "
        f"{len(run.client_concurrent)} ({run.client_detail}); "
        f"offset checks {len(run.committed_offsets_seen)}; aborted records a read_committed "
        f"consumer returned (broker limitation): {shown_aborted}"
    )


@pytest.mark.parametrize("client", kit.CLIENTS)
def test_consume_transform_produce(
    client: str,
    make_stack: kit.StackFactory,
    request: pytest.FixtureRequest,
    direct_probe: DirectProbe,
) -> None:
    """200 consume-transform-produce transactions (every 5th aborted, the input then
    reprocessed), each writing all 8 output partitions and the input offset (half of them
    sending the offsets first), through kipside with a 50 ms simulated marker window after
    every EndTxn.

    Asserts: the output log holds exactly the committed attempts' records (once, in order)
    behind commit markers and the aborted ones behind abort markers; read_committed consumers
    see every committed record exactly once; the group's committed offset follows the commits
    only (checked after every abort and at the end); the client never saw
    CONCURRENT_TRANSACTIONS although the relay answered it to kipside in most transactions;
    kipside sent exactly one accepted AddPartitionsToTxn and one AddOffsetsToTxn upstream per
    transaction."""
    stack, run = _run_ctp(client, make_stack, request)
    stack.kipside.assert_alive()
    assert not kit.assert_no_kipside_errors(stack.kipside)

    # -- the plan ran: 200 transactions, 160 commits, every input consumed once committed
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
    _assert_output_log(stack, run)
    shown_aborted = _assert_read_committed_consumers(stack, run, direct_probe)
    _assert_group_offset(stack, run)

    print(_summary(run, counts, held_txns, client_adds, shown_aborted))
