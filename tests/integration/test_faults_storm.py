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

import resource
import subprocess
import sys
import time
from pathlib import Path

import confluent_kafka as ck
import psutil
import pytest
from conftest import create_topics, start_kipside, unique_name
from testkit import procs
from testkit.broker import Broker
from testkit.metrics import scrape
from testkit.ports import free_port

from .fault_kit import SequencedProducer, audit, idempotent_conf, p99, run_producers, wait_until

pytestmark = pytest.mark.integration

STORM = 2000
SLOW_READERS = 8
FETCHES_PER_READER = 64
FETCH_BYTES = 1024 * 1024
FILL_BYTES = 2 * 1024 * 1024  # in the topic the slow readers fetch
PER_CLIENT_IN_FLIGHT = 2 * 1024 * 1024  # limits.max_in_flight_bytes_per_client in this run
PER_CONNECTION_BUDGET = 48 * 1024  # kipside's own cost of one idle client connection, at most
SLACK = 48 * 1024 * 1024  # allocator and interpreter noise
FDS_NEEDED = 2 * (STORM + SLOW_READERS) + 1000  # the storm's sockets, and kipside's
HELD_S = 2.0  # how long the storm's connections stay open once made
BURST_P99_BOUND = 1.0  # seconds: the probe's p99 while kipside accepts the burst
STORM_CLIENT = Path(__file__).with_name("storm_client.py")


def raise_fd_limit() -> None:
    """Children inherit it: the storm's process and kipside."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FDS_NEEDED:
        assert hard == resource.RLIM_INFINITY or hard >= FDS_NEEDED, (
            f"the hard limit on open files is {hard}; the storm needs {FDS_NEEDED}: raise it "
            "(ulimit -Hn) to run this test"
        )
        resource.setrlimit(resource.RLIMIT_NOFILE, (FDS_NEEDED, hard))


@pytest.mark.slow
def test_connection_storm_and_slow_readers(
    tansu: Broker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    raise_fd_limit()
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"limits:\n  max_in_flight_bytes_per_client: {PER_CLIENT_IN_FLIGHT}\n")
    admin = free_port()
    kipside = start_kipside(tansu, tmp_path / "kipside", rules, extra_args=["--admin", str(admin)])

    def gauge(name: str) -> float:
        return scrape(admin).value(name)

    process = psutil.Process(kipside.pid)
    storm: subprocess.Popen[str] | None = None
    try:
        topic, big = unique_name("storm", request), unique_name("big", request)
        create_topics(kipside.bootstrap, [topic, big], 2)
        filler = ck.Producer(idempotent_conf(kipside.bootstrap, "filler"))
        for i in range(FILL_BYTES // 1024):
            filler.produce(big, bytes([i % 251]) * 1024, partition=0)
        assert filler.flush(30) == 0
        del filler
        probe = SequencedProducer("probe", kipside.bootstrap, topic, 2, 100.0)
        probe.start()
        probe_at = time.monotonic()
        time.sleep(1.5)
        rss_before = process.memory_info().rss
        storm_at = time.monotonic()
        args = [kipside.bootstrap, STORM, SLOW_READERS, big, FETCHES_PER_READER, FETCH_BYTES]
        storm = procs.track(
            subprocess.Popen(
                [sys.executable, str(STORM_CLIENT), *map(str, args)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
        assert storm.stdout is not None
        line = storm.stdout.readline()
        assert line.startswith("STORMED"), f"the storm failed: {line!r} (exit {storm.poll()})"
        wait_until(
            lambda: gauge("kipside_client_connections") >= STORM + SLOW_READERS,
            30,
            "kipside to accept the storm",
        )
        accepted_at = time.monotonic()
        peak_rss, peak_fds = 0, 0
        while time.monotonic() < accepted_at + HELD_S:
            peak_rss = max(peak_rss, process.memory_info().rss)
            peak_fds = max(peak_fds, process.num_fds())
            time.sleep(0.1)
        held_until = time.monotonic()
        in_flight = gauge("kipside_in_flight_bytes")
        assert storm.stdin is not None
        storm.stdin.close()
        storm.wait(30)
        run_producers([probe])
        wait_until(
            lambda: (
                gauge("kipside_client_connections") == 0 and gauge("kipside_in_flight_bytes") == 0
            ),
            30,
            "the storm to leave",
        )
        rss_after = process.memory_info().rss
        result = audit(tansu.bootstrap, topic, 2, probe.delivered.acked)
    finally:
        if storm is not None and storm.poll() is None:
            storm.kill()
        code = kipside.stop()
    assert code == 0, f"kipside exited {code}:\n{kipside.log()[-3000:]}"
    before = p99([s for t, s in probe.latencies if probe_at + 0.5 < t < storm_at])
    burst = p99([s for t, s in probe.latencies if storm_at < t < accepted_at])
    held = p99([s for t, s in probe.latencies if accepted_at + 0.5 < t < held_until])
    bound = (
        STORM * PER_CONNECTION_BUDGET + SLOW_READERS * (PER_CLIENT_IN_FLIGHT + FETCH_BYTES) + SLACK
    )
    mib = 1024 * 1024
    print(
        f"\n{STORM} connections at once + {SLOW_READERS} slow readers ({FETCHES_PER_READER} "
        f"Fetches of {FETCH_BYTES // mib} MiB each, never read), accepted in "
        f"{accepted_at - storm_at:.1f} s and held {HELD_S:g} s: kipside RSS "
        f"{rss_before / mib:.0f} MiB before, {peak_rss / mib:.0f} MiB peak (bound "
        f"{(rss_before + bound) / mib:.0f}), {rss_after / mib:.0f} MiB after; open fds peak "
        f"{peak_fds}; in flight {in_flight / mib:.1f} MiB; probe p99 {before * 1000:.1f} ms "
        f"before, {burst * 1000:.0f} ms while the burst was accepted, {held * 1000:.1f} ms while "
        f"held; {result.line()}"
    )
    assert not probe.delivered.failed, probe.delivered.failed[:3]
    result.assert_clean()
    assert peak_fds >= STORM, "the storm never reached kipside"
    assert peak_rss - rss_before <= bound, f"RSS grew {(peak_rss - rss_before) / mib:.0f} MiB"
    assert held <= 2 * before + 0.02, f"the probe's p99 {before:.3f} s before, {held:.3f} s held"
    assert burst <= BURST_P99_BOUND, f"the probe's p99 was {burst:.3f} s during the burst"
