"""The shallow mirror (`kipside mirror`, issue 9) against a deep mirror, on the same data.

    .venv/bin/python bench/mirror.py [--gigabytes 1.0] [--extra-gigabytes 3.0] [--reps 3] [--quick]

JSON-like 1 KiB values in a zstd and an lz4 topic of 4 partitions per set: --gigabytes in set
a, --extra-gigabytes in set b. Baseline: the deep mirror (consume, re-produce) of set a. kipside:
`kipside mirror --once` of set a, then of both sets (bench/_steady.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from _harness import INSTALLED, REPO, Managed
from _measure import TreeRun, run_json, timed
from _report import doc_args
from _steady import Kind, Steady, report
from testkit.broker import start_tansu

LOAD = REPO / "bench" / "_data_load.py"
SETS = {"a": {"bench-a-zstd": "zstd", "bench-a-lz4": "lz4"}}
SETS["b"] = {"bench-b-zstd": "zstd", "bench-b-lz4": "lz4"}
NAMES = (
    "deep: consume + re-produce (set a)",
    "shallow: kipside mirror --once (set a)",
    "shallow: kipside mirror --once (sets a and b)",
    "shallow: steady state (a and b minus a)",
)
KIND = Kind("mirror", "Shallow mirror (issue 9)", "GB", "{:.0f} MB", 1e3, NAMES, 1 / 3, False)


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
    work = Path(tempfile.mkdtemp(prefix="kipbench-mirror-"))
    with start_tansu() as source, start_tansu() as shallow, start_tansu() as deep_dest:
        size, loaded = {"a": args.gigabytes, "b": args.extra_gigabytes}, {}
        for name, topics in SETS.items():
            load = {"bootstrap": source.bootstrap, "topics": topics, "partitions": 4, "size": 1024}
            load["bytes"] = int(size[name] * 1e9)
            loaded[name] = run_json(LOAD, "mirror-load", json.dumps(load), timeout=1800)
        src, dests = (
            Managed("source", source.proc),
            [Managed(n, b.proc) for n, b in (("s", shallow), ("d", deep_dest))],
        )
        copy = {"source": source.bootstrap, "dest": deep_dest.bootstrap, "topics": SETS["a"]}
        deep = [
            sys.executable,
            str(LOAD),
            "deep",
            json.dumps({**copy, "records": loaded["a"]["records"]}),
        ]
        runs: dict[str, list[TreeRun]] = {"deep": [], "a": [], "ab": []}
        for rep in range(args.reps):
            runs["deep"].append(timed([src, dests[1]], "deep mirror", deep))
            for name, pattern in (("a", "bench-a-.*"), ("ab", "bench-[ab]-.*")):
                once = INSTALLED.command(
                    "mirror", "--source", source.bootstrap, "--dest", shallow.bootstrap
                )
                once += ["--topics", pattern, "--once", "--rename", f"{name}{rep}."]
                once += ["--checkpoint", str(work / f"ck-{name}-{rep}")]
                runs[name].append(timed([src, dests[0]], "kipside mirror", once, spark=True))
    gb = {k: v["bytes"] / 1e9 for k, v in loaded.items()}
    med = Steady.of(runs, (gb["a"], gb["a"], gb["a"] + gb["b"]))
    records = " + ".join(f"{v['records']:,}" for v in loaded.values())
    data = f"Data: {gb['a']:.2f} GB + {gb['b']:.2f} GB of JSON-like values ({records} records of "
    data += f"about 1024 B); median of {args.reps} runs each."
    report(KIND, med, data, args.reps).publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
