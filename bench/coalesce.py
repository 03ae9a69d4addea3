"""Multi-batch produce: many small producers direct vs through kipside, idle clients.

    .venv/bin/python bench/coalesce.py [--clients 64] [--processes 8] [--rates 10,25,40,50]
        [--seconds 6] [--partitions 128] [--configs direct,off,...] [--idle 1000] [--quick]

Produce: at each offered load (records/s per producer) every configuration runs against a fresh
Tansu: --clients paced confluent-kafka producers (linger.ms=0, acks=all) in --processes
processes. Idle clients: --idle raw connections through kipside that handshake and stay.
docs/performance.md ("Multi-batch produce") says what each measures.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil
from _chart import grouped
from _harness import HarnessError, Stack, at_ref, open_stack, snapshot
from _measure import fleet, repeat, sampling, wait_until_quiet
from _report import Report, Target, facts, listed, parse_args, run_notes, table
from testkit.metrics import scrape

from kipside.pipeline.kafka.connection import BrokerConnection
from kipside.protocol import Address

CONFIGS = {  # key: (label, rule file's coalescing settings or None, flags)
    "direct": ("direct", None, []),
    "off": ("kipside, coalescing off", "enabled: false\n  linger_ms: 0", []),
    "one-to-one": ("kipside --one-to-one", None, ["--one-to-one"]),
    "on": ("kipside, coalescing on", "enabled: true\n  linger_ms: 0", []),
    "on-linger": ("kipside, coalescing on, linger_ms 5", "enabled: true\n  linger_ms: 5", []),
}
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--clients": (int, 64, "producers in all"),
    "--processes": (int, 8, "worker processes for them"),
    "--rates": (listed(float), [10.0, 25.0, 40.0, 50.0], "records/s per producer"),
    "--seconds": (float, 6.0, "paced phase per measurement"),
    "--partitions": (int, 128, "partitions of the topic"),
    "--configs": (listed(str, list(CONFIGS)), list(CONFIGS), "a comma-separated subset"),
    "--idle": (int, 1000, "idle client connections (0: none)"),
    "--no-idle-one-to-one": (bool, False, "idle clients: not --one-to-one"),
    "--quiet-wait": (float, 120.0, "first wait this long for quiet"),
    "--baseline-ref": (str, None, "run kipside as of this git ref, not the working tree"),
}
QUICK = {"clients": 8, "processes": 2, "rates": [10.0], "seconds": 1.0, "idle": 20}
QUICK |= {"partitions": 8, "quiet_wait": 1.0}
TARGET_RATIO, TARGET_BROKER_CPU, TARGET_IDLE_UPSTREAM, TARGET_IDLE_RSS_MB = 8.0, 2.0, 2, 150.0
OVERLOAD_SHARE, OVERLOAD_P50_MS, NOISY, NAN = 0.95, 100.0, 0.25, float("nan")
PRODUCE = [
    ("client Produce reqs (librdkafka's count)", "{client_reqs:,.0f} ({client_reqs_stats:,.0f})"),
    ("upstream Produce reqs", "{upstream_reqs:,.0f}"),
    ("client / upstream", "{ratio:.2f}x"),
    ("msgs per upstream req", "{msgs_per_upstream_req:.1f}"),
    ("delivered msgs/s", "{msgs_per_s:,.0f}"),
    ("overloaded (1: yes)", "{overloaded:.0f}"),
    ("p50 / p99 ms", "{p50_ms:.2f} / {p99_ms:.2f}"),
    ("Tansu conns", "{broker_conns:.0f}"),
]
CPU = [
    ("Tansu CPU s", "{broker_cpu_s:.2f}"),
    ("Tansu CPU s / M msgs", "{broker_cpu_per_m:.1f}"),
    ("direct / this", "{broker_vs_direct:.2f}x"),
    ("kipside CPU s", "{proxy_cpu_s:.2f}"),
    ("kipside CPU s / M msgs", "{proxy_cpu_per_m:.1f}"),
    ("Tansu + kipside CPU s / M msgs", "{both_cpu_per_m:.1f}"),
    ("clients' CPU s", "{cpu_s:.2f}"),
    ("other load (cores)", "{noise_cores:.2f}"),
]
IDLE = [
    ("idle clients", "{clients:,.0f}"),
    ("kipside client conns", "{client_gauge:,.0f}"),
    ("Tansu conns (before)", "{broker_conns:.0f} ({broker_conns0:.0f})"),
    ("kipside upstream conns", "{upstream_gauge:.0f}"),
    ("kipside RSS MB (before -> with clients)", "{rss0_mb:.1f} -> {rss_mb:.1f}"),
    ("open time s", "{open_s:.1f}"),
]
CHART = [  # (title, metric, format, target line, log scale)
    ("client / upstream Produce requests (log scale)", "ratio", "{:.1f}x", TARGET_RATIO, True),
    (
        "Tansu CPU per message: direct / this",
        "broker_vs_direct",
        "{:.1f}x",
        TARGET_BROKER_CPU,
        False,
    ),
    ("Tansu CPU s per million messages", "broker_cpu_per_m", "{:.0f}", None, False),
    ("kipside CPU s per million messages", "proxy_cpu_per_m", "{:.0f}", None, False),
    ("delivered msgs/s", "msgs_per_s", "{:,.0f}", None, False),
    ("Tansu connections (max during run)", "broker_conns", "{:.0f}", None, False),
    ("delivery latency p50 ms (log scale)", "p50_ms", "{:.3g}", None, True),
    ("delivery latency p99 ms (log scale)", "p99_ms", "{:.3g}", None, True),
]


def broker_connections(stack: Stack) -> int:
    """Established TCP connections of the broker on its listening port."""
    conns = psutil.Process(stack.broker.popen.pid).net_connections(kind="tcp")
    up = psutil.CONN_ESTABLISHED
    return sum(1 for c in conns if c.status == up and c.laddr and c.laddr.port == stack.broker_port)


def produce(stack: Stack, args: argparse.Namespace, rate: float) -> dict[str, float]:
    """One configuration at one offered load, on a running stack."""
    load = {"topic": "bench-coalesce", "mode": "paced", "rate": rate, "seconds": args.seconds}
    counts = [args.clients // args.processes] * args.processes
    for i in range(args.clients % args.processes):
        counts[i] += 1
    conns = [broker_connections(stack)]
    with sampling(1.0, lambda: conns.append(broker_connections(stack))):
        load["client_prefix"] = "bench-coalesce"
        m, _ = fleet(stack, load, counts, partitions=args.partitions)
    slow = m["msgs_per_s"] < OVERLOAD_SHARE * rate * args.clients or m["p50_ms"] > OVERLOAD_P50_MS
    return {**m, "broker_conns": float(max(conns)), "overloaded": float(slow)}


API_VERSIONS_V3 = b"\x0ekipside-bench\x040.1\x00"  # client name and version, no tags
METADATA_V12 = b"\x00\x00\x00\x00"  # all topics, no auto-creation, no authorized ops, no tags


def connect(host: str, port: int, client_id: str) -> tuple[BrokerConnection, Any]:
    """A connection that sends what a client sends when it connects: ApiVersions, Metadata;
    and the Metadata answer."""
    address = Address(host, port)
    conn = BrokerConnection(address, client_id=client_id, connect_timeout=10, request_timeout=10)
    conn.request(18, 3, API_VERSIONS_V3)
    return conn, conn.request(3, 12, METADATA_V12).decode()


def idle(stack: Stack, count: int) -> dict[str, float]:
    """`count` connections that handshake and stay, alternately on the bootstrap and the node
    listener; kipside's memory and the broker's connections 2 s after the last opened."""
    assert stack.proxy is not None and stack.admin is not None
    kipside = psutil.Process(stack.proxy.popen.pid)
    time.sleep(0.5)
    rss0, conns0, t0 = kipside.memory_info().rss, broker_connections(stack), time.monotonic()
    host, port = stack.bootstrap.split(":")
    first, metadata = connect(host, int(port), "bench-idle-0")
    conns = [first]
    try:
        ports = [int(port), *sorted({b.port for b in metadata.brokers})]
        for i in range(1, count):
            if time.monotonic() - t0 > 90:
                raise HarnessError(f"opened only {i} of {count} idle connections in 90 s")
            conns.append(connect(host, ports[i % len(ports)], f"bench-idle-{i}")[0])
        opened = time.monotonic() - t0
        time.sleep(2.0)  # let anything opened or closed lazily settle
        m = scrape(stack.admin)
        return {
            "clients": float(len(conns)),
            "open_s": opened,
            "rss0_mb": rss0 / 1e6,
            "rss_mb": kipside.memory_info().rss / 1e6,
            "broker_conns0": float(conns0),
            "broker_conns": float(broker_connections(stack)),
            "client_gauge": m.value("kipside_client_connections", NAN),
            "upstream_gauge": m.value("kipside_upstream_connections", NAN),
        }
    finally:
        for c in conns:
            c.close()


def measure(what: str, key: str, args: argparse.Namespace, logdir: Path) -> dict[str, float]:
    """Produce at rate `what`, or the idle clients, on a fresh stack of configuration `key`."""
    _, coalescing, flags = CONFIGS[key]
    more = "lanes: 2\n  max_request_bytes: 1048576"
    rules = f"coalescing:\n  {coalescing}\n  {more}\n" if coalescing is not None else None
    path = "kipside" if key != "direct" else "direct"
    with open_stack(path, logdir, kipside_args=flags, code=args.code, rules=rules, admin=True) as s:
        return idle(s, args.idle) if what == "idle" else produce(s, args, float(what))


def targets(args: argparse.Namespace, found: dict[str, dict[str, float]]) -> list[Target]:
    out = []
    for rate, key in [(r, k) for r in args.rates for k in ("on", "on-linger")]:
        m, d = found.get(f"{rate:g} {key}"), found.get(f"{rate:g} direct")
        where = f"at {rate * args.clients:,.0f} msgs/s offered, {CONFIGS[key][0]}"
        fewer = (
            f">= {TARGET_RATIO:g}x fewer upstream Produce requests than client requests, {where}"
        )
        less = f">= {TARGET_BROKER_CPU:g}x less broker CPU per message than direct, {where}"
        if not m or not d:
            out += [Target(fewer, None, "not measured"), Target(less, None, "not measured")]
            continue
        over = " **kipside was overloaded here**" if m["overloaded"] else ""
        requests = "{client_reqs:,.0f} client vs {upstream_reqs:,.0f} upstream".format(**m)
        out.append(
            Target(fewer, m["ratio"] >= TARGET_RATIO, f"{m['ratio']:.2f}x ({requests}){over}")
        )
        cpu = "Tansu CPU s per M msgs {broker_cpu_per_m:.1f} (Tansu + kipside {both_cpu_per_m:.1f})"
        detail = f"{cpu.format(**m)} vs {d['broker_cpu_per_m']:.1f} direct{over}"
        out.append(Target(less, m["broker_vs_direct"] >= TARGET_BROKER_CPU, detail))
    name = f"idle clients: <= {TARGET_IDLE_UPSTREAM} upstream connections per broker and "
    name += f"< {TARGET_IDLE_RSS_MB:g} MB kipside RSS"
    if not (m := found.get("idle on")):
        return [*out, Target(name, None, "not measured")]
    ok = m["broker_conns"] <= TARGET_IDLE_UPSTREAM and m["rss_mb"] < TARGET_IDLE_RSS_MB
    detail = (
        "{clients:,.0f} idle clients: {broker_conns:.0f} broker connection(s), RSS {rss_mb:.1f} MB"
    )
    return [*out, Target(name, ok, detail.format(**m))]


def main() -> int:
    args = parse_args(__doc__, OPTIONS, QUICK)
    if not 1 <= args.processes <= args.clients <= 512:
        sys.exit("1 <= --processes <= --clients <= 512")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # kipside inherits it: 2 fds a client
    want = 2 * args.idle + 4 * args.clients + 512
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard < 0 else min(hard, want), hard))
    busy = wait_until_quiet(0.3, args.quiet_wait, sample=3.0)
    cases = {
        f"{r:g} {c}": partial(measure, f"{r:g}", c, args) for r in args.rates for c in args.configs
    }
    if args.idle:
        idle_configs = ["on"] if args.no_idle_one_to_one else ["on", "one-to-one"]
        cases |= {f"idle {c}": partial(measure, "idle", c, args) for c in idle_configs}
    with tempfile.TemporaryDirectory(prefix="kipbench-coalesce-") as tmp:
        where, ref = Path(tmp) / "code", args.baseline_ref
        args.code = at_ref(ref, where) if ref else snapshot(where)
        runs = repeat(cases, 1, noisy=NOISY, budget=200, quiet_wait=5)
    found = {r.case: r.metrics for r in runs if r.ok}
    for case, m in found.items():
        d = found.get(f"{case.split()[0]} direct", {}).get("broker_cpu_per_m", NAN)
        m["broker_vs_direct"] = d / m["broker_cpu_per_m"] if m.get("broker_cpu_per_m") else NAN

    def name(case: str) -> str:
        what, key = case.split()
        load = "idle" if what == "idle" else f"{float(what) * args.clients:,.0f} msgs/s"
        return f"{load}, {CONFIGS[key][0]}"

    named = {name(c): found.get(c) for c in cases}
    produced = [name(c) for c in cases if not c.startswith("idle")]
    idled = [name(c) for c in cases if c.startswith("idle")]
    first = "offered load, configuration"
    labels = [CONFIGS[c][0] for c in args.configs]
    rates = {f"{r * args.clients:,.0f} msgs/s offered": f"{r:g}" for r in args.rates}
    series = {name: [f"{r} {c}" for c in args.configs] for name, r in rates.items()}
    panels = [
        grouped(title, found, key, labels, series, fmt, ref, f"target {ref:g}" if ref else "", log)
        for title, key, fmt, ref, log in CHART
    ]
    chart = f"{args.clients} producers, linger.ms=0, acks=all, 100 B records, "
    chart += f"{args.partitions} partitions"
    quiet = f"Waited up to {args.quiet_wait:g} s for a quiet machine: other load {busy:.2f} cores."
    Report(
        "coalesce",
        "Multi-batch produce: many small producers, direct vs kipside",
        facts(f"kipside code: {args.code.label}", quiet),
        [
            table("Produce", produced, named, PRODUCE, first=first),
            table("CPU", produced, named, CPU, first=first),
            table("Idle clients", idled, named, IDLE, first="configuration"),
        ],
        targets(args, found),
        run_notes(runs, NOISY),
        (chart, panels),
    ).publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
