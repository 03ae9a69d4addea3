"""Throughput and latency of one Kafka client: direct, through kipside, tansu proxy, haproxy.

    .venv/bin/python bench/throughput.py [--seconds 8] [--messages 2000000] [--repeats 3]
                                         [--paths direct,kipside,tansu-proxy,haproxy] [--quick]

Per path and repetition a fresh Tansu (and proxy) and three confluent-kafka workloads, each in
its own process: a paced latency probe, a saturated producer, a consumer reading it all back.
docs/performance.md ("Throughput and latency") says what each measures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from _chart import Bars, bar_chart
from _harness import Stack, open_stack
from _measure import Run, attempt, medians, repeat, worker
from _report import Compare, Report, doc_args, facts, relative, run_notes, table

PATHS = ("direct", "kipside", "tansu-proxy", "haproxy")
SIZE = 100
TITLE = "Throughput and latency: direct vs kipside vs tansu proxy vs haproxy"
# librdkafka pauses fetching for fetch.queue.backoff.ms (default 1000 ms) whenever its queue is
# full, so by default the *faster* path would measure slower. Back off briefly instead.
CONSUMER_CONFIG = {"fetch.queue.backoff.ms": 5}
LATENCY_BUDGET_MS = 0.5
RATIO = 0.9
NOISY = 0.1


def workloads(stack: Stack, args: argparse.Namespace) -> dict[str, float]:
    """The probe, the producer and the consumer on a running stack: their numbers."""
    boot, topic, probe_topic = stack.bootstrap, "bench-throughput", "bench-probe"
    topics = {"bootstrap": boot, "topics": [topic, probe_topic], "partitions": args.partitions}
    worker(stack, "create-topics", topics)
    common: dict[str, Any] = {"bootstrap": boot, "size": SIZE, "acks": "all"}
    paced = {"messages": args.probe_messages, "rate": args.probe_rate, "linger_ms": 0}
    probe, w0 = worker(stack, "probe", {**common, **paced, "topic": probe_topic})
    load = {"topic": topic, "messages": args.messages, "seconds": args.seconds}
    prod, w1 = worker(stack, "produce", {**common, **load, "linger_ms": 5})
    load["messages"] = prod["messages"]
    cons, w2 = worker(stack, "consume", {"bootstrap": boot, **load, "config": CONSUMER_CONFIG})
    (probe_cpu, _), (proxy_p, broker_p), (proxy_c, broker_c) = (
        w.proxy_broker(stack) for w in (w0, w1, w2)
    )
    noise = sum(w.noise_cores() * w.wall_s for w in (w0, w1, w2))
    nan = float("nan") if stack.proxy is None else 1.0  # no proxy: "-" in the tables
    out = {f"prod_{k}": prod[k] for k in ("msgs_per_s", "mb_per_s", "p50_ms", "p99_ms", "cpu_s")}
    out |= {f"cons_{k}": cons[k] for k in ("msgs_per_s", "mb_per_s", "cpu_s")}
    out |= {"probe_p50_ms": probe["p50_ms"], "probe_p99_ms": probe["p99_ms"]}
    out |= {"proxy_cpu_prod": proxy_p * nan, "proxy_cpu_cons": proxy_c * nan}
    out |= {"broker_cpu_prod": broker_p, "broker_cpu_cons": broker_c}
    out |= {"proxy_us_msg": nan * (proxy_p + proxy_c) / (prod["messages"] + cons["messages"]) * 1e6}
    out |= {"proxy_us_req": nan * probe_cpu / probe["messages"] * 1e6}
    out |= {"messages": float(prod["messages"])}
    out |= {"capped": float(prod["time_capped"] or cons["time_capped"])}
    out |= {"noise_cores": noise / (w0.wall_s + w1.wall_s + w2.wall_s)}
    return out


def measure(case: str, rep: int, args: argparse.Namespace, extra: Sequence[str] = ()) -> Run:
    """The workloads on a fresh stack; a case named `kipside...` runs kipside with `extra`."""
    logdir = Path(tempfile.mkdtemp(prefix=f"{rep}-", dir=args.logroot))
    run = Run(case, rep)
    path = "kipside" if case.startswith("kipside") else case
    try:
        with open_stack(path, logdir, kipside_args=extra) as stack:
            attempt(run, lambda: workloads(stack, args))
            run.problems = stack.proxy.problems() if stack.proxy is not None else []
    except Exception as exc:
        run.error = str(exc)
    return run


RESULTS = [
    ("produce msgs/s", "{prod_msgs_per_s:,.0f}"),
    ("produce MB/s", "{prod_mb_per_s:.1f}"),
    ("vs direct", "{prod_msgs_per_s_vs:.2f}x"),
    ("produce p50 / p99 ms (saturated)", "{prod_p50_ms:.1f} / {prod_p99_ms:.1f}"),
    ("probe p50 / p99 ms", "{probe_p50_ms:.3f} / {probe_p99_ms:.3f}"),
    ("added probe p50 ms", "{probe_p50_ms_add:+.3f}"),
    ("consume msgs/s", "{cons_msgs_per_s:,.0f}"),
    ("consume MB/s", "{cons_mb_per_s:.1f}"),
    ("vs direct", "{cons_msgs_per_s_vs:.2f}x"),
]
CPU = [
    ("messages", "{messages:,.0f}"),
    ("proxy CPU s produce / consume", "{proxy_cpu_prod:.2f} / {proxy_cpu_cons:.2f}"),
    ("proxy CPU us/msg", "{proxy_us_msg:.2f}"),
    ("proxy CPU us/request (probe)", "{proxy_us_req:.0f}"),
    ("Tansu CPU s produce / consume", "{broker_cpu_prod:.2f} / {broker_cpu_cons:.2f}"),
    ("client CPU s produce / consume", "{prod_cpu_s:.2f} / {cons_cpu_s:.2f}"),
]
EVERY = [
    ("produce msgs/s", "{prod_msgs_per_s:,.0f}"),
    ("probe p50 / p99 ms", "{probe_p50_ms:.3f} / {probe_p99_ms:.3f}"),
    ("consume msgs/s", "{cons_msgs_per_s:,.0f}"),
    ("time-capped (0/1)", "{capped:.0f}"),
    ("other load (cores)", "{noise_cores:.2f}"),
]
TARGETS = [
    Compare(f"kipside producer throughput >= {RATIO}x direct", "prod_msgs_per_s", "direct", RATIO),
    Compare(f"kipside consumer throughput >= {RATIO}x direct", "cons_msgs_per_s", "direct", RATIO),
    Compare("kipside producer throughput >= tansu proxy", "prod_msgs_per_s", "tansu-proxy", 1.0),
    Compare("kipside consumer throughput >= tansu proxy", "cons_msgs_per_s", "tansu-proxy", 1.0),
    Compare(
        f"added p50 produce latency <= {LATENCY_BUDGET_MS} ms vs direct (probe)",
        "probe_p50_ms",
        "direct",
        LATENCY_BUDGET_MS,
        at_least=False,
        diff=True,
    ),
]
LINE = f"{RATIO}x direct"
CHART = [
    Bars("Producer, msgs/s", "prod_msgs_per_s", "{:,.0f}", "direct", RATIO, 0, LINE),
    Bars("Consumer, msgs/s", "cons_msgs_per_s", "{:,.0f}", "direct", RATIO, 0, LINE),
    Bars("Probe p50 ms", "probe_p50_ms", "{:.3f}", "direct", 1, LATENCY_BUDGET_MS, "+0.5 ms"),
    Bars("Proxy CPU us per message", "proxy_us_msg", "{:.2f}"),
]


def report(args: argparse.Namespace, runs: list[Run]) -> Report:
    med = {p: medians(runs, p) for p in args.paths}
    relative(med, "direct", ["prod_msgs_per_s", "cons_msgs_per_s", "probe_p50_ms"])
    names = {f"{r.rep} {r.case} ({r.attempts})": r.metrics for r in runs}
    more = f"Repetitions: {args.repeats} per path, interleaved; median reported."
    title = f"kipside throughput benchmark (median of {args.repeats}, loopback)"
    tables = [table(f"Results (median of {args.repeats})", args.paths, med, RESULTS)]
    tables.append(table("CPU", args.paths, med, CPU))
    draw = partial(bar_chart, panels=[b.panel(med, args.paths) for b in CHART], title=title)
    chart = ("Throughput, latency and proxy CPU per path", draw)
    every = table("Every run", list(names), names, EVERY, first="rep path (attempt)")
    found, fx = [t.judge(runs, med) for t in TARGETS], facts(more, tools=["haproxy"])
    return Report("throughput", TITLE, fx, tables, found, run_notes(runs, NOISY), chart, every)


def parse_args(argv: list[str] | None = None, **defaults: Any) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--messages", type=int, default=2_000_000, help="records per producer run")
    ap.add_argument("--seconds", type=float, default=8.0, help="cap on producer and consumer runs")
    ap.add_argument("--repeats", type=int, default=3, help="repetitions per path (median)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions per topic")
    ap.add_argument("--probe-messages", type=int, default=2000)
    ap.add_argument("--probe-rate", type=float, default=1000, help="probe msgs/s")
    ap.add_argument("--paths", default=",".join(PATHS), help="a comma-separated subset")
    ap.add_argument("--quick", action="store_true", help="one short repetition: a smoke test")
    doc_args(ap)
    ap.set_defaults(**defaults)
    args = ap.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    if set(args.paths) - set(PATHS):
        ap.error(f"--paths: choose from {','.join(PATHS)}")
    if args.quick:
        args.repeats, args.seconds, args.messages, args.probe_messages = 1, 1.0, 20_000, 100
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kipbench-throughput-") as tmp:
        args.logroot = tmp
        how = partial(measure, args=args)
        runs = repeat(args.paths, args.repeats, how, noisy=NOISY, retries=2, budget=150)
    report(args, runs).publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
