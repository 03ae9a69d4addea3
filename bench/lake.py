"""Benchmark: `kipside lake` against a hand-written ingestion consumer, on the same data.

Workload: JSON order records of about 200 B, zstd-compressed by confluent-kafka, in an
in-memory Tansu: a share (default 1/5) in topic bench-lake-a, the rest in bench-lake-b, 5
million in all, 4 partitions each.
Runs, each repeated and reported as the median:
  baseline  confluent-kafka consume (read_committed) + json.loads per record + pyarrow Tables
            + zstd Parquet per topic and date, all the records
  kipside   kipside lake --once (Spark local[*]) with the same schema, topic a alone, then
            both topics
kipside's cost per row in steady state is the difference between its two runs per row of topic
b: Spark's fixed cost (the JVM's start, planning processes) is in both and cancels out.
CPU is every client-side process (Spark's JVM and Python workers; the baseline's Python and
librdkafka's threads); the broker's CPU is listed apart. Each run's Parquet rows are counted
from the files' footers and must equal the records. Target (issue 10): at least 3x the
baseline's rows per CPU-second.

    .venv/bin/python bench/lake.py [--records 5000000] [--first-share 0.2] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
from _harness import HOST, Managed, start_tansu
from _lake_load import JSON_SCHEMA
from _report import (
    IMG_DIR,
    Panel,
    bar_chart,
    command_line,
    facts_markdown,
    machine_info,
    markdown_table,
    text_table,
    utc_now,
    versions,
    write_section,
)
from _runs import Run, kipside, load_worker, measure, median, timed_tree

SECTION = "lake"
LOAD = Path(__file__).resolve().parent / "_lake_load.py"
TOPICS = ("bench-lake-a", "bench-lake-b")
PARTITIONS = 4
TARGET = 3.0
PROFILE = """\
Profile (one Spark session, `local[2]`, on 1 M of these records, second pass so the JVM is warm;
each step's CPU minus the step before it, CPU of the driver, the JVM and the Python workers):
reading with the kipside source into Spark rows (fetch, zstd, the compiled record kernel, Arrow,
the Python worker's hand-over to the JVM) about 3.6 µs per row; Spark's `from_json` against the
schema about 6.5 µs (Jackson, row by row: `from_json` is not code-generated); writing zstd
Parquet by topic and date about 3.4 µs. These add up to 13.5 µs against the steady-state line's
15.6: a first pass over the same data costs 2-3x as much (JIT warm-up), and the benchmark's
runs are first passes of fresh JVMs. `from_json` is
where the target is lost: parsing the values in the source's Python worker with pyarrow's JSON
reader into typed Arrow columns costs about 2.5 µs per row measured alone, which would put the
steady state near 2.8x by this estimate, still short of 3x without a cheaper Parquet write. Not
done in issue 10.
"""


@dataclass
class Ingest:
    """One run: its cost, the rows it wrote and the Parquet bytes they take."""

    run: Run
    rows: int
    parquet_bytes: int


def _parquet(out: Path) -> tuple[int, int]:
    """Rows (from the footers) and bytes of the table's Parquet files, quarantine aside."""
    files = [f for f in out.rglob("*.parquet") if "_quarantine" not in f.parts]
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return rows, sum(f.stat().st_size for f in files)


def _checked(what: str, out: Path, run: Run, records: int) -> Ingest:
    rows, size = _parquet(out)
    if rows != records:
        raise SystemExit(f"{what} wrote {rows:,} rows for {records:,} records")
    shutil.rmtree(out)
    return Ingest(run, rows, size)


def _lake(broker: Managed, port: int, work: Path, topics: str, name: str, records: int) -> Ingest:
    out, checkpoint = work / f"out-{name}", work / f"ck-{name}"
    args = kipside("lake", "--bootstrap", f"{HOST}:{port}", "--topics", topics, "--once")
    args += ["--schema", str(work / "orders.json"), "--out", str(out)]
    args += ["--checkpoint", str(checkpoint)]
    run = measure([broker], lambda: timed_tree("kipside lake", args, spark=True))
    shutil.rmtree(checkpoint, ignore_errors=True)
    return _checked("kipside lake", out, run, records)


def _baseline(broker: Managed, port: int, work: Path, name: str, records: int) -> Ingest:
    out = work / f"out-{name}"
    args = {"bootstrap": f"{HOST}:{port}", "topics": list(TOPICS), "records": records}
    command = [sys.executable, str(LOAD), "baseline", json.dumps({**args, "out": str(out)})]
    run = measure([broker], lambda: timed_tree("baseline", command))
    return _checked("the baseline", out, run, records)


def _median(runs: list[Ingest]) -> Ingest:
    return Ingest(median([r.run for r in runs]), runs[0].rows, runs[0].parquet_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5_000_000, help="records in all")
    parser.add_argument("--first-share", type=float, default=0.2, help="share in topic a")
    parser.add_argument("--reps", type=int, default=2, help="runs of each kind (median reported)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kipside-bench-lake-"))
    (work / "orders.json").write_text(json.dumps(JSON_SCHEMA, indent=2))
    broker, port = start_tansu(work)
    try:
        in_a = int(args.records * args.first_share)
        counts = {TOPICS[0]: in_a, TOPICS[1]: args.records - in_a}
        loaded, first = {}, 0
        for topic, n in counts.items():
            job = {"topic": topic, "partitions": PARTITIONS, "records": n, "first_id": first}
            loaded[topic] = load_worker(
                LOAD, "load", {"bootstrap": f"{HOST}:{port}", **job}, timeout=3600
            )
            first += n
        log = load_worker(
            LOAD, "logsize", {"bootstrap": f"{HOST}:{port}", "topics": list(TOPICS)}, timeout=600
        )["bytes"]
        base, one, two = [], [], []
        for rep in range(args.reps):
            base.append(_baseline(broker, port, work, f"base{rep}", args.records))
            one.append(_lake(broker, port, work, TOPICS[0], f"a{rep}", in_a))
            two.append(_lake(broker, port, work, "bench-lake-.*", f"ab{rep}", args.records))
        _report(_median(base), _median(one), _median(two), loaded, log, args.reps)
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


def _report(
    base: Ingest, one: Ingest, two: Ingest, loaded: dict[str, dict[str, int]], log: int, reps: int
) -> None:
    in_a, in_b = (loaded[t]["records"] for t in TOPICS)
    value_bytes = sum(v["bytes"] for v in loaded.values())
    steady = Ingest(two.run.minus(one.run), in_b, two.parquet_bytes - one.parquet_bytes)
    rows = [
        ("baseline: confluent-kafka + json.loads + pyarrow", base),
        (f"kipside lake --once, topic a ({in_a / 1e6:g} M records)", one),
        (f"kipside lake --once, both topics ({(in_a + in_b) / 1e6:g} M)", two),
        ("kipside lake, steady state (both minus a)", steady),
    ]
    base_rate = base.rows / base.run.cpu_s
    headers = [
        "run",
        "rows",
        "wall s",
        "rows/s",
        "CPU s",
        "CPU s per M rows",
        "rows per CPU-s vs baseline",
        "broker CPU s",
    ]
    table = [
        [
            name,
            f"{r.rows:,}",
            f"{r.run.wall_s:.1f}",
            f"{r.rows / r.run.wall_s:,.0f}",
            f"{r.run.cpu_s:.1f}",
            f"{r.run.cpu_s / r.rows * 1e6:.1f}",
            f"{r.rows / r.run.cpu_s / base_rate:.2f}x",
            f"{r.run.broker_cpu_s:.1f}",
        ]
        for name, r in rows
    ]
    print(text_table(headers, table))
    sizes = [
        ["Kafka log (zstd record batches)", f"{log / 1e6:,.1f}", "1.00"],
        ["baseline's Parquet (zstd)", f"{base.parquet_bytes / 1e6:,.1f}"],
        ["kipside lake's Parquet (zstd)", f"{two.parquet_bytes / 1e6:,.1f}"],
    ]
    for row in sizes[1:]:
        row.append(f"{float(row[1].replace(',', '')) * 1e6 / log:.2f}")
    print(text_table(["data", "MB", "vs Kafka log"], sizes))
    png = IMG_DIR / "lake.png"
    _chart(png, table, base_rate, reps)
    steady_x = steady.rows / steady.run.cpu_s / base_rate
    whole_x = two.rows / two.run.cpu_s / base_rate
    fixed = one.run.cpu_s - steady.run.cpu_s / in_b * in_a
    body = "\n".join(
        [
            "## Lake ingestion (issue 10)\n",
            facts_markdown(command_line(), utc_now(), machine_info(), versions(haproxy=None)),
            f"Data: {in_a + in_b:,} JSON order records ({value_bytes / (in_a + in_b):.0f} B on "
            f"average, {value_bytes / 1e6:,.0f} MB of values), {in_a:,} in topic a and {in_b:,} "
            f"in topic b, {PARTITIONS} partitions each, zstd batches written by confluent-kafka. "
            f"Both sides write the same 8 typed columns (a timestamp, a list of structs) as zstd "
            f"Parquet by topic and date, and every run's row count is checked. Median of {reps} "
            "runs each. CPU is every client-side process; the broker's is apart.\n",
            markdown_table(headers, table, "lrrrrrrr"),
            markdown_table(["data", "MB", "vs Kafka log"], sizes, "lrr"),
            f"![kipside lake vs baseline](img/{png.name})\n",
            f"Target: at least {TARGET:g}x the baseline's rows per CPU-second.\n",
            f"- Steady state (what a running ingestion pays per row): "
            f"{'met' if steady_x >= TARGET else 'missed'}, {steady_x:.2f}x.",
            f"- A whole `--once` run of {(in_a + in_b) / 1e6:g} M records, Spark's start "
            f"included: {'met' if whole_x >= TARGET else 'missed'}, {whole_x:.2f}x. Spark's "
            f"fixed cost is about {fixed:.0f} CPU-seconds per run.\n",
            PROFILE,
        ]
    )
    write_section(SECTION, body)


def _chart(png: Path, table: list[list[str]], base_rate: float, reps: int) -> None:
    labels = ["baseline", "kipside\ntopic a", "kipside\nboth topics", "kipside\nsteady state"]
    bar_chart(
        png,
        [
            Panel(
                "Rows per CPU-second (higher is better)",
                "rows / CPU s",
                labels,
                [1e6 / float(row[5]) for row in table],
                reference=base_rate * TARGET,
                reference_label=f"target: {TARGET:g}x baseline",
            ),
            Panel(
                "Throughput (higher is better)",
                "rows / s",
                labels,
                [float(row[3].replace(",", "")) for row in table],
            ),
        ],
        f"kipside lake vs a hand-written consumer (median of {reps} runs, loopback)",
    )


if __name__ == "__main__":
    main()
