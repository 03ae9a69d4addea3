"""Multi-batch produce (issue 3): many small producers direct vs through kipside, idle clients.

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
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psutil
from _chart import Panel, bar_chart
from _fleet import fleet
from _harness import HOST, HarnessError, KipsideCode, Stack, at_ref, open_stack, snapshot
from _measure import Run, attempt, repeat, sampling, wait_until_quiet
from _report import Report, Target, doc_args, facts, run_notes, table
from testkit.metrics import scrape
from testkit.ports import free_port

from kipside.pipeline.kafka.connection import BrokerConnection
from kipside.protocol import Address


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    coalescing: bool | None = None
    """None: no rule file."""
    flags: tuple[str, ...] = ()
    linger_ms: float = 0.0


CONFIGS = (
    Config("direct", "direct"),
    Config("off", "kipside, coalescing off", coalescing=False),
    Config("one-to-one", "kipside --one-to-one", flags=("--one-to-one",)),
    Config("on", "kipside, coalescing on", coalescing=True),
    Config("on-linger", "kipside, coalescing on, linger_ms 5", coalescing=True, linger_ms=5),
)
BY_KEY = {c.key: c for c in CONFIGS}
TITLE = "Multi-batch produce: many small producers, direct vs kipside"
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


def kipside_args(cfg: Config, logdir: Path, admin: int) -> list[str]:
    out = ["--admin", f"{HOST}:{admin}", *cfg.flags]
    if cfg.coalescing is not None:
        rules = logdir / "rules.yaml"
        rules.write_text(
            f"coalescing:\n  enabled: {str(cfg.coalescing).lower()}\n  lanes: 2\n"
            f"  linger_ms: {cfg.linger_ms:g}\n  max_request_bytes: 1048576\n"
        )
        out += ["--rules", str(rules)]
    return out


def broker_connections(stack: Stack) -> int:
    """Established TCP connections of the broker on its listening port."""
    conns = psutil.Process(stack.broker.pid).net_connections(kind="tcp")
    up = psutil.CONN_ESTABLISHED
    return sum(1 for c in conns if c.status == up and c.laddr and c.laddr.port == stack.broker_port)


def produce(
    stack: Stack, args: argparse.Namespace, rate: float, admin: int | None
) -> dict[str, float]:
    """One configuration at one offered load, on a running stack."""
    load = {"topic": "bench-coalesce", "rate": rate, "seconds": args.seconds}
    counts = [args.clients // args.processes] * args.processes
    for i in range(args.clients % args.processes):
        counts[i] += 1
    conns = [broker_connections(stack)]
    with sampling(1.0, lambda: conns.append(broker_connections(stack))):
        m, _ = fleet(
            stack,
            {**load, "client_prefix": "bench-coalesce"},
            counts,
            partitions=args.partitions,
            admin=admin,
        )
    slow = m["msgs_per_s"] < OVERLOAD_SHARE * rate * args.clients or m["p50_ms"] > OVERLOAD_P50_MS
    return {**m, "broker_conns": float(max(conns)), "overloaded": float(slow)}


API_VERSIONS_V3 = b"\x0ekipside-bench\x040.1\x00"  # client name and version, no tags
METADATA_V12 = b"\x00\x00\x00\x00"  # all topics, no auto-creation, no authorized ops, no tags


def connect(host: str, port: int, client_id: str) -> tuple[BrokerConnection, Any]:
    """A connection that sends what a client sends when it connects: ApiVersions, Metadata;
    and the Metadata answer."""
    conn = BrokerConnection(
        Address(host, port), client_id=client_id, connect_timeout=10, request_timeout=10
    )
    conn.request(18, 3, API_VERSIONS_V3)
    return conn, conn.request(3, 12, METADATA_V12).decode()


def idle(stack: Stack, count: int, admin: int) -> dict[str, float]:
    """`count` connections that handshake and stay, alternately on the bootstrap and the node
    listener; kipside's memory and the broker's connections 2 s after the last opened."""
    assert stack.proxy is not None
    time.sleep(0.5)
    rss0, conns0, t0 = stack.proxy.rss_bytes(), broker_connections(stack), time.monotonic()
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
        m = scrape(admin)
        out = {"clients": float(len(conns)), "open_s": opened, "rss0_mb": rss0 / 1e6}
        out |= {"rss_mb": stack.proxy.rss_bytes() / 1e6, "broker_conns0": float(conns0)}
        out |= {"broker_conns": float(broker_connections(stack))}
        out |= {"client_gauge": m.value("kipside_client_connections", float("nan"))}
        out |= {"upstream_gauge": m.value("kipside_upstream_connections", float("nan"))}
        return out
    finally:
        for c in conns:
            c.close()


def measure(case: str, rep: int, args: argparse.Namespace, code: KipsideCode) -> Run:
    """Case "RATE KEY" (produce) or "idle KEY" on a fresh stack."""
    what, key = case.split()
    cfg, logdir = BY_KEY[key], Path(tempfile.mkdtemp(prefix=f"{rep}-", dir=args.tmp))
    admin = free_port() if key != "direct" else None
    extra = kipside_args(cfg, logdir, admin) if admin else []
    run = Run(case, rep)
    try:
        with open_stack(
            "kipside" if admin else "direct", logdir, kipside_args=extra, code=code
        ) as stack:
            if what == "idle" and admin:
                attempt(run, partial(idle, stack, args.idle, admin))
            else:
                attempt(run, partial(produce, stack, args, float(what), admin))
            run.problems = stack.proxy.problems() if stack.proxy else []
    except HarnessError as exc:
        run.error = str(exc)
    return run


def name(case: str, args: argparse.Namespace) -> str:
    what, key = case.split()
    load = "idle" if what == "idle" else f"{float(what) * args.clients:,.0f} msgs/s"
    return f"{load}, {BY_KEY[key].label}"


def targets(args: argparse.Namespace, found: dict[str, dict[str, float]]) -> list[Target]:
    out = []
    for rate, key in [(r, k) for r in args.rates for k in ("on", "on-linger")]:
        m, d = found.get(f"{rate:g} {key}"), found.get(f"{rate:g} direct")
        where = f"at {rate * args.clients:,.0f} msgs/s offered, {BY_KEY[key].label}"
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
    m = found.get("idle on")
    name = f"idle clients: <= {TARGET_IDLE_UPSTREAM} upstream connections per broker and "
    name += f"< {TARGET_IDLE_RSS_MB:g} MB kipside RSS"
    if not m:
        return [*out, Target(name, None, "not measured")]
    ok = m["broker_conns"] <= TARGET_IDLE_UPSTREAM and m["rss_mb"] < TARGET_IDLE_RSS_MB
    detail = (
        "{clients:,.0f} idle clients: {broker_conns:.0f} broker connection(s), RSS {rss_mb:.1f} MB"
    )
    return [*out, Target(name, ok, detail.format(**m))]


def chart(png: Path, args: argparse.Namespace, found: dict[str, dict[str, float]]) -> None:
    configs = [BY_KEY[k] for k in args.configs]
    labels = [c.label.replace("kipside, ", "kipside\n").replace(", ", "\n") for c in configs]
    hatched = [
        [bool(found.get(f"{r:g} {c.key}", {}).get("overloaded")) for c in configs]
        for r in args.rates
    ]

    def panel(title: str, key: str, fmt: str, ref: float | None = None, log: bool = False) -> Panel:
        series: dict[str, list[float | None]] = {
            f"{r * args.clients:,.0f} msgs/s offered": [
                found.get(f"{r:g} {c.key}", {}).get(key) for c in configs
            ]
            for r in args.rates
        }
        line = f"target {ref:g}" if ref is not None else ""
        return Panel(title, "", labels, series, fmt, ref, line, log=log, hatched=hatched)

    panels = [
        panel(
            "client / upstream Produce requests (log scale)", "ratio", "{:.1f}x", TARGET_RATIO, True
        ),
        panel(
            "Tansu CPU per message: direct / this", "broker_vs_direct", "{:.1f}x", TARGET_BROKER_CPU
        ),
        panel("Tansu CPU s per million messages", "broker_cpu_per_m", "{:.0f}"),
        panel("kipside CPU s per million messages", "proxy_cpu_per_m", "{:.0f}"),
        panel("delivered msgs/s", "msgs_per_s", "{:,.0f}"),
        panel("Tansu connections (max during run)", "broker_conns", "{:.0f}"),
        panel("delivery latency p50 ms (log scale)", "p50_ms", "{:.3g}", log=True),
        panel("delivery latency p99 ms (log scale)", "p99_ms", "{:.3g}", log=True),
    ]
    title = f"{args.clients} producers, linger.ms=0, acks=all, 100 B records, "
    title += f"{args.partitions} partitions"
    bar_chart(png, panels, title)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # kipside inherits it: 2 fds a client
    want = 2 * args.idle + 4 * args.clients + 512
    if soft < want:
        resource.setrlimit(
            resource.RLIMIT_NOFILE,
            (want if hard == resource.RLIM_INFINITY else min(hard, want), hard),
        )
    busy = wait_until_quiet(0.3, args.quiet_wait, sample=3.0)
    cases = [f"{r:g} {c}" for r in args.rates for c in args.configs]
    cases += ["idle on", "idle one-to-one"][: 0 if not args.idle else 2 - args.no_idle_one_to_one]
    with tempfile.TemporaryDirectory(prefix="kipbench-coalesce-") as tmp:
        ref, where = args.baseline_ref, Path(tmp) / "code"
        args.tmp, code = tmp, at_ref(ref, where) if ref else snapshot(where)
        how = partial(measure, args=args, code=code)
        runs = repeat(cases, 1, how, noisy=NOISY, budget=200, quiet_wait=5)
    found = {r.case: r.metrics for r in runs if r.ok}
    for case, m in found.items():
        d = found.get(f"{case.split()[0]} direct", {}).get("broker_cpu_per_m", NAN)
        m["broker_vs_direct"] = d / m["broker_cpu_per_m"] if m.get("broker_cpu_per_m") else NAN
    names = {name(c, args): found.get(c) for c in cases}
    produce_names = [name(c, args) for c in cases if not c.startswith("idle")]
    idle_names = [name(c, args) for c in cases if c.startswith("idle")]
    quiet = f"Waited up to {args.quiet_wait:g} s for a quiet machine: other load {busy:.2f} cores."
    first = "offered load, configuration"
    tables = [table("Produce", produce_names, names, PRODUCE, first=first)]
    tables.append(table("CPU", produce_names, names, CPU, first=first))
    tables.append(table("Idle clients", idle_names, names, IDLE, first="configuration"))
    drawn = ("Coalescing: requests, broker CPU, latency", partial(chart, args=args, found=found))
    fx, found_targets = facts(f"kipside code: {code.label}", quiet), targets(args, found)
    Report("coalesce", TITLE, fx, tables, found_targets, run_notes(runs, NOISY), drawn).publish(
        args
    )
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--clients", type=int, default=64, help="producers in all")
    ap.add_argument("--processes", type=int, default=8, help="worker processes for them")
    ap.add_argument(
        "--rates", default="10,25,40,50", help="records/s per producer, comma-separated"
    )
    ap.add_argument("--seconds", type=float, default=6.0, help="paced phase per measurement")
    ap.add_argument("--partitions", type=int, default=128)
    ap.add_argument("--configs", default=",".join(BY_KEY), help="a comma-separated subset")
    ap.add_argument("--idle", type=int, default=1000, help="idle client connections (0: none)")
    ap.add_argument(
        "--no-idle-one-to-one", action="store_true", help="idle clients: not --one-to-one"
    )
    ap.add_argument(
        "--quiet-wait", type=float, default=120.0, help="first wait this long for quiet"
    )
    ap.add_argument("--baseline-ref", help="run kipside as of this git ref, not the working tree")
    ap.add_argument("--quick", action="store_true", help="a smoke test: little of everything")
    doc_args(ap)
    args = ap.parse_args(argv)
    args.configs, args.rates = args.configs.split(","), [float(r) for r in args.rates.split(",")]
    if set(args.configs) - set(BY_KEY) or not 1 <= args.processes <= args.clients <= 512:
        ap.error(f"--configs: choose from {','.join(BY_KEY)}; 1 <= --processes <= --clients <= 512")
    if args.quick:
        args.clients, args.processes, args.rates, args.seconds, args.idle = 8, 2, [10.0], 1.0, 20
        args.partitions, args.quiet_wait = 8, 1.0
    return args


if __name__ == "__main__":
    sys.exit(main())
