"""A connection storm with slow readers, beside a probe producer."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka as ck
import psutil
from conftest import create_topics
from testkit import procs
from testkit.broker import start_tansu
from testkit.kipside import start_kipside
from testkit.metrics import scrape
from testkit.ports import free_port

from ..fault_kit.audit import Audit, audit, p99
from ..fault_kit.loads import SequencedProducer, idempotent_conf, run_producers, wait_until
from .outcome import Namer, Outcome, producers_told

MIB = 1024 * 1024


@dataclass(frozen=True)
class StormScale:
    connections: int = 2000
    slow_readers: int = 8
    fetches_per_reader: int = 64
    fetch_bytes: int = 1 * MIB
    fill_bytes: int = 2 * MIB  # in the topic the slow readers fetch
    per_client_in_flight: int = 2 * MIB  # limits.max_in_flight_bytes_per_client
    held_s: float = 2.0
    per_connection_budget: int = 48 * 1024  # kipside's own cost of one idle connection, at most
    slack: int = 48 * MIB  # allocator and interpreter noise
    burst_p99_bound_s: float = 1.0  # the probe's p99 while kipside accepts the burst


STORM_CLIENT = Path(__file__).parent.parent / "storm_client.py"


def raise_fd_limit(needed: int) -> None:
    """Children inherit it: the storm's process and kipside."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        assert hard == resource.RLIM_INFINITY or hard >= needed, (
            f"the hard limit on open files is {hard}; the storm needs {needed}: raise it "
            "(ulimit -Hn) to run this"
        )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def fill(bootstrap: str, topic: str, size: int) -> None:
    """Write `size` bytes of 1 KiB records to partition 0 of `topic`."""
    filler = ck.Producer(idempotent_conf(bootstrap, "filler"))
    for i in range(size // 1024):
        filler.produce(topic, bytes([i % 251]) * 1024, partition=0)
    assert filler.flush(30) == 0


def start_crowd(bootstrap: str, big: str, s: StormScale) -> subprocess.Popen[str]:
    """The storm's own process (storm_client.py), once it says all its connections are made;
    closing its stdin ends it."""
    args = [bootstrap, s.connections, s.slow_readers, big, s.fetches_per_reader, s.fetch_bytes]
    crowd = procs.track(
        subprocess.Popen(
            [sys.executable, str(STORM_CLIENT), *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    )
    assert crowd.stdout is not None
    line = crowd.stdout.readline()
    assert line.startswith("STORMED"), f"the storm failed: {line!r} ({crowd.poll()})"
    return crowd


def peaks(process: psutil.Process, seconds: float) -> tuple[int, int]:
    """The process's peak RSS and open file descriptors over `seconds`, sampled every 0.1 s."""
    peak_rss, peak_fds = 0, 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        peak_rss = max(peak_rss, process.memory_info().rss)
        peak_fds = max(peak_fds, process.num_fds())
        time.sleep(0.1)
    return peak_rss, peak_fds


@dataclass
class Hold:
    """The storm while kipside held it: when it had every connection and when the hold ended,
    kipside's peak RSS and descriptors meanwhile, and the bytes in flight at its end."""

    accepted_at: float
    until: float
    peak_rss: int
    peak_fds: int
    in_flight: float


@dataclass
class StormRun:
    """What one storm measured: the probe and its audit, when the probe and the storm began,
    kipside's RSS before and after, and the hold."""

    probe: SequencedProducer
    result: Audit
    probe_at: float
    storm_at: float
    rss_before: int
    rss_after: int
    hold: Hold


def gauge(admin: int, metric: str) -> float:
    """One of kipside's metrics, scraped from its admin endpoint."""
    return scrape(admin).value(metric)


def storm(work: Path, name: Namer, s: StormScale) -> Outcome:
    """A connection storm from its own process (each connection sends ApiVersions and Metadata;
    slow readers pipeline Fetches and never read) beside a confluent-kafka probe producer;
    kipside straight on a fresh Tansu (a storm is no network fault, and a relay in Python would
    be the bottleneck)."""
    out = Outcome(
        "a probe idempotent confluent-kafka producer, 100 msg/s",
        f"{s.connections} connections at once (ApiVersions + Metadata each) + {s.slow_readers} slow"
        f" readers ({s.fetches_per_reader} x {s.fetch_bytes // MIB} MiB Fetches, never read), "
        f"held {s.held_s:g} s; limits.max_in_flight_bytes_per_client "
        f"{s.per_client_in_flight // MIB} MiB",
    )
    raise_fd_limit(2 * (s.connections + s.slow_readers) + 1000)
    rules = work / "rules.yaml"
    rules.write_text(f"limits:\n  max_in_flight_bytes_per_client: {s.per_client_in_flight}\n")
    admin = free_port()
    with start_tansu() as tansu:
        kipside = start_kipside(tansu, work / "kipside", rules, extra_args=["--admin", str(admin)])
        process = psutil.Process(kipside.pid)
        try:
            run = _probe_through_storm(kipside.bootstrap, process, tansu.bootstrap, admin, name, s)
        finally:
            code = kipside.stop()
    _judge(out, run, code, s)
    return out


def _probe_through_storm(
    bootstrap: str, process: psutil.Process, direct: str, admin: int, name: Namer, s: StormScale
) -> StormRun:
    """The probe writes through kipside (at `bootstrap`, its `process`) 1.5 s alone, then
    through the storm and after it, until the storm is gone from kipside's gauges; its log is
    audited from the broker itself (`direct`)."""
    topic, big = name("storm"), name("big")
    create_topics(bootstrap, [topic, big], 2)
    fill(bootstrap, big, s.fill_bytes)
    probe = SequencedProducer("probe", bootstrap, topic, 2, 100.0)
    probe.run_timeout = 120 + s.held_s
    probe.start()
    probe_at = time.monotonic()
    time.sleep(1.5)
    rss_before = process.memory_info().rss
    storm_at = time.monotonic()
    hold = _hold_storm(bootstrap, big, admin, process, s)
    run_producers([probe], timeout=120)

    def gone() -> bool:
        connections = gauge(admin, "kipside_client_connections")
        return connections == gauge(admin, "kipside_in_flight_bytes") == 0

    wait_until(gone, 30, "the storm gone")
    rss_after = process.memory_info().rss
    result = audit(direct, topic, 2, probe.delivered.acked)
    return StormRun(probe, result, probe_at, storm_at, rss_before, rss_after, hold)


def _hold_storm(
    bootstrap: str, big: str, admin: int, process: psutil.Process, s: StormScale
) -> Hold:
    """Start the storm, wait until kipside has every connection, sample kipside (`process`)
    while the storm is held, then end the storm."""
    crowd = start_crowd(bootstrap, big, s)
    try:
        wanted = s.connections + s.slow_readers
        wait_until(
            lambda: gauge(admin, "kipside_client_connections") >= wanted,
            120,
            "the storm accepted",
        )
        accepted_at = time.monotonic()
        peak_rss, peak_fds = peaks(process, s.held_s)
        held_until = time.monotonic()
        in_flight = gauge(admin, "kipside_in_flight_bytes")
        assert crowd.stdin is not None
        crowd.stdin.close()
        crowd.wait(60)
    finally:
        if crowd.poll() is None:
            crowd.kill()
    return Hold(accepted_at, held_until, peak_rss, peak_fds, in_flight)


def _judge(out: Outcome, run: StormRun, code: int, s: StormScale) -> None:
    """The result line and the checks: kipside exited 0, the probe's messages all there once
    and its p99 kept, kipside's RSS growth within the budget of the storm's connections."""
    latencies, storm_at, hold = run.probe.latencies, run.storm_at, run.hold
    accepted_at = hold.accepted_at
    before = p99([t for at, t in latencies if run.probe_at + 0.5 < at < storm_at])
    burst = p99([t for at, t in latencies if storm_at < at < accepted_at])
    held = p99([t for at, t in latencies if accepted_at + 0.5 < at < hold.until])
    bound = (
        s.connections * s.per_connection_budget
        + s.slow_readers * (s.per_client_in_flight + s.fetch_bytes)
        + s.slack
    )
    result, rss_before = run.result, run.rss_before
    peak_rss, peak_fds = hold.peak_rss, hold.peak_fds
    out.result = (
        f"{result.line()}; accepted in {accepted_at - storm_at:.1f} s; kipside RSS "
        f"{rss_before / MIB:.0f} MiB before, {peak_rss / MIB:.0f} MiB peak (bound "
        f"{(rss_before + bound) / MIB:.0f}), {run.rss_after / MIB:.0f} MiB after; fds peak "
        f"{peak_fds}; in flight {hold.in_flight / MIB:.1f} MiB; probe p99 "
        f"{before * 1000:.0f} ms before, {burst * 1000:.0f} ms while the burst was accepted, "
        f"{held * 1000:.0f} ms while held"
    )
    out.check("kipside exited 0", code == 0, code)
    producers_told(out, [run.probe])
    out.check("every acknowledged probe message once, in order", result.clean, result.line())
    out.check("the storm reached kipside", peak_fds >= s.connections, peak_fds)
    out.check("RSS growth within the budget", peak_rss - rss_before <= bound, peak_rss - rss_before)
    out.check(
        "the probe's p99 kept while the storm is held", held <= 2 * before + 0.02, (before, held)
    )
    out.check(
        "the probe's p99 bounded while the burst is accepted", burst <= s.burst_p99_bound_s, burst
    )
