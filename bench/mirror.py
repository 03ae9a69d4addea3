"""The shallow mirror (`kipside mirror`) against a deep mirror, on the same data.

    .venv/bin/python bench/mirror.py [--gigabytes 1.0] [--extra-gigabytes 3.0] [--reps 3] [--quick]

JSON-like 1 KiB values in a zstd and an lz4 topic of 4 partitions per set: --gigabytes in set
a, --extra-gigabytes in set b. Baseline: the deep mirror (consume, re-produce) of set a. kipside:
`kipside mirror --once` of set a, then of both sets (bench/_steady.py).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _harness import INSTALLED, REPO, Managed
from _measure import run_json
from _report import parse_args
from _steady import Kind, TreeRun, report, timed
from testkit.broker import start_tansu

LOAD = REPO / "bench" / "_data_load.py"
SETS = {
    "a": {"bench-a-zstd": "zstd", "bench-a-lz4": "lz4"},
    "b": {"bench-b-zstd": "zstd", "bench-b-lz4": "lz4"},
}
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--gigabytes": (float, 1.0, "record values in set a"),
    "--extra-gigabytes": (float, 3.0, "and in set b"),
    "--reps": (int, 3, "runs of each kind (median reported)"),
}
ROWS = ("deep: consume + re-produce (set a)", "kipside mirror --once", "set a", "sets a and b")
KIND = Kind("mirror", "Shallow mirror", "GB", "{:.0f} MB", 1e3, ROWS, 1 / 3, False)


def main() -> int:
    args = parse_args(__doc__, OPTIONS, {"gigabytes": 0.02, "extra_gigabytes": 0.02, "reps": 1})
    work = Path(tempfile.mkdtemp(prefix="kipbench-mirror-"))
    runs: dict[str, list[TreeRun]] = {"deep": [], "a": [], "ab": []}
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
            for name, pattern in (("a", "bench-a-.*"), ("ab", "bench-[ab]-.*")):
                once = ["mirror", "--source", source.bootstrap, "--dest", shallow.bootstrap]
                once += ["--topics", pattern, "--once", "--rename", f"{name}{rep}."]
                once += ["--checkpoint", str(work / f"ck-{name}-{rep}")]
                brokers = [src, Managed("s", shallow.proc)]
                runs[name].append(timed(brokers, "kipside mirror", INSTALLED.command(*once)))
    gb = {k: v["bytes"] / 1e9 for k, v in loaded.items()}
    records = " + ".join(f"{v['records']:,}" for v in loaded.values())
    data = f"Data: {gb['a']:.2f} GB + {gb['b']:.2f} GB of JSON-like values ({records} records of "
    data += f"about 1024 B); median of {args.reps} runs each."
    report(KIND, runs, (gb["a"], gb["a"], gb["a"] + gb["b"]), data).publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
