"""`kipside lake` against a hand-written ingestion consumer, on the same data.

    .venv/bin/python bench/lake.py [--records 5000000] [--first-share 0.2] [--reps 2] [--quick]

JSON order records of about 200 B, zstd, 4 partitions per topic: --first-share of --records in
topic a, the rest in b. Baseline: confluent-kafka, json.loads, pyarrow, zstd Parquet per topic
and date, all records. kipside, in each table format (plain Parquet, `--format iceberg`):
`kipside lake --once` of topic a, then of both (bench/_steady.py). Every run's Parquet rows,
from the footers, must equal its records.
Targets: steady state at least 5x the baseline's rows per CPU-second, a whole --once run of
all the records at least 3x.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from _data_load import json_schema
from _harness import INSTALLED, REPO, HarnessError, Managed
from _measure import run_json
from _report import Table, parse_args
from _steady import Kind, TreeRun, merged, report, timed
from testkit.broker import start_tansu

LOAD = REPO / "bench" / "_data_load.py"
TOPICS = ["bench-lake-a", "bench-lake-b"]
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--records": (int, 5_000_000, "records in all"),
    "--first-share": (float, 0.2, "share in topic a"),
    "--reps": (int, 2, "runs of each kind (median reported)"),
}
LOG = "Kafka log (zstd record batches)"
BASELINE = "baseline: confluent-kafka + json.loads + pyarrow"
FORMATS = {"plain Parquet": [], "Iceberg": ["--format", "iceberg"]}


def kind(flags: list[str]) -> Kind:
    command = " ".join(["kipside lake", *flags, "--once"])
    rows = (BASELINE, command, "topic a", "both topics")
    return Kind("lake", "Lake ingestion", "M rows", "{:,.0f} rows", 1e6, rows, 5, True, 2, 3)


def parquet(out: Path, records: int) -> int:
    """Bytes of the Parquet files under `out`, once their rows equal `records`."""
    files = [
        f for f in out.rglob("*.parquet") if not any(p.endswith("_quarantine") for p in f.parts)
    ]
    if (rows := sum(pq.ParquetFile(f).metadata.num_rows for f in files)) != records:
        raise HarnessError(f"{out.name}: {rows:,} rows for {records:,} records")
    size = sum(f.stat().st_size for f in files)
    shutil.rmtree(out)
    return size


def main() -> int:
    args = parse_args(__doc__, OPTIONS, {"records": 20_000, "reps": 1})
    work = Path(tempfile.mkdtemp(prefix="kipbench-lake-"))
    (work / "orders.json").write_text(json.dumps(json_schema(), indent=2))
    in_a = int(args.records * args.first_share)
    base: list[TreeRun] = []
    runs = {f"{fmt}{part}": list[TreeRun]() for fmt in FORMATS for part in ("a", "ab")}
    with start_tansu() as broker:
        brokers, boot, values = [Managed("tansu", broker.proc)], broker.bootstrap, 0
        for topic, n, first in ((TOPICS[0], in_a, 0), (TOPICS[1], args.records - in_a, in_a)):
            job = {"bootstrap": boot, "topic": topic, "partitions": 4, "records": n}
            job["first_id"] = first
            values += run_json(LOAD, "lake-load", json.dumps(job), timeout=3600)["bytes"]
        log = json.dumps({"bootstrap": boot, "topics": TOPICS})
        sizes = {LOG: run_json(LOAD, "logsize", log, timeout=600)["bytes"]}
        for rep in range(args.reps):
            out = work / f"base{rep}"
            job = {"bootstrap": boot, "topics": TOPICS, "records": args.records, "out": str(out)}
            baseline = [sys.executable, str(LOAD), "baseline", json.dumps(job)]
            base.append(timed(brokers, "baseline", baseline))
            sizes["baseline's Parquet (zstd)"] = parquet(out, args.records)
            for fmt, flags in FORMATS.items():
                for part, topics, n in (
                    ("a", TOPICS[0], in_a),
                    ("ab", "bench-lake-.*", args.records),
                ):
                    out, ck = work / f"{part}{rep}", work / f"ck-{fmt}{part}{rep}"
                    lake = ["lake", "--bootstrap", boot, "--topics", topics, "--once", *flags]
                    lake += ["--schema", str(work / "orders.json"), "--out", str(out)]
                    lake += ["--checkpoint", str(ck)]
                    command = INSTALLED.command(*lake)
                    runs[fmt + part].append(timed(brokers, f"kipside lake ({fmt})", command))
                    sizes[f"kipside lake's Parquet (zstd, {fmt})"] = parquet(out, n)
    shutil.rmtree(work, ignore_errors=True)
    data = f"Data: {args.records:,} JSON order records ({values / args.records:.0f} B on average, "
    data += f"{values / 1e6:,.0f} MB of values), {in_a:,} in topic a; median of {args.reps} runs."
    units = (args.records / 1e6, in_a / 1e6, args.records / 1e6)
    found = merged(
        {
            fmt: report(
                kind(flags),
                {"base": base, "a": runs[fmt + "a"], "ab": runs[fmt + "ab"]},
                units,
                data,
            )
            for fmt, flags in FORMATS.items()
        }
    )
    rows = [
        [name, f"{size / 1e6:,.1f}", f"{size / sizes[LOG]:.2f}"] for name, size in sizes.items()
    ]
    found.tables.append(Table("Data", ["data", "MB", "vs Kafka log"], rows, "lrr"))
    found.publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
