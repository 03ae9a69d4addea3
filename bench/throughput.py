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
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from _chart import Bars
from _harness import open_stack
from _measure import fleet, worker
from _report import Compare, Compared, listed, parse_args

PATHS = ["direct", "kipside", "tansu-proxy", "haproxy"]
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--messages": (int, 2_000_000, "records per producer run"),
    "--seconds": (float, 8.0, "cap on producer and consumer runs"),
    "--repeats": (int, 3, "repetitions per path (median)"),
    "--partitions": (int, 4, "partitions per topic"),
    "--probe-messages": (int, 2000, "records of the latency probe"),
    "--probe-rate": (float, 1000, "the probe's records/s"),
    "--paths": (listed(str, PATHS), PATHS, "a comma-separated subset"),
}
QUICK = {"repeats": 1, "seconds": 1.0, "messages": 20_000, "probe_messages": 100}
NOISY, RATIO, LATENCY_BUDGET_MS = 0.1, 0.9, 0.5


def workloads(
    path: str, args: argparse.Namespace, extra: Sequence[str], logdir: Path, **options: Any
) -> dict[str, float]:
    """The probe, the producer and the consumer on a fresh stack of `path` (more of open_stack's
    options in `options`): their numbers."""
    with open_stack(path, logdir, kipside_args=extra, **options) as stack:
        load, parts = {"client_prefix": "bench-throughput"}, args.partitions
        paced = {"topic": "bench-probe", "mode": "paced", "rate": args.probe_rate}
        paced["seconds"] = args.probe_messages / args.probe_rate
        probe, _ = fleet(stack, {**load, **paced}, [1], partitions=parts)
        flood = {"topic": "bench-throughput", "mode": "flood", "messages": args.messages}
        flood |= {"seconds": args.seconds, "linger_ms": 5}
        prod, _ = fleet(stack, {**load, **flood}, [1], partitions=parts)
        read = {"bootstrap": stack.bootstrap, "topic": "bench-throughput", "seconds": args.seconds}
        cons, window = worker(stack, "consume", {**read, "messages": prod["delivered"]})
    proxy, broker = window.proxy_broker()
    walls = (probe["wall_s"], prod["wall_s"], window.wall_s)
    busy = probe["noise_cores"] * walls[0] + prod["noise_cores"] * walls[1]
    found = {f"prod_{k}": v for k, v in prod.items()} | {f"probe_{k}": v for k, v in probe.items()}
    found |= {f"cons_{k}": float(v) for k, v in cons.items()}
    found |= {"cons_proxy_cpu_s": proxy, "cons_broker_cpu_s": broker}
    proxy_s = prod["proxy_cpu_s"] + proxy
    found["proxy_us_msg"] = proxy_s / (prod["delivered"] + cons["messages"]) * 1e6
    found["noise_cores"] = (busy + window.noise_cores() * walls[2]) / sum(walls)
    return found


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
    ("messages", "{prod_delivered:,.0f}"),
    ("proxy CPU s produce / consume", "{prod_proxy_cpu_s:.2f} / {cons_proxy_cpu_s:.2f}"),
    ("proxy CPU us/msg", "{proxy_us_msg:.2f}"),
    ("proxy CPU us/request (probe)", "{probe_proxy_cpu_per_m:.0f}"),
    ("Tansu CPU s produce / consume", "{prod_broker_cpu_s:.2f} / {cons_broker_cpu_s:.2f}"),
    ("client CPU s produce / consume", "{prod_cpu_s:.2f} / {cons_cpu_s:.2f}"),
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


BENCH = Compared(
    "throughput",
    "Throughput and latency: direct vs kipside vs tansu proxy vs haproxy",
    {"Results (median of {reps})": RESULTS, "CPU": CPU},
    "direct",
    ["prod_msgs_per_s", "cons_msgs_per_s", "probe_p50_ms"],
    TARGETS,
    CHART,
    "kipside throughput benchmark (median of {reps}, loopback)",
    noisy=NOISY,
    retries=2,
    budget=150,
    tools=["haproxy"],
)


def main() -> int:
    args = parse_args(__doc__, OPTIONS, QUICK)
    runs, med = BENCH.run(args, {path: partial(workloads, path, args, ()) for path in args.paths})
    stopped = [r for r in runs if r.metrics.get("prod_capped") or r.metrics.get("cons_capped")]
    capped = f"{len(stopped)} run(s) stopped at bench/throughput.py's --seconds, before all "
    capped += "records."
    BENCH.report(args, runs, med, notes=[capped] if stopped else []).publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
