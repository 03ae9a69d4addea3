"""Upstream latency spikes and stalls, injected by the relay between kipside and the broker,
under idempotent producers and a transactional producer (whose adds kipside pre-registers and
holds: a transactions rule is in force), one after the other in one run:

- a spike shorter than every timeout: every answer is late, nothing fails, no lane is closed;
  latency comes back once the spike is over;
- a stall longer than the lanes' answer timeout: kipside closes the stalled lanes with the
  documented line (`... no answer to Produce vN within S s (the upstream answer timeout)`),
  closes the clients that had requests on them, and they resend on new lanes.

Then: nothing acknowledged is lost, nothing is written twice or out of order, the group's
committed offset is the number of committed transactions, and kipside logged no error.

Run: .venv/bin/pytest tests/integration/test_faults_latency.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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
STALL_S = 2.5


@pytest.fixture(autouse=True)
def _needs_lanes() -> None:
    skip_unless_shared_lanes("the shared lanes' timeouts")


class Load:
    """Two idempotent producers and one transactional loop on one topic."""

    def __init__(self, stack: FaultStack, request: pytest.FixtureRequest, **conf: Any):
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


def test_latency_spike_then_stall(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    topic, group = unique_name("lat", request), unique_name("g", request)
    args = ["--upstream-request-timeout", str(ANSWER_TIMEOUT)]
    rules = transaction_rules(("tx-*", topic, group))
    with fault_stack(tmp_path, rules, args) as stack:
        load = Load(stack, request, **{"request.timeout.ms": CLIENT_REQUEST_TIMEOUT_MS})
        load.start()
        time.sleep(1.0)
        spike_at = time.monotonic()
        stack.relay.spike(SPIKE_MS)
        time.sleep(1.0)
        stack.relay.calm()
        calm_at = time.monotonic()
        time.sleep(1.0)
        spike_failures = stack.metrics().value("kipside_lane_failures_total")
        mark = stack.kipside.log_mark()
        stack.relay.stall()
        time.sleep(STALL_S)
        stack.relay.resume()
        time.sleep(1.5)
        load.finish()
        failures = stack.metrics().value("kipside_lane_failures_total")
        log = stack.kipside.log_since(mark)
        everything = stack.kipside.log()
        result = audit(stack.direct, load.topic, PARTITIONS, load.acknowledged())
        offset = group_offset(stack.direct, load.group, load.source)
    latencies = [x for p in load.producers for x in p.latencies]
    before = p99([s for t, s in latencies if load.started + 0.5 < t < spike_at - 0.2])
    during = p99([s for t, s in latencies if spike_at + 0.5 < t < calm_at])
    after = p99([s for t, s in latencies if calm_at + 0.5 < t < calm_at + 1.0])
    timeouts = [ln for ln in log.splitlines() if "(the upstream answer timeout)" in ln]
    print(
        f"\nanswers {SPIKE_MS:.0f} ms late for 1 s, then requests held {STALL_S:g} s: "
        f"{result.line()}; producer p99 before {before * 1000:.0f} ms, during the spike "
        f"{during * 1000:.0f} ms, after {after * 1000:.0f} ms; lane failures "
        f"{spike_failures:.0f} in the spike, {failures - spike_failures:.0f} in the stall; "
        f"transactions {load.loop.transactions} (aborted {load.loop.aborted}, errors "
        f"{dict(load.loop.errors)})\n" + "\n".join(timeouts[:2])
    )
    result.assert_clean()
    assert offset == load.loop.transactions
    assert spike_failures == 0, "a lane failed in a spike shorter than its timeout"
    assert during >= SPIKE_MS / 1000 > after
    assert failures > spike_failures and timeouts, log[-3000:]
    # A lane lost under a transaction registration is an upstream failure the client retries,
    # never a kipside error (it was, once: the registration's calls failed as a group).
    assert "ERROR" not in everything and "kipside error" not in everything, log[-5000:]
