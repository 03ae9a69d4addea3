"""acks=0 producers through kipside's shared lanes to Tansu as it is.

Tansu answers acks=0 ProduceRequests, Apache Kafka does not; here the relay passes those
answers on (coalesce_stack(..., kafka_acks0=False)).

- test_acks0_producers_through_kipside_to_tansu_deliver_and_fail_no_lane: acks=0 producers
  (with acks=1 and idempotent ones on the same lanes) against Tansu as it is: kipside drops
  Tansu's answers to acks=0 requests, no lane fails, every message arrives once.

The stack and the log checks are coalesce_kit's, the producer processes coalesce_producers'.

Run: .venv/bin/pytest tests/integration/test_coalesce_acks0.py -q -p no:cacheprovider
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import create_topics, unique_name

from . import coalesce_kit as kit
from . import coalesce_producers as producers

pytestmark = pytest.mark.integration

ACKS0_MESSAGES = 300


tansu_stack = kit.stack_fixture("tansu_stack", kafka_acks0=False)


def _acks0_specs(targets: list[tuple[str, int]]) -> list[producers.ProducerSpec]:
    common: dict[str, Any] = {
        "conf": {},
        "messages": ACKS0_MESSAGES,
        "pause_every": 8,
        "pause": 0.002,
    }
    rows = [  # name, library, acks, idempotent, compression, rotation of the targets
        ("a0-ck-lz4", "confluent-kafka", 0, False, "lz4", 0),
        ("a0-ck-none", "confluent-kafka", 0, False, "none", 3),
        ("a0-kp-gzip", "kafka-python", 0, False, "gzip", 5),
        ("a0-aio-zstd", "aiokafka", 0, False, "zstd", 6),
        ("a1-ck-snappy", "confluent-kafka", 1, False, "snappy", 1),
        ("idem-ck-zstd", "confluent-kafka", -1, True, "zstd", 2),
    ]
    return [
        producers.ProducerSpec(
            name, lib, acks, idem, codec, targets=producers.rotated(targets, turn), **common
        )
        for name, lib, acks, idem, codec, turn in rows
    ]


def _run_from_idle_upstream(
    stack: kit.Stack, specs: list[producers.ProducerSpec], tmp_path: Path
) -> tuple[list[producers.Outcome], int]:
    """Start the producers, let them all go at once from an idle upstream, wait until they end;
    returns what each saw and the upstream connections the relay had accepted before."""
    fleet = producers.ProducerFleet(specs, stack.kipside.bootstrap, tmp_path)
    try:
        fleet.start()
        kit.wait_for_idle_upstream(stack)
        accepted_before = stack.relay.counts().accepted
        fleet.go.set()
        outcomes = fleet.join(producers.PRODUCE_TIMEOUT + 30)
    finally:
        fleet.kill()
    return outcomes, accepted_before


def test_acks0_producers_through_kipside_to_tansu_deliver_and_fail_no_lane(
    tansu_stack: kit.Stack, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Tansu answers acks=0 ProduceRequests (Apache Kafka does not). kipside drops those
    answers: every acks=0 producer's messages arrive, and no lane is taken down by them, even
    with acks=1 and idempotent producers sharing the lanes (an answer nobody asked for arrives
    while the lane waits for one it did ask for)."""
    stack = tansu_stack
    topics = [unique_name(f"a0{t}", request) for t in range(2)]
    create_topics(stack.kipside.bootstrap, topics, kit.PARTITIONS)
    targets = producers.targets_of(topics, kit.PARTITIONS)
    specs = _acks0_specs(targets)
    mark = stack.kipside.log_mark()
    outcomes, accepted_before = _run_from_idle_upstream(stack, specs, tmp_path)
    stack.kipside.assert_alive()
    counts = stack.relay.counts()  # before the checker's consumer adds its own connection
    metrics = stack.metrics()
    for o in outcomes:
        o.assert_all_delivered()
    # No answer nobody asked for took a lane down (kipside dropped each), none was re-dialled.
    assert metrics.value("kipside_lane_failures_total") == 0
    assert counts.accepted == accepted_before, (accepted_before, counts)
    log = stack.kipside.log_since(mark)
    assert not kit.LANE_FAILED_LINE.search(log), log[-3000:]
    assert "correlation id" not in log, log[-3000:]
    assert stack.relay.problems() == []
    # Every message is in the log exactly once, in order.
    sent = {(o.spec.name, seq) for o in outcomes for seq, _, _ in o.delivered}
    records = kit.assert_logged_once(stack.kipside.bootstrap, targets, sent, specs)
    # Tansu did answer kipside's acks=0 requests, every one, and the relay swallowed none.
    counts = stack.relay.counts()
    assert counts.acks0_requests > 0 and counts.swallowed_acks0_responses == 0, counts
    assert counts.acks0_answers == counts.acks0_requests, counts
    print(
        f"\nacks=0 requests upstream {counts.acks0_requests}, answered by Tansu "
        f"{counts.acks0_answers}, dropped by kipside; {len(records)} records in the log"
    )
