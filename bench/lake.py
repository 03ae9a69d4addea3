"""`kipside lake` against a hand-written ingestion consumer, on the same data.

    .venv/bin/python bench/lake.py [--records 5000000] [--first-share 0.2] [--reps 2] [--quick]

JSON order records of about 200 B, zstd, 4 partitions per topic: --first-share of --records in
topic a, the rest in b. Baseline: confluent-kafka, json.loads, pyarrow, zstd Parquet per topic
and date, all records. kipside: `kipside lake --once` of topic a, then of both
(bench/_steady.py). Every run's Parquet rows, from the footers, must equal its records.
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
from _steady import Kind, TreeRun, report, timed
from testkit.broker import start_tansu

LOAD = REPO / "bench" / "_data_load.py"
TOPICS = ["bench-lake-a", "bench-lake-b"]
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--records": (int, 5_000_000, "records in all"),
    "--first-share": (float, 0.2, "share in topic a"),
    "--reps": (int, 2, "runs of each kind (median reported)"),
}
LOG = "Kafka log (zstd record batches)"
ROWS = ("baseline: confluent-kafka + json.loads + pyarrow", "kipside lake --once", "topic a")
KIND = Kind(
    "lake",
    "Lake ingestion",
    "M rows",
    "{:,.0f} rows",
    1e6,
    (*ROWS, "both topics"),
    3,
    True,
    2,
)


def parquet(out: Path, records: int) -> int:
    """Bytes of the Parquet files under `out`, once their rows equal `records`."""
    files = [f for f in out.rglob("*.parquet") if "_quarantine" not in f.parts]
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
    runs: dict[str, list[TreeRun]] = {"base": [], "a": [], "ab": []}
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
            runs["base"].append(timed(brokers, "baseline", baseline))
            sizes["baseline's Parquet (zstd)"] = parquet(out, args.records)
            for name, topics, n in (("a", TOPICS[0], in_a), ("ab", "bench-lake-.*", args.records)):
                out, ck = work / f"{name}{rep}", work / f"ck-{name}{rep}"
                lake = ["lake", "--bootstrap", boot, "--topics", topics, "--once"]
                lake += ["--schema", str(work / "orders.json"), "--out", str(out)]
                lake += ["--checkpoint", str(ck)]
                runs[name].append(timed(brokers, "kipside lake", INSTALLED.command(*lake)))
                sizes["kipside lake's Parquet (zstd)"] = parquet(out, n)
    shutil.rmtree(work, ignore_errors=True)
    data = f"Data: {args.records:,} JSON order records ({values / args.records:.0f} B on average, "
    data += f"{values / 1e6:,.0f} MB of values), {in_a:,} in topic a; median of {args.reps} runs."
    found = report(KIND, runs, (args.records / 1e6, in_a / 1e6, args.records / 1e6), data)
    rows = [
        [name, f"{size / 1e6:,.1f}", f"{size / sizes[LOG]:.2f}"] for name, size in sizes.items()
    ]
    found.tables.append(Table("Data", ["data", "MB", "vs Kafka log"], rows, "lrr"))
    found.publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
