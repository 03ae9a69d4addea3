"""A connection storm: 2,000 client connections opened at once, each sending an ApiVersions and
a Metadata request, plus slow readers that pipeline Fetch requests for megabytes and never read
an answer, while an idempotent confluent-kafka producer (the probe) writes through the same
kipside. The storm runs in its own process (storm_client.py), so the probe's process pays none
of its CPU; kipside talks to Tansu directly (no relay: the storm is no network fault, and a
Python relay would be the bottleneck).

What must hold: kipside accepts and serves them all; its memory stays bounded (RSS growth
within what the connections and the in-flight limits allow, measured from the outside with
psutil); the probe loses nothing and keeps its latency while the storm's connections are held
(p99 against before the storm, same run); accepting the burst itself costs kipside CPU during
which the probe waits (measured, bounded); once the storm leaves, kipside's connection and
in-flight gauges come back to the probe's own.

Run: .venv/bin/pytest tests/integration/test_faults_storm.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .fault_scenarios import run_in_ci

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_connection_storm_and_slow_readers(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_in_ci("storm", tmp_path, request)
