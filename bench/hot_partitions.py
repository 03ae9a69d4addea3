"""Produce scheduling: latency against broker requests, direct vs kipside, where producers crowd.

    .venv/bin/python bench/hot_partitions.py [--repeats 3] [--seconds 8] [--workloads hot,open]
        [--paths direct,kipside,before] [--baseline-refs REF,...] [--quick]

hot: 32 idempotent confluent-kafka producers (linger.ms=5, acks=all), each a steady 40 msgs/s,
all to one topic of 4 partitions. open: 64 producers (linger.ms=0, acks=all), 1,600 msgs/s in
all, open loop, to 16 partitions. Each path on a fresh Tansu, the cases interleaved; kipside@REF
runs an earlier version (the path name "before" stands for every --baseline-refs).
Delivery latency is librdkafka's (produce() to the delivery report); broker Produce requests are
the producers' own count direct, kipside's upstream count through it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from _chart import Points
from _harness import INSTALLED, at_ref, open_stack, snapshot
from _measure import fleet
from _report import Compare, Compared, Target, listed, parse_args

WORKLOADS: dict[str, dict[str, Any]] = {
    "hot": {
        "producers": 32,
        "processes": 8,
        "partitions": 4,
        "load": {"mode": "paced", "rate": 40.0, "linger_ms": 5},
        "client": {"enable.idempotence": True, "acks": "all"},
    },
    "open": {
        "producers": 64,
        "processes": 8,
        "partitions": 16,
        "load": {"mode": "paced", "rate": 25.0, "linger_ms": 0},
        "client": {"acks": "all"},
    },
}
PATHS = ["direct", "kipside", "before"]
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--seconds": (float, 8.0, "paced seconds per run"),
    "--repeats": (int, 3, "repetitions (median reported)"),
    "--workloads": (listed(str, list(WORKLOADS)), list(WORKLOADS), "a comma-separated subset"),
    "--paths": (listed(str, PATHS), PATHS, "a comma-separated subset"),
    "--baseline-refs": (listed(str), [], "git refs of earlier kipside versions"),
}
QUICK = {"repeats": 1, "seconds": 2.0}
COLUMNS = [
    ("delivered msgs/s", "{msgs_per_s:,.0f}"),
    ("p50 / p99 ms", "{p50_ms:.2f} / {p99_ms:.2f}"),
    ("p50 vs direct", "{p50_ms_add:+.2f} ms"),
    ("broker Produce requests", "{upstream_reqs:,.0f}"),
    ("client Produce requests", "{client_reqs:,.0f}"),
    ("messages per broker request", "{msgs_per_upstream_req:.2f}"),
    ("Tansu CPU s / M msgs", "{broker_cpu_per_m:.1f}"),
    ("kipside CPU s / M msgs", "{proxy_cpu_per_m:.1f}"),
]
TARGETS = [
    Compare("hot: p50 <= direct + 2 ms", "p50_ms", "hot direct", 2.0, False, True, "hot kipside"),
    Compare("hot: fewer broker requests than direct", "upstream_reqs", "hot direct", 1.0, False,
            case="hot kipside"),
    Compare("open: p99 <= direct's", "p99_ms", "open direct", 1.0, False, case="open kipside"),
    Compare("open: >= 3x fewer broker requests", "upstream_reqs", "open direct", 1 / 3, False,
            case="open kipside"),
    Compare("open: broker CPU per message <= 0.5x direct's", "broker_cpu_per_m", "open direct",
            0.5, False, case="open kipside"),
]  # fmt: skip
BENCH = Compared(
    "hot-partitions",
    "Produce scheduling: latency against broker requests where producers crowd",
    {"hot (median of {reps})": COLUMNS, "open (median of {reps})": COLUMNS},
    "direct",
    ["p50_ms"],
    TARGETS,
    grouped=True,
)


def chart(med: dict[str, dict[str, float] | None], workloads: list[str]) -> list[Points]:
    """Per workload, each path's delivery p50 and p99 against its broker Produce requests."""
    panels = []
    for name in workloads:
        found = {
            case.removeprefix(f"{name} "): m
            for case, m in med.items()
            if case.startswith(f"{name} ") and m
        }
        pairs = {
            path: [(m["upstream_reqs"], m["p50_ms"]), (m["upstream_reqs"], m["p99_ms"])]
            for path, m in found.items()
        }
        title = f"{name}: delivery latency against broker Produce requests"
        markers = [("o", "p50"), ("^", "p99")]
        panels.append(Points(title, pairs, markers, "broker Produce requests", "delivery ms"))
    return panels


def workload(name: str, path: str, args: argparse.Namespace, logdir: Path) -> dict[str, float]:
    spec = WORKLOADS[name]
    load = {**spec["load"], "seconds": args.seconds, "topic": f"bench-{name}"}
    load |= {"client_prefix": f"bench-{name}", "client": spec["client"]}
    per, extra = divmod(spec["producers"], spec["processes"])
    counts = [per + (i < extra) for i in range(spec["processes"])]
    code = args.codes.get(path, INSTALLED)
    kind = "direct" if path == "direct" else path
    with open_stack(kind, logdir, code=code, admin=kind != "direct") as stack:
        m, _ = fleet(stack, load, counts, partitions=spec["partitions"])
    return m


def hot_p99(med: dict[str, dict[str, float] | None]) -> Target:
    """hot: kipside's delivery p99 at most 1.5x direct's plus 5 ms."""
    name = "hot: p99 <= 1.5x direct + 5 ms"
    ours, direct = med.get("hot kipside"), med.get("hot direct")
    if not ours or not direct:
        return Target(name, None, "hot kipside or hot direct has no result")
    bound = 1.5 * direct["p99_ms"] + 5.0
    return Target(name, ours["p99_ms"] <= bound, f"{ours['p99_ms']:.2f} vs {bound:.2f} ms")


def expand(paths: list[str], refs: list[str]) -> list[str]:
    return [q for p in paths for q in ([f"kipside@{r}" for r in refs] if p == "before" else [p])]


def main() -> int:
    args = parse_args(__doc__, OPTIONS, QUICK)
    with tempfile.TemporaryDirectory(prefix="kipbench-hot-") as tmp:
        sources = {"kipside": partial(snapshot, Path(tmp) / "now")}
        for i, ref in enumerate(args.baseline_refs):
            sources[f"kipside@{ref}"] = partial(at_ref, ref, Path(tmp) / f"ref{i}")
        paths = expand(args.paths, args.baseline_refs)
        args.codes = {p: make() for p, make in sources.items() if p in paths}
        cases = {f"{w} {p}": partial(workload, w, p, args) for w in args.workloads for p in paths}
        runs, med = BENCH.run(args, cases)
        code = {p: c.label for p, c in args.codes.items()}
        report = BENCH.report(args, runs, med, code=code, targets=[hot_p99(med)])
        title = f"Delivery latency against broker requests (median of {args.repeats})"
        report.points = (title, chart(med, args.workloads))
        report.publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
