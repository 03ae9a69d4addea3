"""The shallow mirror (`kipside mirror`, issue 9) against a deep mirror, on the same data.

    .venv/bin/python bench/mirror.py [--gigabytes 1.0] [--extra-gigabytes 3.0] [--reps 3] [--quick]

JSON-like 1 KiB values in a zstd and an lz4 topic: 1 GB in set a, 3 GB more in set b. Runs,
each the median of --reps: the deep mirror (consume + re-produce) of set a; `kipside mirror
--once` of set a, then of both sets. Their difference is the shallow mirror's steady state:
Spark's fixed cost is in both and cancels out. docs/performance.md ("Shallow mirror") says more.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from _chart import Panel, bar_chart
from _harness import INSTALLED, REPO, Managed
from _measure import TreeRun, run_json, timed
from _report import Report, Table, Target, doc_args, doc_of, facts, utc_now, versions
from testkit.broker import start_tansu

LOAD = REPO / "bench" / "_data_load.py"
SETS = {"a": {"bench-a-zstd": "zstd", "bench-a-lz4": "lz4"}}
SETS["b"] = {"bench-b-zstd": "zstd", "bench-b-lz4": "lz4"}
TARGET = 1 / 3
HEADERS = ["run", "wall s", "MB/s", "CPU s", "CPU s per GB", "CPU per GB vs deep", "brokers' CPU s"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--gigabytes", type=float, default=1.0, help="record values in set a")
    ap.add_argument("--extra-gigabytes", type=float, default=3.0, help="and in set b")
    ap.add_argument("--reps", type=int, default=3, help="runs of each kind (median reported)")
    ap.add_argument("--quick", action="store_true", help="a smoke test: 20 + 20 MB, one run")
    doc_args(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.gigabytes, args.extra_gigabytes, args.reps = 0.02, 0.02, 1
    started, work = utc_now(), Path(tempfile.mkdtemp(prefix="kipbench-mirror-"))
    with start_tansu() as source, start_tansu() as shallow, start_tansu() as deep_dest:
        size = {"a": args.gigabytes, "b": args.extra_gigabytes}
        loaded = {}
        for name, topics in SETS.items():
            load = {"bootstrap": source.bootstrap, "topics": topics, "partitions": 4}
            load |= {"bytes": int(size[name] * 1e9), "size": 1024}
            loaded[name] = run_json(LOAD, "mirror-load", json.dumps(load), timeout=1800)
        brokers = {
            n: Managed(n, b.proc) for n, b in (("source", source), ("s", shallow), ("d", deep_dest))
        }
        kipside = INSTALLED.command("mirror", "--source", source.bootstrap)
        runs: dict[str, list[TreeRun]] = {"deep": [], "a": [], "ab": []}
        for rep in range(args.reps):
            copy = {
                "source": source.bootstrap,
                "dest": deep_dest.bootstrap,
                "topics": SETS["a"],
                "records": loaded["a"]["records"],
            }
            deep = [sys.executable, str(LOAD), "deep", json.dumps(copy)]
            runs["deep"].append(timed([brokers["source"], brokers["d"]], "deep mirror", deep))
            for name, pattern in (("a", "bench-a-.*"), ("ab", "bench-[ab]-.*")):
                once = ["--dest", shallow.bootstrap, "--topics", pattern, "--once", "--rename"]
                once += [f"{name}{rep}.", "--checkpoint", str(work / f"ck-{name}-{rep}")]
                runs[name].append(
                    timed([brokers["source"], brokers["s"]], "kipside mirror", kipside + once, True)
                )
    report(args, {k: TreeRun.median(v) for k, v in runs.items()}, loaded, started).publish(
        doc_of(args)
    )
    return 0


def report(
    args: argparse.Namespace,
    med: dict[str, TreeRun],
    loaded: dict[str, dict[str, int]],
    started: str,
) -> Report:
    gb_a, gb_b = loaded["a"]["bytes"] / 1e9, loaded["b"]["bytes"] / 1e9
    deep, one, two = med["deep"], med["a"], med["ab"]
    steady = two.minus(one)
    deep_per_gb = deep.cpu_s / gb_a
    rows = [
        ("deep: consume + re-produce (1 GB)", deep, gb_a),
        ("shallow: kipside mirror, whole run (1 GB)", one, gb_a),
        (f"shallow: kipside mirror, whole run ({gb_a + gb_b:.0f} GB)", two, gb_a + gb_b),
        (f"shallow: steady state ({gb_a + gb_b:.0f} GB run minus 1 GB run)", steady, gb_b),
    ]
    table = [
        [
            name,
            f"{r.wall_s:.1f}",
            f"{gb * 1000 / r.wall_s:.0f}",
            f"{r.cpu_s:.1f}",
            f"{r.cpu_s / gb:.1f}",
            f"{r.cpu_s / gb / deep_per_gb:.2f}",
            f"{r.broker_cpu_s:.1f}",
        ]
        for name, r, gb in rows
    ]
    steady_x, whole_x = steady.cpu_s / gb_b / deep_per_gb, one.cpu_s / gb_a / deep_per_gb
    speed, whole_speed = (gb_b / steady.wall_s) / (gb_a / deep.wall_s), deep.wall_s / one.wall_s
    fixed = one.cpu_s - steady.cpu_s / gb_b * gb_a
    records = f"{loaded['a']['records']:,} + {loaded['b']['records']:,} records of about 1024 B"
    data = f"Data: {gb_a:.2f} GB + {gb_b:.2f} GB of JSON-like values ({records}); "
    data += f"median of {args.reps} runs each."
    targets = [
        Target(
            "steady state: at most 1/3 of the deep mirror's CPU per GB, at no less throughput",
            steady_x <= TARGET and speed >= 1,
            f"{steady_x:.2f} of its CPU per GB, at {speed:.1f}x its throughput",
        ),
        Target(
            "whole `--once` run of 1 GB, Spark's start included",
            whole_x <= TARGET and whole_speed >= 1,
            f"{whole_x:.1f}x the deep mirror's CPU and {whole_speed:.2f}x its throughput; "
            f"Spark's fixed cost about {fixed:.0f} CPU-seconds a run",
        ),
    ]
    labels = ["deep", "shallow\n1 GB run", "shallow\nwhole run", "shallow\nsteady state"]
    cpu = [float(r[4]) for r in table]
    mbs = [float(r[2]) for r in table]
    title = f"Shallow vs deep mirror (median of {args.reps} runs, loopback)"
    panels = [
        Panel(
            "CPU-seconds per GB of records (lower is better)",
            "CPU s / GB",
            labels,
            cpu,
            "{:.1f}",
            deep_per_gb * TARGET,
            "target: 1/3 of deep",
        ),
        Panel("Throughput (higher is better)", "MB/s of record values", labels, mbs, "{:.0f}"),
    ]
    return Report(
        "mirror",
        "Shallow mirror (issue 9)",
        facts(started, versions(), data),
        [Table("Runs", HEADERS, table)],
        targets,
        chart=("shallow vs deep mirror", lambda png: bar_chart(png, panels, title)),
    )


if __name__ == "__main__":
    sys.exit(main())
