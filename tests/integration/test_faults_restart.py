"""kipside restarts mid-traffic: SIGTERM (graceful) and SIGKILL, then started again on the same
ports, while idempotent confluent-kafka producers (and, with SIGKILL, an at-least-once
kafka-python producer) keep writing through it. Afterwards the topic is read from the broker
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


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_restart_mid_traffic(
    how: signal.Signals, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """kipside is stopped with `how` while three producers write, stays down 0.5 s, and starts
    again on the same ports. SIGTERM: kipside answers what it read, then exits 0. SIGKILL:
    whatever was in flight is lost with the process; the clients resend it."""
    with fault_stack(tmp_path) as stack:
        topic = unique_name("restart", request)
        create_topics(stack.bootstrap, [topic], PARTITIONS)
        producers = [
            SequencedProducer(f"ck{i}", stack.bootstrap, topic, PARTITIONS, RATE) for i in range(2)
        ]
        if how == signal.SIGKILL:
            producers.append(KafkaPythonProducer("kp", stack.bootstrap, topic, PARTITIONS, RATE))
        else:
            producers.append(SequencedProducer("ck2", stack.bootstrap, topic, PARTITIONS, RATE))
        for p in producers:
            p.start()
        time.sleep(1.0)
        before = sum(len(p.delivered.acked) for p in producers)
        code = stack.restart(how, down_for=0.5)
        time.sleep(2.0)
        run_producers(producers)
        stack.kipside.assert_alive()
        result = audit(stack.direct, topic, PARTITIONS, acked_of(producers), at_least_once={"kp"})
    print(
        f"\n{how.name} (exit {code}) after {before} acknowledged, down 0.5 s: {result.line()}; "
        f"unacknowledged yet written {result.unacknowledged_in_log}"
    )
    assert code == (0 if how == signal.SIGTERM else -signal.SIGKILL)
    for p in producers:
        assert not p.delivered.failed, f"{p.name}: {p.delivered.failed[:3]}"
        assert p.unflushed == 0, f"{p.name}: {p.unflushed} never reported"
    result.assert_clean()
