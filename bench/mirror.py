"""Benchmark: the shallow mirror (`kipside mirror`) against a deep mirror, on the same data.

Workload: JSON-like record values of 1 KiB in topics written by confluent-kafka, half zstd and
half lz4, on an in-memory Tansu: 1 GB in topics "a" and 3 GB more in topics "b".
Runs, each repeated and reported as the median:
  deep     confluent-kafka consume (read_committed) + produce with recompression, 1 GB (a)
  shallow  kipside mirror --once (Spark local[*]), 1 GB (a), then 4 GB (a and b)
The shallow mirror's cost per GB in steady state is the difference between its 4 GB and 1 GB
runs per GB: Spark's fixed cost (JVM start, planning processes) is the same in both and cancels
out (3 GB apart, so the runs' noise of a few CPU-seconds weighs little).
CPU is every client-side process: kipside's Python, Spark's JVM and Python workers; the deep
mirror's Python with librdkafka's threads. The brokers' CPU is listed apart. Target (issue 9):
the shallow mirror uses at most 1/3 of the deep mirror's CPU per GB, at no less throughput.

    .venv/bin/python bench/mirror.py [--gigabytes 1.0] [--extra-gigabytes 3.0] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from _harness import HOST, Managed, start_tansu
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

SECTION = "mirror"
PROFILE = """\
Profile (py-spy on Spark's Python daemon: `py-spy record --subprocesses -p PID`, while the
mirror copied 3 GB). Before `pipeline.spark_daemon`, each forked task worker spent about a
second importing: pandas (PySpark's Arrow path), kio, pyarrow, and PySpark itself compiled from
`pyspark.zip`, which Spark puts first on the workers' path and Python can't cache. Preloading
those in the daemon (threadless, from the installed pyspark) took the task workers from 4.0 to
2.6 CPU-seconds for 1 GB and from 7.6 to 5.8 for 3 GB in a run of each. What is left per GB is
Spark moving the batches through Arrow between the Python workers and the JVM; kipside's own
reading costs 0.25 CPU-seconds per GB of records (96 MB of zstd and lz4 batches) and building
the Arrow rows 0.5 more (measured in one process, without Spark).
"""
LOAD = Path(__file__).resolve().parent / "_mirror_load.py"
SETS = {
    "a": {"bench-a-zstd": "zstd", "bench-a-lz4": "lz4"},
    "b": {"bench-b-zstd": "zstd", "bench-b-lz4": "lz4"},
}
PARTITIONS = 4
RECORD_SIZE = 1024
TARGET_CPU_RATIO = 1 / 3


def _shallow(
    source: int, dest: int, topics: str, checkpoint: Path, rename: str
) -> tuple[float, float]:
    args = kipside("mirror", "--source", f"{HOST}:{source}", "--dest", f"{HOST}:{dest}")
    args += ["--topics", topics, "--checkpoint", str(checkpoint), "--once", "--rename", rename]
    return timed_tree("kipside mirror", args, spark=True)


def _deep(source: int, dest: int, records: int) -> tuple[float, float]:
    args = {
        "source": f"{HOST}:{source}",
        "dest": f"{HOST}:{dest}",
        "topics": SETS["a"],
        "records": records,
    }
    return timed_tree("deep mirror", [sys.executable, str(LOAD), "deep", json.dumps(args)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0, help="record values in set a")
    parser.add_argument("--extra-gigabytes", type=float, default=3.0, help="and in set b")
    parser.add_argument("--reps", type=int, default=3, help="runs of each kind (median reported)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kipside-bench-mirror-"))
    brokers: list[Managed] = []
    try:
        source, sp = start_tansu(work, name="source")
        shallow_dest, shallow_p = start_tansu(work, name="shallow-dest")
        deep_dest, deep_p = start_tansu(work, name="deep-dest")
        brokers = [source, shallow_dest, deep_dest]
        loaded = {
            name: load_worker(
                LOAD,
                "load",
                {
                    "bootstrap": f"{HOST}:{sp}",
                    "topics": topics,
                    "partitions": PARTITIONS,
                    "bytes": int((args.gigabytes if name == "a" else args.extra_gigabytes) * 1e9),
                    "size": RECORD_SIZE,
                },
                timeout=1800,
            )
            for name, topics in SETS.items()
        }
        deep, one, two = [], [], []
        records = loaded["a"]["records"]
        for rep in range(args.reps):
            deep.append(measure([source, deep_dest], lambda: _deep(sp, deep_p, records)))
            for runs, topics, name in ((one, "bench-a-.*", "a"), (two, "bench-[ab]-.*", "ab")):
                checkpoint, rename = work / f"ck-{name}-{rep}", f"{name}{rep}."
                runs.append(
                    measure(
                        [source, shallow_dest],
                        lambda t=topics, c=checkpoint, r=rename: _shallow(sp, shallow_p, t, c, r),
                    )
                )
        _report(median(deep), median(one), median(two), loaded, args.reps)
    finally:
        for b in brokers:
            b.stop()


def _report(deep: Run, one: Run, two: Run, loaded: dict[str, dict[str, int]], reps: int) -> None:
    gb_a = loaded["a"]["bytes"] / 1e9
    gb_b = loaded["b"]["bytes"] / 1e9
    steady = two.minus(one)
    fixed_cpu = one.cpu_s - steady.cpu_s / gb_b * gb_a
    rows = [
        ("deep: consume + re-produce (1 GB)", deep, gb_a),
        ("shallow: kipside mirror, whole run (1 GB)", one, gb_a),
        (f"shallow: kipside mirror, whole run ({gb_a + gb_b:.0f} GB)", two, gb_a + gb_b),
        (f"shallow: steady state ({gb_a + gb_b:.0f} GB run minus 1 GB run)", steady, gb_b),
    ]
    headers = [
        "run",
        "wall s",
        "MB/s",
        "CPU s",
        "CPU s per GB",
        "CPU per GB vs deep",
        "brokers' CPU s",
    ]
    deep_per_gb = deep.cpu_s / gb_a
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
    print(text_table(headers, table))
    png = IMG_DIR / "mirror.png"
    labels = [
        "deep",
        "shallow\n1 GB run",
        f"shallow\n{gb_a + gb_b:.0f} GB run",
        "shallow\nsteady state",
    ]
    bar_chart(
        png,
        [
            Panel(
                "CPU-seconds per GB of records (lower is better)",
                "CPU s / GB",
                labels,
                [float(row[4]) for row in table],
                reference=deep_per_gb * TARGET_CPU_RATIO,
                reference_label="target: 1/3 of deep",
            ),
            Panel(
                "Throughput (higher is better)",
                "MB/s of record values",
                labels,
                [float(row[2]) for row in table],
            ),
        ],
        f"Shallow vs deep mirror (median of {reps} runs, loopback)",
    )
    steady_ratio = steady.cpu_s / gb_b / deep_per_gb
    whole_ratio = one.cpu_s / gb_a / deep_per_gb
    steady_speed = (gb_b / steady.wall_s) / (gb_a / deep.wall_s)
    whole_speed = (gb_a / one.wall_s) / (gb_a / deep.wall_s)
    body = "\n".join(
        [
            "## Shallow mirror (issue 9)\n",
            facts_markdown(command_line(), utc_now(), machine_info(), versions(haproxy=None)),
            f"Data: {gb_a:.2f} GB + {gb_b:.2f} GB of JSON-like record values "
            f"({loaded['a']['records']:,} + {loaded['b']['records']:,} records of about "
            f"{RECORD_SIZE} B), each set in a zstd topic and an lz4 topic of {PARTITIONS} "
            "partitions, written by confluent-kafka. Median of "
            f"{reps} runs each. CPU is every client-side process (kipside, Spark's JVM and Python "
            "workers; the deep mirror's Python and librdkafka threads); the brokers' CPU is "
            "apart. The shallow mirror writes its offset syncs in every run.\n",
            markdown_table(headers, table, "lrrrrrr"),
            f"![shallow vs deep mirror](img/{png.name})\n",
            "Target: the shallow mirror uses at most 1/3 of the deep mirror's CPU per GB, at no "
            "less throughput.\n",
            f"- Steady state (what a long-running mirror pays per GB): "
            f"{'met' if steady_ratio <= TARGET_CPU_RATIO else 'missed'}, {steady_ratio:.2f} of "
            f"the deep mirror's CPU per GB, at {steady_speed:.1f}x its throughput.",
            f"- Whole `--once` run of 1 GB, Spark's start included: "
            f"{'met' if whole_ratio <= TARGET_CPU_RATIO else 'missed'}, {whole_ratio:.1f}x "
            f"the deep mirror's CPU and {whole_speed:.2f}x its throughput. Spark's fixed cost, "
            f"about {fixed_cpu:.0f} CPU-seconds per run (the JVM's start, and a Python process "
            "for each planning step that imports PySpark from its zip), is larger than copying "
            "a gigabyte; it is paid once by a mirror that keeps running, and on every run by "
            "`--once`.\n",
            PROFILE,
        ]
    )
    write_section(SECTION, body)


if __name__ == "__main__":
    main()
