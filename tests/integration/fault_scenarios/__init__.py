"""The fault scenarios, once: the CI suite (tests/integration/test_faults_*.py) runs each at its
default, short scale and asserts every check; bench/faults.py runs them longer and bigger and
reports the same checks. Each scenario takes a working directory, a namer (a unique Kafka name
per prefix) and its scale, runs real clients through kipside while injecting its faults, reads
the log from the broker itself, and returns an Outcome: the load it held, the faults, the
result line ("acknowledged N, found N, duplicates 0, reordered 0" and what else it measured)
and its checks.

One module per kind of fault: network.py (cut, blackhole), restart.py, latency.py (spike,
stall), disconnect.py (vanishing clients), storm.py (a connection storm); outcome.py holds the
Outcome and the scale parts they share, on the clients and stack of ../fault_kit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import DIRECT, skip_unless_shared_lanes, unique_name

from .disconnect import DisconnectScale, clients_vanish
from .latency import LatencyScale, latency_spike_then_stall
from .network import (
    GroupScale,
    NetworkScale,
    TransactionScale,
    cut_during_a_rebalance,
    cut_during_transactions,
    cut_then_blackhole_during_produce,
)
from .outcome import Namer, Outcome
from .restart import RestartScale, restarts_mid_traffic
from .storm import StormScale, storm


@dataclass(frozen=True)
class Scenario:
    """A scenario, its CI scale (dataclasses.replace it for a bigger run) and what of kipside's
    it tests, so that its CI test skips where that is absent."""

    fn: Callable[[Path, Namer, Any], Outcome]
    ci_scale: Any
    lanes: str = ""  # the shared lanes' behaviour it tests (skipped without shared lanes)
    kipside: str = ""  # why it needs kipside itself (skipped with KIPSIDE_TEST_DIRECT=1)

    def skip_unless_testable(self) -> None:
        if self.lanes:
            skip_unless_shared_lanes(self.lanes)
        if self.kipside and DIRECT:
            pytest.skip(f"KIPSIDE_TEST_DIRECT=1: {self.kipside}")


LANE_FAULTS = "the shared lanes' fault handling"
SCENARIOS: dict[str, Scenario] = {
    "network-produce": Scenario(cut_then_blackhole_during_produce, NetworkScale(), LANE_FAULTS),
    "network-transactions": Scenario(cut_during_transactions, TransactionScale(), LANE_FAULTS),
    "network-rebalance": Scenario(cut_during_a_rebalance, GroupScale(), LANE_FAULTS),
    "restarts": Scenario(
        restarts_mid_traffic, RestartScale(), kipside="restarting kipside needs kipside"
    ),
    "latency": Scenario(latency_spike_then_stall, LatencyScale(), "the lanes' answer timeout"),
    "disconnects": Scenario(clients_vanish, DisconnectScale(), "handling clients that vanish"),
    "storm": Scenario(storm, StormScale(), kipside="the storm measures kipside itself"),
}


def run(scenario: str, work: Path, name: Namer, scale: Any = None) -> Outcome:
    """Run one scenario of SCENARIOS at `scale` (its CI scale if None) and print its outcome."""
    chosen = SCENARIOS[scenario]
    work.mkdir(parents=True, exist_ok=True)
    outcome = chosen.fn(work, name, chosen.ci_scale if scale is None else scale)
    print(f"\n{scenario}: {outcome.faults}\n  {outcome.result}")
    return outcome


def run_in_ci(scenario: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A CI test's run of `scenario`: at its CI scale, skipped where what it tests is absent,
    every check asserted."""
    SCENARIOS[scenario].skip_unless_testable()
    run(scenario, tmp_path, lambda prefix: unique_name(prefix, request)).assert_ok()
