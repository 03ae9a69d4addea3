"""kipside restarts mid-traffic: SIGTERM (graceful), then SIGKILL, each time started again on the
same ports, while idempotent confluent-kafka producers and an at-least-once kafka-python
producer keep writing through it. Afterwards the topic is read from the broker itself: every
acknowledged message is in the log, idempotent producers wrote each exactly once and in order;
the at-least-once producer may have written some twice (counted), never lost one.

Run: .venv/bin/pytest tests/integration/test_faults_restart.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .fault_scenarios import run_in_ci

pytestmark = pytest.mark.integration


def test_sigterm_then_sigkill_mid_traffic(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """kipside is stopped with SIGTERM (it answers what it read, then exits 0), started again
    on the same ports after 0.5 s, then killed with SIGKILL (whatever was in flight is lost with
    the process; the clients resend it) and started again."""
    run_in_ci("restarts", tmp_path, request)
