"""Network loss between kipside and the broker: cut (resets, refused connections) and blackhole
(silence), then restored, during produce, transactions and consumer-group rebalances.

Each test runs real clients through kipside -> FaultRelay -> Tansu (tests/integration/
fault_kit.py), fails the path mid-traffic, restores it, and then reads the topic from the broker
itself: every acknowledged message in the log exactly once, in order per producer and
partition; committed offsets where the clients left them.

Run: .venv/bin/pytest tests/integration/test_faults_network.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from conftest import create_topics, skip_unless_shared_lanes, unique_name

from .fault_kit import (
    RUN_TIMEOUT,
    GroupMember,
    SequencedProducer,
    TransactionalLoop,
    acked_of,
    audit,
    committed_offsets,
    fault_stack,
    fill,
    group_offset,
    run_producers,
    transaction_rules,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
PRODUCERS = 3
RATE = 150.0  # messages a second, per producer


@pytest.fixture(autouse=True)
def _needs_lanes() -> None:
    skip_unless_shared_lanes("the shared lanes' fault handling")


ANSWER_TIMEOUT = 1.0  # kipside's --upstream-request-timeout
CLIENT_REQUEST_TIMEOUT_MS = 3000  # the ProduceRequests' timeout_ms: the lanes wait this long


def test_cut_then_blackhole_during_produce(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Idempotent confluent-kafka producers on shared lanes. First the path to the broker is
    reset and refused for 1 s: kipside fails the lanes, closes the clients that had batches on
    them, and redials. Then a silent partition: the lanes stay connected and hear nothing for
    2 s, until their answer timeout (the ProduceRequests' own timeout_ms, 3 s, being longer
    than --upstream-request-timeout 1) closes them with the clients that had a batch on them.
    Each time the clients resend once the path is back: nothing acknowledged is lost, nothing
    duplicated, nothing reordered."""
    args = ["--upstream-request-timeout", str(ANSWER_TIMEOUT)]
    with fault_stack(tmp_path, extra_args=args) as stack:
        topic = unique_name("cut", request)
        create_topics(stack.bootstrap, [topic], PARTITIONS)
        producers = [
            SequencedProducer(
                f"ck{i}",
                stack.bootstrap,
                topic,
                PARTITIONS,
                RATE,
                **{"request.timeout.ms": CLIENT_REQUEST_TIMEOUT_MS},
            )
            for i in range(PRODUCERS)
        ]
        for p in producers:
            p.start()
        time.sleep(1.0)
        reset = stack.relay.cut()
        time.sleep(1.0)
        stack.relay.restore()
        time.sleep(1.0)
        failures_after_cut = stack.metrics().value("kipside_lane_failures_total")
        mark = stack.kipside.log_mark()
        stack.relay.blackhole()
        time.sleep(2.0)
        stack.relay.restore()
        time.sleep(1.5)
        run_producers(producers)
        stack.kipside.assert_alive()
        failures = stack.metrics().value("kipside_lane_failures_total")
        log = stack.kipside.log_since(mark)
        result = audit(stack.direct, topic, PARTITIONS, acked_of(producers))
    swallowed = stack.relay.swallowed()
    print(
        f"\ncut {reset} connections for 1 s, then a blackhole for 2 s (swallowed {swallowed}): "
        f"{result.line()}; lane failures {failures_after_cut:.0f} after the cut, "
        f"{failures - failures_after_cut:.0f} in the blackhole"
    )
    for p in producers:
        assert not p.delivered.failed, f"{p.name}: {p.delivered.failed[:3]}"
        assert p.unflushed == 0
    result.assert_clean()
    assert reset >= 1 and failures_after_cut >= 1
    assert swallowed.requests >= 1
    assert failures > failures_after_cut
    assert "within 3 s (the upstream answer timeout)" in log, log[-3000:]


def test_cut_and_restore_during_transactions(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two confluent-kafka transactional producers, each transaction writing 10 messages and
    committing a consumer group's offset, with kipside pre-registering their outputs and
    group (a transactions rule); the path to the broker is reset and refused for 1 s. A
    transaction the fault broke is aborted and done again by the application: the committed
    log holds every committed transaction's messages exactly once, in order, nothing of an
    aborted one, and the group's committed offset is each producer's number of commits."""
    topic, source = unique_name("txn-cut", request), unique_name("txn-in", request)
    groups = [unique_name(f"g{i}", request) for i in range(2)]
    rules = transaction_rules(*((f"tx{i}-*", topic, groups[i]) for i in range(2)))
    with fault_stack(tmp_path, rules) as stack:
        create_topics(stack.bootstrap, [topic], PARTITIONS)
        create_topics(stack.bootstrap, [source], 1)
        loops = [
            TransactionalLoop(
                f"tx{i}-{request.node.name[:20]}",
                stack.bootstrap,
                topic,
                PARTITIONS,
                source,
                groups[i],
            )
            for i in range(2)
        ]
        for loop in loops:
            loop.start()
        time.sleep(1.5)
        reset = stack.relay.cut()
        time.sleep(1.0)
        stack.relay.restore()
        time.sleep(2.0)
        for loop in loops:
            loop.stop()
        for loop in loops:
            loop.join(RUN_TIMEOUT)
            assert not loop.is_alive(), f"{loop.name} did not finish in {RUN_TIMEOUT} s"
            assert loop.error is None, f"{loop.name}: {loop.error!r}"
        stack.kipside.assert_alive()
        result = audit(stack.direct, topic, PARTITIONS, [v for x in loops for v in x.committed])
        offsets = [group_offset(stack.direct, groups[i], source) for i in range(2)]
    print(
        f"\ncut {reset} connections for 1 s: {result.line()}; transactions "
        f"{[x.transactions for x in loops]}, aborted {[x.aborted for x in loops]}, "
        f"errors {[dict(x.errors) for x in loops]}, aborted records in log {result.aborted_in_log}"
    )
    result.assert_clean()
    assert offsets == [x.transactions for x in loops]


GROUP_MESSAGES = 400


@pytest.mark.slow
def test_cut_during_a_consumer_group_rebalance(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One confluent-kafka group member is consuming (at least once: commit what it processed
    after every poll and on revoke); a second joins, and while the group rebalances the path
    to the broker is reset and refused for 1 s. Afterwards every record was processed (some
    twice at most: the ones whose commit the fault lost), each member read its partitions in
    order, and the group's committed offsets are the partitions' ends."""
    with fault_stack(tmp_path) as stack:
        topic, group = unique_name("grp", request), unique_name("g", request)
        create_topics(stack.bootstrap, [topic], PARTITIONS)
        ends = fill(stack.bootstrap, topic, PARTITIONS, GROUP_MESSAGES)
        first = GroupMember("m1", stack.bootstrap, topic, group)
        first.start()
        wait_until(lambda: len(first.processed) >= GROUP_MESSAGES // 5, 30, "m1 consuming")
        joins = stack.metrics().value("kipside_client_requests_total", api="JoinGroup")
        second = GroupMember("m2", stack.bootstrap, topic, group)
        second.start()
        # The second member's JoinGroup starts the rebalance: cut while it is under way.
        wait_until(
            lambda: stack.metrics().value("kipside_client_requests_total", api="JoinGroup") > joins,
            30,
            "the second member's JoinGroup",
        )
        assert first.assignments == 1 and second.assignments == 0, "the rebalance was over"
        reset = stack.relay.cut()
        time.sleep(1.0)
        stack.relay.restore()
        members = [first, second]

        def done() -> bool:
            seen = {(p, o) for m in members for p, o in m.processed}
            return len(seen) >= GROUP_MESSAGES

        wait_until(done, RUN_TIMEOUT, "every record processed")
        for m in members:
            m.stop()
        for m in members:
            m.join(RUN_TIMEOUT)
            assert not m.is_alive() and m.error is None, f"{m.name}: {m.error!r}"
        offsets = committed_offsets(stack.direct, group, topic, PARTITIONS)
    processed = [po for m in members for po in m.processed]
    unique = set(processed)
    twice = len(processed) - len(unique)
    print(
        f"\ncut {reset} connections for 1 s during a rebalance: records {GROUP_MESSAGES}, "
        f"processed {len(unique)}, reprocessed {twice}; committed {offsets} (ends {ends}); "
        f"assignments {[m.assignments for m in members]}, commit failures "
        f"{[dict(m.commit_failures) for m in members]}"
    )
    assert unique == {(p, o) for p, end in ends.items() for o in range(end)}
    assert offsets == ends
    for m in members:  # each member's reads of a partition only go forward between rebalances
        for p in range(PARTITIONS):
            mine = [o for q, o in m.processed if q == p]
            back = [(a, b) for a, b in itertools.pairwise(mine) if b <= a]
            assert len(back) <= m.assignments, f"{m.name} [{p}] went back {back[:5]}"
