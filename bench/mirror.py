"""The shallow mirror (`kipside mirror`) against a deep mirror, on the same data, in both of its
delivery modes, and what the shared reader's memory costs on very compressible data.

    .venv/bin/python bench/mirror.py [--gigabytes 1.0] [--extra-gigabytes 3.0] [--reps 3] [--quick]
    .venv/bin/python bench/mirror.py --profile      # where one small --once run spends its CPU

JSON-like 1 KiB values in a zstd and an lz4 topic of 4 partitions per set: --gigabytes in set
a, --extra-gigabytes in set b. Baseline: the deep mirror (consume, re-produce) of set a.
kipside: `kipside mirror --once` of set a, then of both sets (bench/_steady.py), as it copies
by default (at least once) and with --exactly-once. Memory: 80 batches of one 8 MiB value of
zeros (zstd), read by a process running the code a Spark task runs for `format("kipside")` and
`kipside lake`: its peak RSS growth.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
from _harness import INSTALLED, REPO, Managed
from _measure import run_json, wait_until_quiet
from _report import Table, Target, parse_args
from _steady import Kind, TreeRun, report, timed
from _workload import create_topics
from testkit.broker import Broker, start_tansu

LOAD = REPO / "bench" / "_data_load.py"
SETS = {
    "a": {"bench-a-zstd": "zstd", "bench-a-lz4": "lz4"},
    "b": {"bench-b-zstd": "zstd", "bench-b-lz4": "lz4"},
}
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--gigabytes": (float, 1.0, "record values in set a"),
    "--extra-gigabytes": (float, 3.0, "and in set b"),
    "--reps": (int, 3, "runs of each kind (median reported)"),
    "--profile": (bool, False, "only: the CPU of each process of one small --once run"),
}
ROWS = ("deep: consume + re-produce (set a)", "kipside mirror --once", "set a", "sets a and b")
# Steady state at most 0.2x the deep mirror's CPU per GB; a whole 1 GB run at most 1.0x.
KIND = Kind("mirror", "Shallow mirror", "GB", "{:.0f} MB", 1e3, ROWS, 0.2, False, 1, 1.0)
EOS_ROWS = (ROWS[0], "kipside mirror --once --exactly-once", ROWS[2], ROWS[3])
EOS_KIND = Kind("mirror", "Shallow mirror", "GB", "{:.0f} MB", 1e3, EOS_ROWS, 0.2, False, 1, 1.0)
MODES = {"": [], "eos-": ["--exactly-once"]}
FIXED_TARGET_CPU_S = 10.0
ZEROS, ZERO_BATCHES, GROWTH_TARGET_MIB = 8 << 20, 80, 256

READER = textwrap.dedent(
    """
    import json, resource, sys
    import pyarrow.compute as pc
    from kipside.pipeline.source.datasource import read_range
    from kipside.pipeline.source.options import parse_source_options
    from kipside.pipeline.source.ranges import OffsetRange

    options = parse_source_options(json.loads(sys.argv[1]), streaming=False)
    topic, end = sys.argv[2], int(sys.argv[3])
    for _ in read_range(options, OffsetRange(topic, 0, 0, 1)):
        pass  # imports and the compiled kernels, before the measured read
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    values = 0
    for chunk in read_range(options, OffsetRange(topic, 0, 0, end)):
        values += pc.sum(pc.binary_length(chunk.column("value"))).as_py() or 0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"values": values, "growth_kib": after - before}))
    """
)


def reader_growth_mib(broker: Broker) -> float:
    """Peak RSS growth of a process reading ZERO_BATCHES batches of one ZEROS-byte value of
    zeros each (zstd) with the reader a Spark task runs."""
    from confluent_kafka import Producer

    topic = "bench-zeros"
    create_topics({"bootstrap": broker.bootstrap, "topics": [topic], "partitions": 1})
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "compression.type": "zstd",
            "message.max.bytes": 2 * ZEROS,
        }
    )
    value = bytes(ZEROS)
    for _ in range(ZERO_BATCHES):  # one record a batch
        producer.produce(topic, value=value, partition=0)
        producer.flush(30)
    options = json.dumps({"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic})
    args = [sys.executable, "-c", READER, options, topic, str(ZERO_BATCHES)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True)
    read = json.loads(done.stdout.strip().splitlines()[-1])
    if read["values"] != ZERO_BATCHES * ZEROS:
        raise SystemExit(f"the reader read {read['values']} bytes of values, not all of them")
    return float(read["growth_kib"]) / 1024


def profile() -> int:
    """One --once run of 1,000 small records, and the CPU of every process it started."""
    with start_tansu() as source, start_tansu() as dest:
        load = {"bootstrap": source.bootstrap, "topics": {"bench-p": "lz4"}, "partitions": 4}
        loaded = json.dumps(load | {"size": 100, "bytes": 100_000})
        run_json(LOAD, "mirror-load", loaded, timeout=300)
        work = Path(tempfile.mkdtemp(prefix="kipbench-profile-"))
        args = ["mirror", "--source", source.bootstrap, "--dest", dest.bootstrap]
        args += ["--topics", "bench-p", "--once", "--checkpoint", str(work / "ck")]
        wait_until_quiet()
        t0 = time.monotonic()
        proc = subprocess.Popen(INSTALLED.command(*args), stderr=subprocess.DEVNULL)
        seen: dict[int, tuple[float, float, str]] = {}
        while proc.poll() is None:
            try:
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)]
            except psutil.Error:
                tree = []
            for p in tree:
                try:
                    cpu = sum(p.cpu_times()[:2])
                    start = seen.get(p.pid, (time.monotonic() - t0, 0.0, ""))[0]
                    seen[p.pid] = (start, cpu, _name(p, proc.pid))  # named after any exec
                except psutil.Error:
                    pass
            time.sleep(0.03)
    rows = [[f"{s:.1f}", f"{c:.2f}", n] for s, c, n in sorted(seen.values()) if c >= 0.05]
    total = sum(c for _, c, _ in seen.values())
    rows.append(["", f"{total:.1f}", "all (sampled every 30 ms: short-lived processes count less)"])
    print(Table("CPU per process", ["started s", "CPU s", "process"], rows, "rrl").markdown())
    return 0


def _name(p: psutil.Process, command: int) -> str:
    cmd = p.cmdline()
    if p.pid == command:
        return "kipside mirror (the command)"
    if cmd and cmd[0].endswith("java"):
        return "JVM (Spark driver)"
    found = re.search(r"-m (\S+)(?: (\S+))?", " ".join(cmd))
    if found is None:
        return " ".join(cmd)[:60]
    module, arg = found.group(1), found.group(2) or ""
    parent = p.parent()
    forked = " (fork)" if parent is not None and parent.cmdline() == cmd else ""
    return f"{module} {arg}".strip() + forked


def main() -> int:
    args = parse_args(__doc__, OPTIONS, {"gigabytes": 0.02, "extra_gigabytes": 0.02, "reps": 1})
    if args.profile:
        return profile()
    work = Path(tempfile.mkdtemp(prefix="kipbench-mirror-"))
    runs: dict[str, list[TreeRun]] = {k: [] for k in ("deep", "a", "ab", "eos-a", "eos-ab")}
    with start_tansu() as source, start_tansu() as shallow, start_tansu() as deep_dest:
        loaded = {}
        for name, gigabytes in (("a", args.gigabytes), ("b", args.extra_gigabytes)):
            load = {"bootstrap": source.bootstrap, "topics": SETS[name], "partitions": 4}
            load |= {"size": 1024, "bytes": int(gigabytes * 1e9)}
            loaded[name] = run_json(LOAD, "mirror-load", json.dumps(load), timeout=1800)
        src = Managed("source", source.proc)
        copy = {"source": source.bootstrap, "dest": deep_dest.bootstrap, "topics": SETS["a"]}
        copy["records"] = loaded["a"]["records"]
        deep = [sys.executable, str(LOAD), "deep", json.dumps(copy)]
        for rep in range(args.reps):
            runs["deep"].append(timed([src, Managed("d", deep_dest.proc)], "deep mirror", deep))
            for mode, flags in MODES.items():
                for name, pattern in (("a", "bench-a-.*"), ("ab", "bench-[ab]-.*")):
                    once = ["mirror", "--source", source.bootstrap, "--dest", shallow.bootstrap]
                    once += ["--topics", pattern, "--once", "--rename", f"{mode}{name}{rep}."]
                    once += ["--checkpoint", str(work / f"ck-{mode}{name}-{rep}"), *flags]
                    brokers = [src, Managed("s", shallow.proc)]
                    command = INSTALLED.command(*once)
                    runs[mode + name].append(timed(brokers, "kipside mirror", command))
        growth = reader_growth_mib(source)
    gb = {k: v["bytes"] / 1e9 for k, v in loaded.items()}
    units = (gb["a"], gb["a"], gb["a"] + gb["b"])
    records = " + ".join(f"{v['records']:,}" for v in loaded.values())
    data = f"Data: {gb['a']:.2f} GB + {gb['b']:.2f} GB of JSON-like values ({records} records of "
    data += f"about 1024 B); median of {args.reps} runs each."
    plain = report(KIND, {k: runs[k] for k in ("deep", "a", "ab")}, units, data)
    eos_runs = {"deep": runs["deep"], "a": runs["eos-a"], "ab": runs["eos-ab"]}
    eos = report(EOS_KIND, eos_runs, units, data)
    both = Table(
        plain.tables[0].title,
        plain.tables[0].headers,
        [*plain.tables[0].rows, *eos.tables[0].rows[1:]],
    )
    memory = Table(
        "Memory: the reader on very compressible data",
        ["data", "reader's peak RSS growth MiB"],
        [[f"{ZERO_BATCHES} zstd batches of one {ZEROS >> 20} MiB value of zeros", f"{growth:.0f}"]],
    )
    plain.tables[:] = [both, memory]
    plain.targets.extend(
        Target(t.name.replace("steady state", "steady state (--exactly-once)"), t.ok, t.detail)
        for t in eos.targets
    )
    plain.targets.append(
        Target(
            f"memory: reader RSS growth under {GROWTH_TARGET_MIB} MiB",
            growth < GROWTH_TARGET_MIB,
            f"{growth:.0f} MiB",
        )
    )
    for kind_name, part, whole in (
        ("at least once", "a", "ab"),
        ("exactly once", "eos-a", "eos-ab"),
    ):
        p, w = TreeRun.median(runs[part]), TreeRun.median(runs[whole])
        fixed = p.cpu_s - (w.cpu_s - p.cpu_s) / gb["b"] * gb["a"]
        plain.targets.append(
            Target(
                f"fixed cost ({kind_name}): at most {FIXED_TARGET_CPU_S:.0f} CPU-s",
                fixed <= FIXED_TARGET_CPU_S,
                f"{fixed:.1f} CPU-s",
            )
        )
    plain.notes[:] = [
        n.replace("Spark's fixed cost", "Spark's fixed cost (at least once)") for n in plain.notes
    ]
    plain.notes.extend(
        n.replace("Spark's fixed cost", "Spark's fixed cost (exactly once)") for n in eos.notes
    )
    plain.publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
