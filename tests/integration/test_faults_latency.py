"""Upstream latency spikes and stalls, injected by the relay between kipside and the broker,
under idempotent producers and a transactional producer (whose adds kipside pre-registers and
holds: a transactions rule is in force), one after the other in one run:

- a spike shorter than every timeout: every answer is late, nothing fails, no lane is closed;
  latency comes back once the spike is over;
- a stall longer than the lanes' answer timeout: kipside closes the stalled lanes with the
  documented line (`... no answer to Produce vN within S s (the upstream answer timeout)`),
  closes the clients that had requests on them, and they resend on new lanes.

Then: nothing acknowledged is lost, nothing is written twice or out of order, the group's
committed offset is the number of committed transactions, and kipside logged no error (a lane
lost under a transaction registration once logged one).

Run: .venv/bin/pytest tests/integration/test_faults_latency.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .fault_scenarios import run_in_ci

pytestmark = pytest.mark.integration


def test_latency_spike_then_stall(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_in_ci("latency", tmp_path, request)
