"""kipside restarts mid-traffic: SIGTERM (graceful), then SIGKILL, each time started again on the
same ports, while idempotent confluent-kafka producers and an at-least-once kafka-python
producer keep writing through it. Afterwards the topic is read from the broker
itself: every acknowledged message is in the log, idempotent producers wrote each exactly once
and in order; the at-least-once producer may have written some twice (counted), never lost one.

Run: .venv/bin/pytest tests/integration/test_faults_restart.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from conftest import create_topics, unique_name

from .fault_kit import (
    KafkaPythonProducer,
    SequencedProducer,
    acked_of,
    audit,
    fault_stack,
    run_producers,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
RATE = 150.0  # messages a second, per producer


def test_sigterm_then_sigkill_mid_traffic(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """While two idempotent confluent-kafka producers and an at-least-once kafka-python one
    write, kipside is stopped with SIGTERM (it answers what it read, then exits 0), started
    again on the same ports after 0.5 s, then killed with SIGKILL (whatever was in flight is
    lost with the process; the clients resend it) and started again."""
    with fault_stack(tmp_path) as stack:
        topic = unique_name("restart", request)
        create_topics(stack.bootstrap, [topic], PARTITIONS)
        producers = [
            SequencedProducer(f"ck{i}", stack.bootstrap, topic, PARTITIONS, RATE) for i in range(2)
        ]
        producers.append(KafkaPythonProducer("kp", stack.bootstrap, topic, PARTITIONS, RATE))
        for p in producers:
            p.start()
        acked: list[int] = []
        codes = []
        for how in (signal.SIGTERM, signal.SIGKILL):
            time.sleep(1.5)
            acked.append(sum(len(p.delivered.acked) for p in producers))
            codes.append(stack.restart(how, down_for=0.5))
        time.sleep(1.5)
        run_producers(producers)
        stack.kipside.assert_alive()
        result = audit(stack.direct, topic, PARTITIONS, acked_of(producers), at_least_once={"kp"})
    print(
        f"\nSIGTERM (exit {codes[0]}) after {acked[0]} acknowledged, SIGKILL (exit {codes[1]}) "
        f"after {acked[1]}, each down 0.5 s: {result.line()}; unacknowledged yet written "
        f"{result.unacknowledged_in_log}"
    )
    assert codes == [0, -signal.SIGKILL]
    for p in producers:
        assert not p.delivered.failed, f"{p.name}: {p.delivered.failed[:3]}"
        assert p.unflushed == 0, f"{p.name}: {p.unflushed} never reported"
    result.assert_clean()
