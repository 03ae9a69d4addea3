"""Multi-batch produce (issue 3): many small producers direct vs through kipside, plus idle clients.

    .venv/bin/python bench/coalesce.py [--clients 64] [--processes 8] [--rates 10,25,50]
                                       [--seconds 6] [--partitions 128] [--idle 1000]

Part 1, produce. For each offered load (--rates: records/s per producer) and each configuration,
a fresh in-memory Tansu (and kipside) is started, one topic with --partitions partitions is
created, and --clients confluent-kafka producers (linger.ms=0, acks=all, 100 B records, no keys)
run in --processes worker processes (bench/_coalesce_load.py, one thread and one librdkafka
instance per producer), each sending at a steady pace for --seconds. Configurations:

- direct: the producers talk to Tansu;
- kipside, coalescing off: rules `coalescing.enabled: false` (lanes still shared for short APIs);
- kipside --one-to-one: every client connection gets its own broker connection;
- kipside, coalescing on: rules `coalescing.enabled: true, lanes: 2, linger_ms: 0`.

The workers connect and warm up first; the measurement window runs from the moment they all
start pacing to the moment they have all flushed. Over that window: Produce requests sent by
the clients (librdkafka statistics, `brokers[*].req.Produce`) and, through kipside, received
from clients and sent upstream (kipside's /metrics), Tansu's and kipside's CPU seconds (psutil),
delivery-report latency of every record (librdkafka `Message.latency()`), and Tansu's
established connections on its port (psutil, sampled every second, maximum reported).

Coalescing is natural batching (a lane sends what queued while its previous request was in
flight), so the ratio depends on the offered load: that is why several loads are measured.

Part 2, idle clients. Through kipside with coalescing on (and, for contrast, --one-to-one),
--idle raw TCP connections each do what a client does when it connects (ApiVersions v3, then
Metadata v12) and then stay idle, half on the bootstrap listener and half on the broker's node
listener. Reported: kipside's RSS and Tansu's established connections.

Prints tables and rewrites the `coalesce` section of docs/performance.md and
docs/img/coalesce.png. All targets are loopback; every load is bounded in count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import resource
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    HOST,
    HarnessError,
    Stack,
    exit_cleanly_on_sigterm,
    machine_busy_seconds,
    on_stack,
    open_stack,
    run_worker,
    wait_until_quiet,
)
from _kipside import produce_counts, scrape, snapshot_kipside
from _report import (
    IMG_DIR,
    command_line,
    facts_markdown,
    machine_info,
    markdown_table,
    text_table,
    utc_now,
    versions,
)
from _report import (
    write_section as write_doc_section,
)
from _staged import StagedWorker

from kipside.protocol.headers import build_frame, encode_request_header, parse_response_header
from kipside.protocol.messages import decode_response
from kipside.proxy.devbroker import free_port

SECTION = "coalesce"
LOAD = Path(__file__).resolve().parent / "_coalesce_load.py"
TOPIC = "bench-coalesce"
RECORD_SIZE = 100
API_VERSIONS, METADATA, PRODUCE = 18, 3, 0

# Targets of issue 3.
TARGET_RATIO = 8.0
TARGET_BROKER_CPU = 2.0
TARGET_IDLE_UPSTREAM = 2
TARGET_IDLE_RSS_MB = 150.0
NOISE_CORES = 0.1
FD_HEADROOM = 512
DEFAULT_RATES = "10,25,40,50"
# A run "overloaded": it delivered less than this share of the offered rate, or its median
# delivery latency exceeded this.
OVERLOAD_SHARE = 0.95
OVERLOAD_P50_MS = 100.0
# A run during which other processes kept more than this many cores busy is measured again.
RETRY_NOISE_CORES = 0.25
QUIET_SAMPLE_S = 3.0


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    """Row name in tables."""
    short: str
    """Bar label in the chart."""
    path: str
    coalescing: bool | None = None
    """None: no rule file."""
    one_to_one: bool = False
    color: str = "#d62728"
    linger_ms: float = 0.0


CONFIGS: tuple[Config, ...] = (
    Config("direct", "direct", "direct", "direct", color="#7f7f7f"),
    Config(
        "off",
        "kipside, coalescing off",
        "kipside\ncoalescing off",
        "kipside",
        coalescing=False,
        color="#f4a3a3",
    ),
    Config(
        "one-to-one",
        "kipside --one-to-one",
        "kipside\n--one-to-one",
        "kipside",
        one_to_one=True,
        color="#e377c2",
    ),
    Config("on", "kipside, coalescing on", "kipside\ncoalescing on", "kipside", coalescing=True),
    Config(
        "on-linger",
        "kipside, coalescing on, linger_ms 5",
        "kipside\ncoalescing on\nlinger 5 ms",
        "kipside",
        coalescing=True,
        linger_ms=5.0,
        color="#8c1d1d",
    ),
)
CONFIG_KEYS = tuple(c.key for c in CONFIGS)


def rules_text(enabled: bool, linger_ms: float = 0.0) -> str:
    return (
        "coalescing:\n"
        f"  enabled: {'true' if enabled else 'false'}\n"
        "  lanes: 2\n"
        f"  linger_ms: {linger_ms:g}\n"
        "  max_request_bytes: 1048576\n"
    )


def kipside_args(cfg: Config, logdir: Path, admin_port: int) -> list[str]:
    out = ["--admin", f"{HOST}:{admin_port}"]
    if cfg.coalescing is not None:
        rules = logdir / "rules.yaml"
        rules.write_text(rules_text(cfg.coalescing, cfg.linger_ms))
        out += ["--rules", str(rules)]
    if cfg.one_to_one:
        out.append("--one-to-one")
    return out


# --------------------------------------------------------------------------- observation


def broker_connections(pid: int, port: int) -> int:
    """Established TCP connections of process `pid` on its local port `port`."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return -1
    return sum(
        1 for c in conns if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port
    )


def own_cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def percentile(ordered: Sequence[int], p: float) -> float:
    if not ordered:
        return float("nan")
    idx = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return float(ordered[idx])


# --------------------------------------------------------------------------- part 1: produce


@dataclass
class ProduceRun:
    cfg: Config
    rate: float
    """Records/s per producer."""
    clients: int
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    log_problems: list[str] = field(default_factory=list)
    first_delivery_error: str | None = None
    attempts: int = 1


def measure_produce(
    cfg: Config, rate: float, args: argparse.Namespace, logroot: Path, attempt: int = 1
) -> ProduceRun:
    run = ProduceRun(cfg, rate, args.clients, attempts=attempt)
    logdir = logroot / f"produce-{rate:g}-{cfg.key}-{attempt}"
    logdir.mkdir()
    admin_port = free_port(HOST)
    extra = kipside_args(cfg, logdir, admin_port) if cfg.path == "kipside" else []
    wait_until_quiet(timeout=args.quiet_between)
    admin = admin_port if cfg.path == "kipside" else None
    _, run.error, run.log_problems = on_stack(
        cfg.path,
        lambda stack: _produce_on(stack, cfg, args, admin, run),
        logdir=logdir,
        kipside_args=extra,
    )
    return run


def _produce_on(
    stack: Stack, cfg: Config, args: argparse.Namespace, admin: int | None, run: ProduceRun
) -> None:
    run_worker(
        stack,
        "create-topics",
        {"bootstrap": stack.bootstrap, "topics": [TOPIC], "partitions": args.partitions},
        timeout=60,
    )
    per = [args.clients // args.processes] * args.processes
    for i in range(args.clients % args.processes):
        per[i] += 1
    workers: list[StagedWorker] = []
    try:
        first = 0
        for i, n in enumerate(per):
            load_args = {
                "bootstrap": stack.bootstrap,
                "topic": TOPIC,
                "producers": n,
                "first_index": first,
                "rate": run.rate,
                "seconds": args.seconds,
                "size": RECORD_SIZE,
                "client_prefix": "bench-coalesce",
                "go_timeout": 120,
            }
            first += n
            workers.append(StagedWorker(LOAD, load_args, stack.logdir / f"load-{i}.log"))
        ready_by = time.monotonic() + 90
        for w in workers:
            w.expect("READY", ready_by)
        stack.check_alive()

        broker_pid = stack.broker.pid
        conns: list[int] = [broker_connections(broker_pid, stack.broker_port)]
        gauges: list[float] = []
        m0 = scrape(admin) if admin is not None else {}
        proxy0, broker0 = stack.cpu_seconds()
        own0 = own_cpu_seconds()
        busy0 = machine_busy_seconds()
        t0 = time.monotonic()
        for w in workers:
            w.send("GO")

        finish_by = t0 + args.seconds * 1.5 + 60
        pending = list(workers)
        next_sample = t0 + 1.0
        while pending:
            for w in list(pending):
                with contextlib.suppress(queue.Empty):
                    line = w.lines.get_nowait()
                    if line != "FINISHED":
                        w.lines.put(line)
                        w.expect("FINISHED", time.monotonic())  # raises with the log tail
                    pending.remove(w)
            now = time.monotonic()
            if now > finish_by:
                raise HarnessError(f"producer workers did not finish within {finish_by - t0:.0f} s")
            if now >= next_sample:
                next_sample += 1.0
                conns.append(broker_connections(broker_pid, stack.broker_port))
                if admin is not None:
                    gauges.append(scrape(admin).get("kipside_upstream_connections", 0.0))
            time.sleep(0.05)
        t1 = time.monotonic()
        proxy1, broker1 = stack.cpu_seconds()
        busy1 = machine_busy_seconds()
        own1 = own_cpu_seconds()
        m1 = scrape(admin) if admin is not None else {}
        conns.append(broker_connections(broker_pid, stack.broker_port))

        results = [json.loads(w.expect("{", time.monotonic() + 30)) for w in workers]
    finally:
        for w in workers:
            w.stop()

    delivered = sum(int(r["delivered"]) for r in results)
    offered = sum(int(r["offered"]) for r in results)
    errors = sum(int(r["errors"]) for r in results)
    firsts = [r["first_error"] for r in results if r["first_error"]]
    run.first_delivery_error = firsts[0] if firsts else None
    lat = sorted(v for r in results for v in r["latencies_us"])
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    client_cpu = sum(float(r["cpu_s"]) for r in results)
    stats_reqs = float(sum(int(r["client_produce_requests"]) for r in results))
    if admin is not None:
        c0, u0 = produce_counts(m0)
        c1, u1 = produce_counts(m1)
        client_reqs, upstream_reqs = c1 - c0, u1 - u0
    else:
        client_reqs = upstream_reqs = stats_reqs
    broker_cpu = broker1 - broker0
    proxy_cpu = proxy1 - proxy0
    wall = t1 - t0
    ours = broker_cpu + proxy_cpu + client_cpu + (own1 - own0)
    millions = max(delivered, 1) / 1e6
    run.metrics = {
        "offered": offered,
        "delivered": delivered,
        "errors": errors,
        "msgs_per_s": delivered / span if span > 0 else 0.0,
        "p50_ms": percentile(lat, 50) / 1000,
        "p99_ms": percentile(lat, 99) / 1000,
        "client_reqs": client_reqs,
        "client_reqs_stats": stats_reqs,
        "upstream_reqs": upstream_reqs,
        "ratio": client_reqs / upstream_reqs if upstream_reqs else float("nan"),
        "msgs_per_upstream_req": delivered / upstream_reqs if upstream_reqs else float("nan"),
        "broker_cpu_s": broker_cpu,
        "broker_cpu_per_m": broker_cpu / millions,
        "proxy_cpu_s": proxy_cpu,
        "proxy_cpu_per_m": proxy_cpu / millions,
        "client_cpu_s": client_cpu,
        "broker_conns": float(max(conns)),
        "kipside_upstream_gauge": max(gauges) if gauges else float("nan"),
        "wall_s": wall,
        "noise_cores": max(0.0, (busy1 - busy0) - ours) / wall,
    }


# --------------------------------------------------------------------------- part 2: idle


def _compact_string(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw) + 1]) + raw  # uvarint; short strings only


API_VERSIONS_V3_BODY = _compact_string("kipside-bench") + _compact_string("0.1") + b"\x00"
# topics: null (all), allow_auto_topic_creation, include_topic_authorized_operations, tags
METADATA_V12_BODY = b"\x00" + b"\x00" + b"\x00" + b"\x00"


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise HarnessError("kipside closed an idle client connection during its handshake")
            buf += chunk
        return bytes(buf)

    head = exactly(4)
    return head + exactly(int.from_bytes(head, "big", signed=True))


def handshake(sock: socket.socket, client_id: str) -> Any:
    """ApiVersions v3 then Metadata v12 (all topics), as a client does on connect."""
    sock.sendall(
        build_frame(encode_request_header(API_VERSIONS, 3, 1, client_id), API_VERSIONS_V3_BODY)
    )
    frame = _read_frame(sock)
    error = int.from_bytes(frame[8:10], "big", signed=True)
    if error != 0:
        raise HarnessError(f"ApiVersions v3 answered with error code {error}")
    sock.sendall(build_frame(encode_request_header(METADATA, 12, 2, client_id), METADATA_V12_BODY))
    frame = _read_frame(sock)
    header = parse_response_header(frame, METADATA, 12)
    return decode_response(METADATA, 12, frame, header.body_offset)


@dataclass
class IdleRun:
    label: str
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    log_problems: list[str] = field(default_factory=list)


def measure_idle(
    label: str, extra: Sequence[str], count: int, admin_port: int, logdir: Path, limit_s: float
) -> IdleRun:
    run = IdleRun(label)
    stack: Stack | None = None
    socks: list[socket.socket] = []
    try:
        with open_stack("kipside", logdir=logdir, kipside_args=extra) as stack:
            assert stack.proxy is not None
            time.sleep(0.5)
            rss0 = stack.proxy.rss_bytes()
            conns0 = broker_connections(stack.broker.pid, stack.broker_port)
            host, _, port = stack.bootstrap.rpartition(":")
            t0 = time.monotonic()
            first = socket.create_connection((host, int(port)), timeout=10)
            socks.append(first)
            meta = handshake(first, "bench-idle-0")
            node_ports = sorted({int(b.port) for b in meta.brokers})
            if not node_ports:
                raise HarnessError("kipside's Metadata answer lists no brokers")
            targets = [int(port), *node_ports]
            for i in range(1, count):
                if time.monotonic() - t0 > limit_s:
                    raise HarnessError(
                        f"opened only {i} of {count} idle connections in {limit_s} s"
                    )
                s = socket.create_connection((host, targets[i % len(targets)]), timeout=10)
                socks.append(s)
                handshake(s, f"bench-idle-{i}")
            opened = time.monotonic() - t0
            time.sleep(2.0)  # let anything lazily opened or closed settle
            stack.check_alive()
            m = scrape(admin_port)
            run.metrics = {
                "clients": float(len(socks)),
                "open_s": opened,
                "rss0_mb": rss0 / 1e6,
                "rss_mb": stack.proxy.rss_bytes() / 1e6,
                "broker_conns0": float(conns0),
                "broker_conns": float(broker_connections(stack.broker.pid, stack.broker_port)),
                "client_gauge": m.get("kipside_client_connections", float("nan")),
                "upstream_gauge": m.get("kipside_upstream_connections", float("nan")),
                "node_listeners": float(len(node_ports)),
            }
            for s in socks:
                s.close()
            socks.clear()
    except (HarnessError, OSError) as exc:
        run.error = f"{type(exc).__name__}: {exc}" if isinstance(exc, OSError) else str(exc)
    finally:
        for s in socks:
            s.close()
    if stack is not None and stack.proxy is not None:
        run.log_problems = stack.proxy.log_problems()
    return run


def raise_fd_limit(needed: int) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE (kipside and the workers inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


# --------------------------------------------------------------------------- reporting


def _n(v: float, digits: int = 0) -> str:
    if v != v:  # NaN
        return "-"
    return f"{v:,.{digits}f}"


def offered(run: ProduceRun) -> float:
    return run.rate * run.clients


def overloaded(run: ProduceRun) -> bool:
    """The path did not keep up: records queued (in the clients or the proxy)."""
    m = run.metrics
    return m["msgs_per_s"] < OVERLOAD_SHARE * offered(run) or m["p50_ms"] > OVERLOAD_P50_MS


def _context(on: ProduceRun, direct: ProduceRun | None) -> str:
    """Latency next to direct's, and whether kipside kept up, for a target's detail."""
    m = on.metrics
    text = f"; delivery p50 / p99 {m['p50_ms']:.2f} / {m['p99_ms']:.2f} ms"
    if direct is not None:
        d = direct.metrics
        text += f" vs direct {d['p50_ms']:.2f} / {d['p99_ms']:.2f} ms"
    if overloaded(on):
        text += (
            f". **kipside was overloaded here** ({_n(m['msgs_per_s'])} of {_n(offered(on))} "
            "msgs/s delivered): the batching comes from requests queueing behind a machine "
            "that has no CPU to spare, not from headroom"
        )
    return text


PRODUCE_HEADERS = (
    "offered msgs/s",
    "configuration",
    "client Produce reqs",
    "upstream Produce reqs",
    "client / upstream",
    "msgs per upstream req",
    "delivered msgs/s",
    "p50 / p99 ms",
    "Tansu conns",
)
CPU_HEADERS = (
    "offered msgs/s",
    "configuration",
    "Tansu CPU s",
    "Tansu CPU s / M msgs",
    "direct / this",
    "kipside CPU s",
    "kipside CPU s / M msgs",
    "Tansu + kipside CPU s / M msgs",
    "clients' CPU s",
    "other load (cores)",
)
IDLE_HEADERS = (
    "configuration",
    "idle clients",
    "kipside client conns",
    "Tansu conns",
    "kipside upstream conns",
    "kipside RSS MB (before -> with clients)",
    "open time s",
)


def _direct_for(runs: list[ProduceRun], rate: float) -> ProduceRun | None:
    return next(
        (r for r in runs if r.cfg.key == "direct" and r.rate == rate and r.error is None), None
    )


def produce_rows(runs: list[ProduceRun]) -> list[list[str]]:
    rows: list[list[str]] = []
    for r in runs:
        lead = [_n(offered(r)), r.cfg.label]
        if r.error is not None:
            rows.append([*lead, "failed", *["-"] * (len(PRODUCE_HEADERS) - 3)])
            continue
        m = r.metrics
        client = _n(m["client_reqs"])
        if r.cfg.path == "kipside":
            client += f" (librdkafka: {_n(m['client_reqs_stats'])})"
        rows.append(
            [
                *lead,
                client,
                _n(m["upstream_reqs"]) + (" (= client)" if r.cfg.path == "direct" else ""),
                f"{m['ratio']:.2f}x",
                f"{m['msgs_per_upstream_req']:.1f}",
                _n(m["msgs_per_s"]) + (" (overloaded)" if overloaded(r) else ""),
                f"{m['p50_ms']:.2f} / {m['p99_ms']:.2f}",
                _n(m["broker_conns"]),
            ]
        )
    return rows


def cpu_rows(runs: list[ProduceRun]) -> list[list[str]]:
    rows: list[list[str]] = []
    for r in runs:
        lead = [_n(offered(r)), r.cfg.label]
        if r.error is not None:
            rows.append([*lead, "failed", *["-"] * (len(CPU_HEADERS) - 3)])
            continue
        m = r.metrics
        direct = _direct_for(runs, r.rate)
        vs = (
            f"{direct.metrics['broker_cpu_per_m'] / m['broker_cpu_per_m']:.2f}x"
            if direct is not None and m["broker_cpu_per_m"] > 0
            else "-"
        )
        proxy = r.cfg.path == "kipside"
        noise = f"{m['noise_cores']:.2f}" + (" (noisy)" if m["noise_cores"] > NOISE_CORES else "")
        rows.append(
            [
                *lead,
                f"{m['broker_cpu_s']:.2f}",
                f"{m['broker_cpu_per_m']:.1f}",
                vs,
                f"{m['proxy_cpu_s']:.2f}" if proxy else "-",
                f"{m['proxy_cpu_per_m']:.1f}" if proxy else "-",
                f"{m['broker_cpu_per_m'] + m['proxy_cpu_per_m']:.1f}",
                f"{m['client_cpu_s']:.2f}",
                noise,
            ]
        )
    return rows


def idle_rows(runs: list[IdleRun]) -> list[list[str]]:
    rows: list[list[str]] = []
    for r in runs:
        if r.error is not None:
            rows.append([r.label, "failed", *["-"] * (len(IDLE_HEADERS) - 2)])
            continue
        m = r.metrics
        rows.append(
            [
                r.label,
                _n(m["clients"]),
                _n(m["client_gauge"]),
                f"{_n(m['broker_conns'])} (before: {_n(m['broker_conns0'])})",
                _n(m["upstream_gauge"]),
                f"{m['rss0_mb']:.1f} -> {m['rss_mb']:.1f}",
                f"{m['open_s']:.1f}",
            ]
        )
    return rows


@dataclass
class Target:
    name: str
    status: str  # met | missed | not measured
    detail: str


def evaluate_targets(
    runs: list[ProduceRun], rates: Sequence[float], idle: IdleRun | None
) -> list[Target]:
    out: list[Target] = []
    for rate in rates:
        at = [r for r in runs if r.rate == rate]
        if not at:
            continue
        load = f"at {_n(offered(at[0]))} msgs/s offered"
        direct = _direct_for(runs, rate)
        for key in ("on", "on-linger"):
            on = next((r for r in at if r.cfg.key == key and r.error is None), None)
            if on is None and key != "on":
                continue
            label = "coalescing on" if key == "on" else "coalescing on, linger_ms 5"
            name = (
                f">= {TARGET_RATIO:g}x fewer upstream Produce requests than client requests, "
                f"{load}, {label}"
            )
            if on is None:
                out.append(
                    Target(name, "not measured", "the coalescing-on run failed or was skipped")
                )
            else:
                ratio = on.metrics["ratio"]
                out.append(
                    Target(
                        name,
                        "met" if ratio >= TARGET_RATIO else "missed",
                        f"{ratio:.2f}x ({_n(on.metrics['client_reqs'])} client vs "
                        f"{_n(on.metrics['upstream_reqs'])} upstream, coalescing on)"
                        + _context(on, direct),
                    )
                )
            name = (
                f">= {TARGET_BROKER_CPU:g}x less broker CPU per message than direct, "
                f"{load}, {label}"
            )
            if on is None or direct is None:
                out.append(
                    Target(name, "not measured", "the direct or coalescing-on run is missing")
                )
            else:
                d, c = direct.metrics["broker_cpu_per_m"], on.metrics["broker_cpu_per_m"]
                factor = d / c if c > 0 else float("inf")
                out.append(
                    Target(
                        name,
                        "met" if factor >= TARGET_BROKER_CPU else "missed",
                        f"{factor:.2f}x ({c:.1f} Tansu CPU s per million messages with coalescing "
                        f"vs {d:.1f} direct; Tansu + kipside: "
                        f"{c + on.metrics['proxy_cpu_per_m']:.1f})"
                        + (
                            ". **kipside was overloaded here** (see above)"
                            if overloaded(on)
                            else ""
                        ),
                    )
                )
    name = (
        f"idle clients: <= {TARGET_IDLE_UPSTREAM} upstream connections per broker and "
        f"< {TARGET_IDLE_RSS_MB:g} MB kipside RSS"
    )
    if idle is None or idle.error is not None:
        why = idle.error if idle is not None and idle.error is not None else "not run"
        out.append(Target(name, "not measured", why.splitlines()[0]))
    else:
        m = idle.metrics
        ok = m["broker_conns"] <= TARGET_IDLE_UPSTREAM and m["rss_mb"] < TARGET_IDLE_RSS_MB
        out.append(
            Target(
                name,
                "met" if ok else "missed",
                f"{_n(m['clients'])} idle clients: {_n(m['broker_conns'])} connection(s) to the "
                f"one broker, kipside RSS {m['rss_mb']:.1f} MB",
            )
        )
    return out


# --------------------------------------------------------------------------- chart


@dataclass
class Grouped:
    """A bar panel with groups on the x axis and one bar per series in each group.

    (_report.bar_chart draws one series per panel; this benchmark compares configurations at
    several offered loads, so it draws grouped bars in the same style.)
    """

    title: str
    ylabel: str
    groups: list[str]
    series: dict[str, list[float | None]]
    fmt: str | Callable[[float], str] = "{:.3g}"
    reference: float | None = None
    reference_label: str = ""
    log: bool = False
    hatched: list[list[bool]] | None = None
    """Per series, per group: draw the bar hatched (the run was overloaded)."""


SERIES_COLORS = ("#fcae91", "#fb6a4a", "#cb181d", "#67000d")


def grouped_chart(png: Path, panels: Sequence[Grouped], title: str, *, cols: int = 2) -> None:
    """Panels of grouped bars; the series (same in every multi-series panel) get one legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.5 * rows + 0.6), squeeze=False)
    legend: dict[str, Patch] = {}
    for ax, panel in zip(axes.flat, panels, strict=False):
        n = max(1, len(panel.series))
        width = 0.8 / n
        values_all = [v for vals in panel.series.values() for v in vals if v is not None]
        top = max([*values_all, panel.reference or 0.0, 1e-9])
        for j, (name, values) in enumerate(panel.series.items()):
            color = SERIES_COLORS[j % len(SERIES_COLORS)]
            if n > 1:
                legend.setdefault(name, Patch(facecolor=color, label=name))
            xs = [i + (j - (n - 1) / 2) * width for i in range(len(panel.groups))]
            floor = 1e-3 if panel.log else 0.0
            heights = [v if v is not None and v > floor else floor for v in values]
            bars = ax.bar(xs, heights, width * 0.92, color=color)
            for i, (bar, value) in enumerate(zip(bars, values, strict=True)):
                if panel.hatched is not None and panel.hatched[j][i]:
                    bar.set_hatch("////")
                    bar.set_edgecolor("white")
                    legend.setdefault(
                        "~overloaded",
                        Patch(
                            facecolor="#999999",
                            hatch="////",
                            edgecolor="white",
                            label="hatched: overloaded",
                        ),
                    )
                text = "-"
                if value is not None:
                    text = panel.fmt(value) if callable(panel.fmt) else panel.fmt.format(value)
                ax.annotate(
                    text,
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=6.5 if n >= 4 else 7.5,
                )
        if panel.reference is not None:
            line = ax.axhline(
                panel.reference,
                color="black",
                linestyle="--",
                linewidth=1,
                label=panel.reference_label,
            )
            if panel.reference_label:
                ax.legend(handles=[line], loc="upper left", fontsize=8, frameon=False)
        ax.set_xticks(list(range(len(panel.groups))), panel.groups, fontsize=8.5)
        ax.set_title(panel.title, fontsize=10.5)
        ax.set_ylabel(panel.ylabel)
        if panel.log:
            ax.set_yscale("log")
            lows = [v for v in values_all if v > 0]
            ax.set_ylim(min(lows, default=1.0) / 3, top * 30)
        else:
            ax.set_ylim(0, top * 1.3)
        ax.spines[["top", "right"]].set_visible(False)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    height = fig.get_figheight()
    fig.suptitle(title, fontsize=11.5, y=1 - 0.12 / height)
    if legend:
        handles = [legend[k] for k in sorted(legend, key=lambda k: k.startswith("~"))]
        fig.legend(
            handles=handles,
            loc="upper center",
            ncol=len(handles),
            fontsize=9,
            frameon=False,
            bbox_to_anchor=(0.5, 1 - 0.42 / height),
        )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / height))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _ms(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def chart(
    runs: list[ProduceRun],
    idle: list[IdleRun],
    png: Path,
    args: argparse.Namespace,
    configs: Sequence[Config],
) -> None:
    groups = [c.short for c in configs]

    def series(key: str, kipside_only: bool = False) -> dict[str, list[float | None]]:
        out: dict[str, list[float | None]] = {}
        for rate in args.rates:
            vals: list[float | None] = []
            for c in configs:
                r = next((x for x in runs if x.cfg == c and x.rate == rate), None)
                skip = r is None or r.error is not None or (kipside_only and c.path != "kipside")
                vals.append(None if skip or r is None else r.metrics[key])
            out[f"{args.clients * rate:,.0f} msgs/s offered"] = vals
        return out

    hatched = [
        [
            any(x.cfg == c and x.rate == rate and x.error is None and overloaded(x) for x in runs)
            for c in configs
        ]
        for rate in args.rates
    ]
    reduction: dict[str, list[float | None]] = {}
    for name, vals in series("broker_cpu_per_m").items():
        d = vals[0] if configs and configs[0].key == "direct" else None
        reduction[name] = [d / v if d and v else None for v in vals]

    def produce_panel(
        title: str, ylabel: str, values: dict[str, list[float | None]], fmt: Any, **kw: Any
    ) -> Grouped:
        return Grouped(title, ylabel, groups, values, fmt, hatched=hatched, **kw)

    panels = [
        produce_panel(
            "client / upstream Produce requests (log scale)",
            "ratio",
            series("ratio"),
            "{:.1f}x",
            reference=TARGET_RATIO,
            reference_label=f"target {TARGET_RATIO:g}x",
            log=True,
        ),
        produce_panel(
            "Tansu CPU per message: direct / this",
            "x less than direct",
            reduction,
            "{:.1f}x",
            reference=TARGET_BROKER_CPU,
            reference_label=f"target {TARGET_BROKER_CPU:g}x",
        ),
        produce_panel(
            "Tansu CPU s per million messages", "CPU seconds", series("broker_cpu_per_m"), "{:.0f}"
        ),
        produce_panel(
            "kipside CPU s per million messages",
            "CPU seconds",
            series("proxy_cpu_per_m", kipside_only=True),
            "{:.0f}",
        ),
        produce_panel("delivered msgs/s", "msgs/s", series("msgs_per_s"), "{:,.0f}"),
        produce_panel(
            "Tansu connections (max during run)", "connections", series("broker_conns"), "{:.0f}"
        ),
        produce_panel("delivery latency p50 (log scale)", "ms", series("p50_ms"), _ms, log=True),
        produce_panel("delivery latency p99 (log scale)", "ms", series("p99_ms"), _ms, log=True),
    ]
    good = [i for i in idle if i.error is None]
    if good:
        n = int(good[0].metrics["clients"])
        labels = [i.label.replace("kipside, ", "kipside\n").replace(" --", "\n--") for i in good]
        panels += [
            Grouped(
                f"{n} idle clients: Tansu connections (log scale)",
                "connections",
                labels,
                {f"{n} idle clients": [i.metrics["broker_conns"] for i in good]},
                "{:.0f}",
                TARGET_IDLE_UPSTREAM,
                f"target <= {TARGET_IDLE_UPSTREAM}",
                log=True,
            ),
            Grouped(
                f"{n} idle clients: kipside RSS",
                "MB",
                labels,
                {f"{n} idle clients": [i.metrics["rss_mb"] for i in good]},
                "{:.1f}",
                TARGET_IDLE_RSS_MB,
                f"target < {TARGET_IDLE_RSS_MB:g} MB",
            ),
        ]
    title = (
        f"{args.clients} producers, linger.ms=0, acks=all, {RECORD_SIZE} B records, "
        f"{args.partitions} partitions; a fresh Tansu per bar"
    )
    grouped_chart(png, panels, title, cols=2)


# --------------------------------------------------------------------------- the document


def section(
    args: argparse.Namespace,
    runs: list[ProduceRun],
    idle: list[IdleRun],
    targets: list[Target],
    png: Path,
    started: str,
    wall: float,
    load: float,
    quiet: tuple[float, float],
    fd_limit: tuple[int, int],
) -> str:
    facts = facts_markdown(command_line(), started, machine_info(), versions(haproxy=None))
    levels = ", ".join(
        f"{r:g} records/s per producer ({args.clients * r:,.0f} msgs/s offered)" for r in args.rates
    )
    lines = [
        "## Multi-batch produce: many small producers, direct vs kipside",
        "",
        "Written by `bench/coalesce.py` (issue 3). One run: every configuration measured once "
        "at each offered load, each against its own fresh in-memory Tansu, on the same machine "
        "in the same session.",
        "",
        facts.rstrip(),
        f"- Wall time {wall:.0f} s; 1-minute load average {load:.2f} when it started. Before "
        f"measuring, the script waited {quiet[0]:.0f} s for the machine to go quiet for "
        f"{QUIET_SAMPLE_S:g} s "
        f"(other processes then used {quiet[1]:.2f} cores).",
        "- kipside code: a copy of the working tree's `protocol/`, `proxy/` and `rules/` taken "
        "when the run started (so every row ran the same code), sources sha256 "
        f"`{getattr(args, 'kipside_source', '') or 'n/a'}`.",
        "",
        "Workload:",
        f"- **{args.clients} producers** (confluent-kafka, one librdkafka instance each) in "
        f"{args.processes} worker processes, one thread each; linger.ms=0, acks=all, "
        f"{RECORD_SIZE} B records without keys (librdkafka's default partitioner), one topic "
        f"with {args.partitions} partitions. Each producer sends at a steady pace for "
        f"{args.seconds:g} s; offered loads: {levels}.",
        "- **Window**: from the moment every worker has connected and warmed up to the moment "
        "all have flushed. Tansu's and kipside's CPU seconds (psutil, user + system) are taken "
        "around it, and so are kipside's `/metrics` counters `kipside_client_requests_total` and "
        '`kipside_upstream_requests_total` for `api="Produce"`. The clients\' own count '
        "(librdkafka statistics, `brokers[*].req.Produce` summed over each client's broker "
        "connections) is shown next to kipside's; for direct it is the only count (client and "
        "upstream requests are the same requests).",
        "- **Latency** is every record's delivery-report latency (librdkafka "
        "`Message.latency()`: produce() to delivery report).",
        "- **Tansu conns**: Tansu's established TCP connections on its listening port "
        "(psutil), sampled every second during the window, maximum.",
        "- **kipside configurations**: coalescing off = rule file `coalescing: {enabled: false, "
        "lanes: 2, linger_ms: 0, max_request_bytes: 1048576}`; coalescing on = the same with "
        "`enabled: true`; coalescing on, linger_ms 5 = also `linger_ms: 5` (each lane waits "
        "5 ms before each upstream request, trading latency for batching); `--one-to-one` = no "
        "rule file, every client connection gets its own broker connection. All with `--admin` "
        "for /metrics.",
        "- Clients, kipside and Tansu share the machine's CPUs. 'other load' is CPU used by "
        "processes outside this benchmark during the window (noise).",
        f"- **overloaded**: the run delivered less than {OVERLOAD_SHARE:.0%} of the offered "
        f"rate or its median delivery latency exceeded {OVERLOAD_P50_MS:g} ms (records queued).",
        "- Coalescing is natural batching: a lane sends, in one request, what queued while its "
        "previous request was in flight (linger_ms 0 adds no wait), so the ratio depends on the "
        "offered load; hence several loads.",
        "",
        "### Produce",
        "",
        markdown_table(PRODUCE_HEADERS, produce_rows(runs), "rl" + "r" * 7).rstrip(),
        "",
        markdown_table(CPU_HEADERS, cpu_rows(runs), "rl" + "r" * 8).rstrip(),
        "",
        "### Idle clients",
        "",
        f"{args.idle} raw TCP connections, each sending what a client sends when it connects "
        "(ApiVersions v3, then Metadata v12 for all topics, waiting for each answer), then "
        "idle: every other one on kipside's bootstrap listener, the rest on the node listener "
        "its Metadata answer names. Measured 2 s after the last one opened; kipside RSS is its "
        "resident set (psutil). Soft fd limit of the benchmark, inherited by kipside: "
        f"{fd_limit[0]}.",
        "",
        markdown_table(IDLE_HEADERS, idle_rows(idle)).rstrip(),
        "",
        "### Targets",
        "",
    ]
    for t in targets:
        mark = {"met": "met", "missed": "**MISSED**", "not measured": "not measured"}[t.status]
        lines.append(f"- {t.name}: {mark}: {t.detail}")
    notes: list[str] = []
    for r in runs:
        who = f"`{r.cfg.label}` at {_n(offered(r))} msgs/s"
        if r.error is not None:
            first = r.error.strip().splitlines()[0]
            notes.append(f"{who} failed: `{first[:300]}`")
            continue
        m = r.metrics
        if m["errors"]:
            notes.append(
                f"{who}: {_n(m['errors'])} delivery error(s), first: `{r.first_delivery_error}`"
            )
        if m["delivered"] < m["offered"]:
            notes.append(f"{who}: {_n(m['delivered'])} of {_n(m['offered'])} records delivered")
        if m["noise_cores"] > NOISE_CORES:
            notes.append(
                f"{who} shared the machine with other load ({m['noise_cores']:.2f} cores busy "
                "outside this benchmark): its CPU and latency numbers may be inflated."
            )
        for problem in r.log_problems[:5]:
            notes.append(f"{who}: kipside logged `{problem[:300]}`")
    repeated = [r for r in runs if r.attempts > 1]
    if repeated:
        notes.append(
            f"{len(repeated)} measurement(s) were taken again because other processes kept more "
            f"than {RETRY_NOISE_CORES} cores busy during them (only the last attempt is shown): "
            + ", ".join(f"`{r.cfg.label}` at {_n(offered(r))} msgs/s" for r in repeated)
            + "."
        )
    for i in idle:
        if i.error is not None:
            notes.append(f"idle `{i.label}` failed: `{i.error.splitlines()[0][:300]}`")
        for problem in i.log_problems[:5]:
            notes.append(f"idle `{i.label}`: kipside logged `{problem[:300]}`")
    if quiet[1] >= args.quiet_cores:
        notes.append(
            f"**The machine never went quiet** within {args.quiet_wait:g} s (other processes "
            f"used {quiet[1]:.2f} cores when the run started): numbers may be distorted; "
            "re-run on an idle machine."
        )
    if notes:
        lines += ["", "### Notes on this run", "", *(f"- {n}" for n in notes)]
    rel_png = png.relative_to(IMG_DIR.parent) if png.is_relative_to(IMG_DIR.parent) else png
    lines += ["", f"![Coalescing: requests, broker CPU, latency]({rel_png.as_posix()})"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def _progress(run: ProduceRun, seconds: float) -> None:
    head = f"{offered(run):>7,.0f} msgs/s {run.cfg.label:24s}"
    if run.attempts > 1:
        head += f" (attempt {run.attempts})"
    if run.error is not None:
        print(f"{head} FAILED\n{run.error}", file=sys.stderr)
        return
    m = run.metrics
    print(
        f"{head} ratio {m['ratio']:5.2f}x  Tansu CPU/M {m['broker_cpu_per_m']:6.1f}"
        f"  {m['msgs_per_s']:7,.0f} msgs/s  p50/p99 {m['p50_ms']:.2f}/{m['p99_ms']:.2f} ms"
        f"  other load {m['noise_cores']:.2f} cores ({seconds:.0f} s)",
        file=sys.stderr,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--clients", type=int, default=64, help="producers in all")
    ap.add_argument("--processes", type=int, default=8, help="worker processes for them")
    ap.add_argument(
        "--rates",
        default=DEFAULT_RATES,
        help="comma-separated records/s per producer; every configuration runs at each",
    )
    ap.add_argument("--seconds", type=float, default=6.0, help="paced phase per measurement")
    ap.add_argument("--partitions", type=int, default=128)
    ap.add_argument(
        "--configs",
        default=",".join(CONFIG_KEYS),
        help=f"comma-separated subset of {','.join(CONFIG_KEYS)}",
    )
    ap.add_argument("--idle", type=int, default=1000, help="idle client connections (0: skip)")
    ap.add_argument(
        "--no-idle-one-to-one",
        action="store_true",
        help="skip holding the idle connections through kipside --one-to-one (the contrast)",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=120.0,
        help="before measuring, wait up to this many seconds for the machine to be idle",
    )
    ap.add_argument("--quiet-cores", type=float, default=0.3, help="'idle' means below this")
    ap.add_argument(
        "--quiet-between",
        type=float,
        default=5.0,
        help="before each measurement, wait up to this many seconds for quiet",
    )
    ap.add_argument(
        "--noisy-retries",
        type=int,
        default=1,
        help=f"measure a run again (up to this many times) if other processes used more than "
        f"{RETRY_NOISE_CORES} cores during it",
    )
    ap.add_argument(
        "--retry-budget",
        type=float,
        default=200.0,
        help="no more noisy-run retries once the measurements have run this many seconds",
    )
    ap.add_argument("--no-doc", action="store_true", help="print only; leave docs/ alone")
    ap.add_argument("--png", type=Path, default=IMG_DIR / "coalesce.png")
    args = ap.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(args.configs) - set(CONFIG_KEYS)
    if unknown:
        ap.error(f"unknown configuration(s): {', '.join(sorted(unknown))}")
    try:
        args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        ap.error("--rates takes comma-separated numbers")
    if not args.rates or any(not 0 < r <= 10_000 for r in args.rates):
        ap.error("--rates must be in (0, 10000] records/s per producer")
    if not 1 <= args.clients <= 512 or not 1 <= args.processes <= args.clients:
        ap.error("--clients must be in [1, 512] and --processes in [1, --clients]")
    if not 0 < args.seconds <= 60:
        ap.error("--seconds must be in (0, 60]")
    if not 0 <= args.idle <= 10_000:
        ap.error("--idle must be between 0 and 10000")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_cleanly_on_sigterm()
    configs = [c for c in CONFIGS if c.key in args.configs]
    snapshot_dir = Path(tempfile.mkdtemp(prefix="kipbench-coalesce-src-"))
    try:
        return _main(args, configs, snapshot_dir)
    finally:
        shutil.rmtree(snapshot_dir, ignore_errors=True)


def _main(args: argparse.Namespace, configs: list[Config], snapshot_dir: Path) -> int:
    ok, why, source = snapshot_kipside(snapshot_dir)
    args.kipside_source = source
    if not ok:
        print(f"kipside serve is not usable, measuring direct only: {why}", file=sys.stderr)
        configs = [c for c in configs if c.path != "kipside"]
    # Each idle client is one fd here and one in kipside; kipside inherits this limit.
    fd_limit = raise_fd_limit(2 * args.idle + 4 * args.clients + FD_HEADROOM)

    started = utc_now()
    load = os.getloadavg()[0]
    t_quiet = time.monotonic()
    # A sustained quiet spell, not a gap between another benchmark's runs.
    busy = wait_until_quiet(
        max_busy_cores=args.quiet_cores, timeout=args.quiet_wait, sample=QUIET_SAMPLE_S
    )
    quiet = (time.monotonic() - t_quiet, busy)
    print(f"waited {quiet[0]:.0f} s for quiet; other load {busy:.2f} cores", file=sys.stderr)
    t_start = time.monotonic()
    runs: list[ProduceRun] = []
    idle: list[IdleRun] = []
    with tempfile.TemporaryDirectory(prefix="kipbench-coalesce-") as tmp:
        for rate in args.rates:
            for cfg in configs:
                attempt = 1
                while True:
                    t = time.monotonic()
                    run = measure_produce(cfg, rate, args, Path(tmp), attempt)
                    _progress(run, time.monotonic() - t)
                    if (
                        run.error is not None
                        or run.metrics["noise_cores"] <= RETRY_NOISE_CORES
                        or attempt > args.noisy_retries
                        or time.monotonic() - t_start > args.retry_budget
                    ):
                        break
                    attempt += 1
                    print("  other load during the run: measuring it again", file=sys.stderr)
                    wait_until_quiet(
                        max_busy_cores=args.quiet_cores,
                        timeout=args.quiet_between * 3,
                        sample=QUIET_SAMPLE_S,
                    )
                runs.append(run)
        if args.idle and ok:
            variants: list[tuple[str, list[str]]] = [("kipside, coalescing on", [])]
            if not args.no_idle_one_to_one:
                variants.append(("kipside --one-to-one", ["--one-to-one"]))
            for label, flags in variants:
                logdir = Path(tmp) / f"idle-{len(idle)}"
                logdir.mkdir()
                admin_port = free_port(HOST)
                extra = [*kipside_args(CONFIGS[-1], logdir, admin_port), *flags]
                wait_until_quiet(timeout=args.quiet_between)
                i = measure_idle(label, extra, args.idle, admin_port, logdir, limit_s=90)
                idle.append(i)
                print(f"idle {label}: {i.error or i.metrics}", file=sys.stderr)
    wall = time.monotonic() - t_start

    targets = evaluate_targets(runs, args.rates, idle[0] if idle else None)
    print()
    print(text_table(PRODUCE_HEADERS, produce_rows(runs)))
    print(text_table(CPU_HEADERS, cpu_rows(runs)))
    if idle:
        print(text_table(IDLE_HEADERS, idle_rows(idle)))
    for tg in targets:
        print(f"{tg.status.upper():>12}  {tg.name}: {tg.detail}")
    for r in runs:
        for problem in r.log_problems:
            print(f"{'LOGGED':>12}  {r.cfg.label} at {_n(offered(r))} msgs/s: {problem}")
    for i in idle:
        for problem in i.log_problems:
            print(f"{'LOGGED':>12}  idle {i.label}: {problem}")
    print(f"\n{wall:.0f} s")
    if not args.no_doc:
        chart(runs, idle, args.png, args, configs)
        body = section(args, runs, idle, targets, args.png, started, wall, load, quiet, fd_limit)
        doc = write_doc_section(SECTION, body)
        print(f"wrote {doc} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
