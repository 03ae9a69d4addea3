"""`kipside lake` (issue 10) against a hand-written ingestion consumer, on the same data.

    .venv/bin/python bench/lake.py [--records 5000000] [--first-share 0.2] [--reps 2] [--quick]

JSON order records of about 200 B, zstd, in two topics (a share in a, the rest in b). Runs,
each the median of --reps: the baseline (confluent-kafka, json.loads, pyarrow, zstd Parquet
per topic and date) over all records; `kipside lake --once` over topic a, then both topics.
Their difference is the lake's steady state: Spark's fixed cost cancels out. Each run's Parquet
rows are counted from the files' footers and must equal the records.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from _chart import Panel, bar_chart
from _data_load import json_schema
from _harness import INSTALLED, REPO, HarnessError, Managed
from _measure import TreeRun, run_json, timed
from _report import Report, Table, Target, doc_args, doc_of, facts, utc_now, versions
from testkit.broker import start_tansu

LOAD = REPO / "bench" / "_data_load.py"
TOPICS = ("bench-lake-a", "bench-lake-b")
TARGET = 3.0
HEADERS = [
    "run",
    "rows",
    "wall s",
    "rows/s",
    "CPU s",
    "CPU s per M rows",
    "rows per CPU-s vs baseline",
    "broker CPU s",
]


def checked(run: TreeRun, out: Path, records: int) -> tuple[TreeRun, int]:
    """The run and the bytes of its Parquet files, once their rows equal the records."""
    files = [f for f in out.rglob("*.parquet") if "_quarantine" not in f.parts]
    if (rows := sum(pq.ParquetFile(f).metadata.num_rows for f in files)) != records:
        raise HarnessError(f"{out.name}: {rows:,} rows for {records:,} records")
    size = sum(f.stat().st_size for f in files)
    shutil.rmtree(out)
    return run, size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--records", type=int, default=5_000_000, help="records in all")
    ap.add_argument("--first-share", type=float, default=0.2, help="share in topic a")
    ap.add_argument("--reps", type=int, default=2, help="runs of each kind (median reported)")
    ap.add_argument("--quick", action="store_true", help="a smoke test: 20,000 records, one run")
    doc_args(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.records, args.reps = 20_000, 1
    started, work = utc_now(), Path(tempfile.mkdtemp(prefix="kipbench-lake-"))
    (work / "orders.json").write_text(json.dumps(json_schema(), indent=2))
    counts = {TOPICS[0]: int(args.records * args.first_share)}
    counts[TOPICS[1]] = args.records - counts[TOPICS[0]]
    with start_tansu() as broker:
        brokers, first, loaded = [Managed("tansu", broker.proc)], 0, {}
        for topic, n in counts.items():
            job = {
                "bootstrap": broker.bootstrap,
                "topic": topic,
                "partitions": 4,
                "records": n,
                "first_id": first,
            }
            loaded[topic], first = (
                run_json(LOAD, "lake-load", json.dumps(job), timeout=3600),
                first + n,
            )
        logsize = {"bootstrap": broker.bootstrap, "topics": list(TOPICS)}
        log = run_json(LOAD, "logsize", json.dumps(logsize), timeout=600)["bytes"]
        runs: dict[str, list[tuple[TreeRun, int]]] = {"base": [], "a": [], "ab": []}
        for rep in range(args.reps):
            out = work / f"base{rep}"
            base = {
                "bootstrap": broker.bootstrap,
                "topics": list(TOPICS),
                "records": args.records,
                "out": str(out),
            }
            run = timed(
                brokers, "baseline", [sys.executable, str(LOAD), "baseline", json.dumps(base)]
            )
            runs["base"].append(checked(run, out, args.records))
            for name, topics, n in (
                ("a", TOPICS[0], counts[TOPICS[0]]),
                ("ab", "bench-lake-.*", args.records),
            ):
                out, ck = work / f"{name}{rep}", work / f"ck-{name}{rep}"
                lake = INSTALLED.command(
                    "lake",
                    "--bootstrap",
                    broker.bootstrap,
                    "--topics",
                    topics,
                    "--once",
                    "--schema",
                    str(work / "orders.json"),
                    "--out",
                    str(out),
                    "--checkpoint",
                    str(ck),
                )
                runs[name].append(checked(timed(brokers, "kipside lake", lake, spark=True), out, n))
    shutil.rmtree(work, ignore_errors=True)
    med = {k: (TreeRun.median([r for r, _ in v]), v[0][1]) for k, v in runs.items()}
    report(args, med, counts, sum(v["bytes"] for v in loaded.values()), log, started).publish(
        doc_of(args)
    )
    return 0


def report(
    args: argparse.Namespace,
    med: dict[str, tuple[TreeRun, int]],
    counts: dict[str, int],
    values: int,
    log: int,
    started: str,
) -> Report:
    in_a, in_b = counts.values()
    (base, base_size), (one, _), (two, two_size) = med["base"], med["a"], med["ab"]
    steady = two.minus(one)
    rate = args.records / base.cpu_s
    rows = [
        ("baseline: confluent-kafka + json.loads + pyarrow", base, args.records),
        (f"kipside lake --once, topic a ({in_a / 1e6:g} M records)", one, in_a),
        (f"kipside lake --once, both topics ({args.records / 1e6:g} M)", two, args.records),
        ("kipside lake, steady state (both minus a)", steady, in_b),
    ]
    table = [
        [
            name,
            f"{n:,}",
            f"{r.wall_s:.1f}",
            f"{n / r.wall_s:,.0f}",
            f"{r.cpu_s:.1f}",
            f"{r.cpu_s / n * 1e6:.1f}",
            f"{n / r.cpu_s / rate:.2f}x",
            f"{r.broker_cpu_s:.1f}",
        ]
        for name, r, n in rows
    ]
    sizes = [
        ["Kafka log (zstd record batches)", f"{log / 1e6:,.1f}", "1.00"],
        ["baseline's Parquet (zstd)", f"{base_size / 1e6:,.1f}", f"{base_size / log:.2f}"],
        ["kipside lake's Parquet (zstd)", f"{two_size / 1e6:,.1f}", f"{two_size / log:.2f}"],
    ]
    steady_x, whole_x = in_b / steady.cpu_s / rate, args.records / two.cpu_s / rate
    fixed = one.cpu_s - steady.cpu_s / in_b * in_a
    data = f"Data: {args.records:,} JSON order records ({values / args.records:.0f} B on average, "
    data += f"{values / 1e6:,.0f} MB of values), {in_a:,} in topic a and {in_b:,} in topic b; "
    data += f"median of {args.reps} runs each."
    targets = [
        Target(
            f"at least {TARGET:g}x the baseline's rows per CPU-second in steady state",
            steady_x >= TARGET,
            f"{steady_x:.2f}x",
        ),
        Target(
            f"a whole `--once` run of {args.records / 1e6:g} M records, Spark's start included",
            whole_x >= TARGET,
            f"{whole_x:.2f}x; Spark's fixed cost about {fixed:.0f} CPU-seconds a run",
        ),
    ]
    labels = ["baseline", "kipside\ntopic a", "kipside\nboth topics", "kipside\nsteady state"]
    per_cpu = [1e6 / float(r[5]) for r in table]
    per_s = [float(r[3].replace(",", "")) for r in table]
    title = f"kipside lake vs a hand-written consumer (median of {args.reps} runs, loopback)"
    panels = [
        Panel(
            "Rows per CPU-second (higher is better)",
            "rows / CPU s",
            labels,
            per_cpu,
            "{:,.0f}",
            rate * TARGET,
            f"target: {TARGET:g}x baseline",
        ),
        Panel("Throughput (higher is better)", "rows / s", labels, per_s, "{:,.0f}"),
    ]
    return Report(
        "lake",
        "Lake ingestion (issue 10)",
        facts(started, versions(), data),
        [
            Table("Runs", HEADERS, table),
            Table("Data", ["data", "MB", "vs Kafka log"], sizes, "lrr"),
        ],
        targets,
        chart=("kipside lake vs baseline", lambda png: bar_chart(png, panels, title)),
    )


if __name__ == "__main__":
    sys.exit(main())
