"""`kipside lake` on a columnar topic against the same records as JSON, and a hand-written consumer.

    .venv/bin/python bench/lake_columnar.py [--records 1000000] [--first-share 0.2] [--reps 1]
        [--quick]

bench/lake.py's data (JSON orders of about 200 B, zstd, 4 partitions per topic, --first-share of
--records in topic a, the rest in b), written twice: as JSON, and as the carriers the sidecar
makes of the same batches (every stored batch re-encoded by kipside.protocol.ColumnarEncoder with
the lake's schema, produced to the same partition of a columnar twin topic). Baseline:
confluent-kafka, json.loads, pyarrow, zstd Parquet (the JSON topics). kipside: `kipside lake
--once` of topic a, then of both, for each kind of topic (bench/_steady.py): the steady state
(both minus a) is what a running lake pays per row. Every run's Parquet rows must equal its
records. Apart from Spark: the CPU a source task spends turning topic a's stored batches into
rows (pipeline.source.record_rows, in this process), JSON values against typed carriers.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _data_load import json_schema
from _harness import INSTALLED, REPO, Managed
from _measure import run_json
from _report import Table, Target, parse_args
from _steady import Kind, TreeRun, report, timed
from lake import parquet
from testkit.broker import start_tansu

from kipside.pipeline.kafka.client import ClientConfig, KafkaClient
from kipside.pipeline.kafka.fetcher import FetchConfig, RangeReader
from kipside.pipeline.kafka.offsets import EARLIEST, list_offsets, watermarks
from kipside.pipeline.kafka.producer import IdempotentProducer, Written
from kipside.pipeline.lake.schema import load_schema
from kipside.pipeline.source.ranges import OffsetRange
from kipside.pipeline.source.record_rows import record_rows
from kipside.pipeline.source.record_schema import value_arrow_type
from kipside.protocol import (
    Address,
    ColumnarEncoder,
    Encoded,
    RecordBatchView,
    parse_json_schema,
)

LOAD = REPO / "bench" / "_data_load.py"
PARTITIONS = 4
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--records": (int, 1_000_000, "records in all"),
    "--first-share": (float, 0.2, "share in topic a"),
    "--reps": (int, 1, "runs of each kind (median reported)"),
}
KIND = Kind(
    "lake-columnar",
    "Lake ingestion of a columnar topic",
    "M rows",
    "{:,.0f} rows",
    1e6,
    ("baseline: confluent-kafka + json.loads + pyarrow", "kipside lake --once", "a", "both"),
    10,
    True,
    2,
    1,
)
JSON_PATH_TARGET = 3.0


def carriers(boot: str, source: str, dest: str) -> int:
    """`source`'s batches as carriers in `dest`, partition by partition; returns the count."""
    schema = parse_json_schema(json.dumps(json_schema()), "orders.json").to_arrow()
    encoder = ColumnarEncoder(schema)
    job = {"bootstrap": boot, "topics": [dest], "partitions": PARTITIONS}
    run_json(REPO / "bench" / "_workload.py", "create-topics", json.dumps(job), timeout=60)
    address = Address.parse(boot, what="bootstrap")
    count = 0
    with KafkaClient([address], role="bench", config=ClientConfig()) as client:
        tps = [(source, p) for p in range(PARTITIONS)]
        starts = list_offsets(client, {tp: EARLIEST for tp in tps})
        ends = watermarks(client, starts)
        reader = RangeReader(client, FetchConfig(committed_only=False))
        producer: IdempotentProducer[int] = IdempotentProducer(client)
        for tp in tps:
            for batch in reader.read(*tp, starts[tp], ends[tp].high_watermark):
                result = encoder.encode(batch)
                if not isinstance(result, Encoded):
                    raise SystemExit(f"{source}: a batch was not encoded: {result}")
                producer.add(dest, tp[1], RecordBatchView.from_buffer(result.batch), count)
                count += 1
        written: list[Written[int]] = []
        producer.flush(written.extend)
        producer.close()
    return count


def task_rows(boot: str, topic: str, value_type: Any) -> tuple[int, float]:
    """(rows, CPU seconds) of record_rows over every stored batch of `topic`, as the source's
    tasks make them (valueSchema's struct given as `value_type`, or None: value bytes)."""
    address = Address.parse(boot, what="bootstrap")
    with KafkaClient([address], role="bench", config=ClientConfig()) as client:
        tps = [(topic, p) for p in range(PARTITIONS)]
        starts = list_offsets(client, {tp: EARLIEST for tp in tps})
        ends = watermarks(client, starts)
        reader = RangeReader(client, FetchConfig(committed_only=False))
        stored = {
            tp: (list(reader.read(*tp, starts[tp], ends[tp].high_watermark)), ends[tp])
            for tp in tps
        }
    rows, started = 0, time.process_time()
    for (name, partition), (batches, end) in stored.items():
        whole = OffsetRange(name, partition, 0, end.high_watermark)
        for chunk in record_rows(whole, batches, include_headers=False, value_type=value_type):
            rows += chunk.num_rows
    return rows, time.process_time() - started


def main() -> int:
    args = parse_args(__doc__, OPTIONS, {"records": 20_000, "reps": 1})
    work = Path(tempfile.mkdtemp(prefix="kipbench-lakecol-"))
    (work / "orders.json").write_text(json.dumps(json_schema(), indent=2))
    in_a = int(args.records * args.first_share)
    runs: dict[str, dict[str, list[TreeRun]]] = {"json": {}, "columnar": {}}
    with start_tansu() as broker:
        brokers, boot = [Managed("tansu", broker.proc)], broker.bootstrap
        made = 0
        for part, n, first in (("a", in_a, 0), ("b", args.records - in_a, in_a)):
            job = {"bootstrap": boot, "topic": f"bench-lcj-{part}", "partitions": PARTITIONS}
            job |= {"records": n, "first_id": first}
            run_json(LOAD, "lake-load", json.dumps(job), timeout=3600)
            made += carriers(boot, f"bench-lcj-{part}", f"bench-lcc-{part}")
        for kind, prefix in (("json", "bench-lcj-"), ("columnar", "bench-lcc-")):
            found = runs[kind]
            found["base"] = []
            for rep in range(args.reps):
                if kind == "json":
                    out = work / f"base{rep}"
                    job = {"bootstrap": boot, "topics": [f"{prefix}a", f"{prefix}b"]}
                    job |= {"records": args.records, "out": str(out)}
                    baseline = [sys.executable, str(LOAD), "baseline", json.dumps(job)]
                    found["base"].append(timed(brokers, "baseline", baseline))
                    parquet(out, args.records)
                for name, topics, n in (
                    ("a", f"{prefix}a", in_a),
                    ("ab", f"{prefix}.*", args.records),
                ):
                    out, ck = work / f"{kind}-{name}{rep}", work / f"ck-{kind}-{name}{rep}"
                    lake = ["lake", "--bootstrap", boot, "--topics", topics, "--once"]
                    lake += ["--schema", str(work / "orders.json"), "--out", str(out)]
                    lake += ["--checkpoint", str(ck)]
                    found.setdefault(name, []).append(
                        timed(brokers, f"kipside lake ({kind})", INSTALLED.command(*lake))
                    )
                    parquet(out, n)
        runs["columnar"]["base"] = runs["json"]["base"]
        struct = load_schema(str(work / "orders.json")).struct
        tasks = {
            "JSON topic, value bytes": task_rows(boot, "bench-lcj-a", None),
            "columnar topic, valueSchema": task_rows(boot, "bench-lcc-a", value_arrow_type(struct)),
        }
    units = (args.records / 1e6, in_a / 1e6, args.records / 1e6)
    data = f"Data: {args.records:,} JSON order records, {in_a:,} in topic a; as JSON and as "
    data += f"{made:,} carriers of the same batches; median of {args.reps} runs."
    result = report(KIND, runs["columnar"], units, data)
    steady = {
        kind: (args.records - in_a) / (TreeRun.median(r["ab"]).cpu_s - TreeRun.median(r["a"]).cpu_s)
        for kind, r in runs.items()
    }
    ratio = steady["columnar"] / steady["json"]
    result.tables.append(
        Table(
            "Steady state, rows per CPU-second",
            ["topic", "rows per CPU-s", "vs JSON topic"],
            [
                ["JSON", f"{steady['json']:,.0f}", "1.00x"],
                ["columnar", f"{steady['columnar']:,.0f}", f"{ratio:.2f}x"],
            ],
            "lrr",
        )
    )
    result.tables.append(
        Table(
            "A source task's CPU (topic a, record_rows in one process)",
            ["topic", "rows", "CPU s", "rows per CPU-s"],
            [[name, f"{n:,}", f"{cpu:.2f}", f"{n / cpu:,.0f}"] for name, (n, cpu) in tasks.items()],
            "lrrr",
        )
    )
    result.targets.append(
        Target(
            f"columnar topic: rows per CPU-second at least {JSON_PATH_TARGET:.3g}x the JSON "
            "topic's (steady state)",
            ratio >= JSON_PATH_TARGET,
            f"{ratio:.2f}x",
        )
    )
    result.publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
