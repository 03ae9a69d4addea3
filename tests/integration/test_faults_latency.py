"""Upstream latency spikes and stalls, injected by the relay between kipside and the broker,
under idempotent producers and transactional producers (whose adds kipside pre-registers and
holds, rules in force).

- A spike shorter than every timeout: every answer is late, nothing fails, no lane is closed;
  latency comes back once the spike is over.
- A stall longer than the lanes' answer timeout: kipside closes the stalled lanes with the
  documented line (`... no answer to Produce vN within S s (the upstream answer timeout)`),
  closes the clients that had requests on them, and they resend on new lanes: nothing
  acknowledged is lost, nothing is written twice, transactions that broke are aborted by the
  application and done again.

Run: .venv/bin/pytest tests/integration/test_faults_latency.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import create_topics, skip_unless_shared_lanes, unique_name

from .fault_kit import (
    RUN_TIMEOUT,
    FaultStack,
    SequencedProducer,
    TransactionalLoop,
    acked_of,
    audit,
    fault_stack,
    group_offset,
    p99,
    run_producers,
    transaction_rules,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
RATE = 150.0
SPIKE_MS = 400.0
ANSWER_TIMEOUT = 1.0  # --upstream-request-timeout
CLIENT_REQUEST_TIMEOUT_MS = 2000  # producers' request.timeout.ms: their Produce timeout_ms


@pytest.fixture(autouse=True)
def _needs_lanes() -> None:
    skip_unless_shared_lanes("the shared lanes' timeouts")


class Load:
    """Two idempotent producers and one transactional loop on one topic."""

    def __init__(self, stack: FaultStack, request: pytest.FixtureRequest, **conf: object):
        self.stack = stack
        self.topic = unique_name("lat", request)
        self.source = unique_name("lat-in", request)
        self.group = unique_name("g", request)
        create_topics(stack.bootstrap, [self.topic], PARTITIONS)
        create_topics(stack.bootstrap, [self.source], 1)
        self.producers = [
            SequencedProducer(f"ck{i}", stack.bootstrap, self.topic, PARTITIONS, RATE, **conf)
            for i in range(2)
        ]
        self.loop = TransactionalLoop(
            "tx-lat", stack.bootstrap, self.topic, PARTITIONS, self.source, self.group, **conf
        )

    def start(self) -> None:
        self.started = time.monotonic()
        for p in self.producers:
            p.start()
        self.loop.start()

    def finish(self) -> None:
        run_producers(self.producers)
        self.loop.stop()
        self.loop.join(RUN_TIMEOUT)
        assert not self.loop.is_alive(), "the transactional loop did not finish"
        assert self.loop.error is None, repr(self.loop.error)

    def acknowledged(self) -> list[bytes]:
        return acked_of(self.producers) + self.loop.committed


def rules(load_glob: str, topic: str, group: str) -> str:
    return transaction_rules((load_glob, topic, group))


def test_latency_spike_shorter_than_the_timeouts(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    topic, group = unique_name("lat", request), unique_name("g", request)
    with fault_stack(tmp_path, rules("tx-*", topic, group)) as stack:
        load = Load(stack, request)
        load.start()
        time.sleep(1.0)
        spike_at = time.monotonic()
        stack.relay.spike(SPIKE_MS)
        time.sleep(1.5)
        stack.relay.calm()
        calm_at = time.monotonic()
        time.sleep(1.5)
        load.finish()
        metrics = stack.metrics()
        result = audit(stack.direct, load.topic, PARTITIONS, load.acknowledged())
        offset = group_offset(stack.direct, load.group, load.source)
    latencies = [x for p in load.producers for x in p.latencies]
    before = p99([s for t, s in latencies if load.started + 0.5 < t < spike_at - 0.2])
    during = p99([s for t, s in latencies if spike_at + 0.5 < t < calm_at])
    after = p99([s for t, s in latencies if t > calm_at + 0.5])
    print(
        f"\nresponses {SPIKE_MS:.0f} ms late for 1.5 s: {result.line()}; producer p99 "
        f"before {before * 1000:.0f} ms, during {during * 1000:.0f} ms, after "
        f"{after * 1000:.0f} ms; transactions {load.loop.transactions}"
    )
    result.assert_clean()
    assert offset == load.loop.transactions
    assert metrics.value("kipside_lane_failures_total") == 0
    assert not load.loop.errors, load.loop.errors
    assert during >= SPIKE_MS / 1000 > after


def test_stall_longer_than_the_answer_timeout(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    topic, group = unique_name("lat", request), unique_name("g", request)
    args = ["--upstream-request-timeout", str(ANSWER_TIMEOUT)]
    with fault_stack(tmp_path, rules("tx-*", topic, group), args) as stack:
        load = Load(stack, request, **{"request.timeout.ms": CLIENT_REQUEST_TIMEOUT_MS})
        load.start()
        time.sleep(1.0)
        mark = stack.kipside.log_mark()
        stack.relay.stall()
        time.sleep(3.0)
        stack.relay.resume()
        time.sleep(2.0)
        load.finish()
        metrics = stack.metrics()
        log = stack.kipside.log_since(mark)
        result = audit(stack.direct, load.topic, PARTITIONS, load.acknowledged())
        offset = group_offset(stack.direct, load.group, load.source)
    timeouts = [ln for ln in log.splitlines() if "(the upstream answer timeout)" in ln]
    print(
        f"\nrequests held 3 s at the relay: {result.line()}; lane failures "
        f"{metrics.value('kipside_lane_failures_total'):.0f}; transactions "
        f"{load.loop.transactions} (aborted {load.loop.aborted}, errors {dict(load.loop.errors)})"
    )
    print("\n".join(timeouts[:3]))
    result.assert_clean()
    assert offset == load.loop.transactions
    assert timeouts, log[-3000:]
    # A lane lost under a transaction registration is an upstream failure the client retries,
    # never a kipside error (it was, once: the registration's calls failed as a group).
    assert "ERROR" not in log and "kipside error" not in log, log[-5000:]
    assert metrics.value("kipside_lane_failures_total") >= 1
