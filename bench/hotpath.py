"""Hot path: kipside's cost per request against a bare relay, haproxy and tansu proxy.

    .venv/bin/python bench/hotpath.py [--seconds 6] [--repeats 3] [--paths direct,relay,...]
        [--workloads A,B] [--baseline-refs c0e66f7,main] [--profile] [--profile-only]
        [--profile-path kipside] [--quick]

A: one closed-loop producer (one Produce request per record, one in flight) on every path.
B: 32 closed-loop producers with mixed acks and codecs on direct, kipside and each earlier
kipside, then every acknowledged record checked exactly once, in order. kipside runs from a
snapshot of the working tree, kipside@REF from each git ref of --baseline-refs (the path name
"before" in --paths stands for all of them). --profile adds one run of A with py-spy on the
proxy; --profile-only makes that run alone. docs/performance.md ("Hot path") says what each
measures.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from _chart import Bars
from _harness import INSTALLED, HarnessError, at_ref, open_stack, snapshot
from _measure import Run, fleet, measure, worker
from _report import Compare, Compared, Report, Table, Target, facts, listed, parse_args

A_PATHS = ["direct", "relay", "haproxy", "tansu-proxy", "kipside", "before"]
B_PATHS = ("direct", "kipside", "before")
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--seconds": (float, 6.0, "measured seconds per run"),
    "--warm-up": (float, 1.0, "closed-loop seconds before that"),
    "--repeats": (int, 3, "repetitions (median reported)"),
    "--paths": (listed(str, A_PATHS), A_PATHS, "a comma-separated subset"),
    "--workloads": (listed(str.upper, ["A", "B"]), ["A", "B"], "a comma-separated subset of A,B"),
    "--baseline-refs": (listed(str), ["c0e66f7"], "git refs of earlier kipside versions"),
    "--profile": (bool, False, "one extra run of A under py-spy"),
    "--profile-only": (bool, False, "only that run: its section alone is written"),
    "--profile-path": (str, "kipside", "kipside or kipside@REF"),
}
QUICK = {"repeats": 1, "seconds": 1.0, "warm_up": 0.2}
A_COLUMNS = [
    ("requests/s", "{msgs_per_s:,.0f}"),
    ("p50 / p99 ms", "{p50_ms:.3f} / {p99_ms:.3f}"),
    ("added p50 ms", "{p50_ms_add:+.3f}"),
    ("proxy CPU us/request", "{proxy_cpu_per_m:.1f}"),
    ("Tansu CPU us/request", "{broker_cpu_per_m:.1f}"),
    ("client CPU us/request", "{client_cpu_per_m:.1f}"),
    ("Produce requests/record", "{reqs_per_record:.3f}"),
]
B_COLUMNS = [
    ("delivered msgs/s", "{msgs_per_s:,.0f}"),
    ("vs direct", "{msgs_per_s_vs:.2f}x"),
    ("p50 / p99 ms", "{p50_ms:.2f} / {p99_ms:.2f}"),
    ("client Produce requests", "{client_reqs:,.0f}"),
    ("upstream Produce requests", "{upstream_reqs:,.0f}"),
    ("client / upstream", "{ratio:.2f}x"),
    ("Tansu CPU s/M msgs", "{broker_cpu_per_m:.1f}"),
    ("kipside CPU s/M msgs", "{proxy_cpu_per_m:.1f}"),
    ("duplicates, missing, out of order (all repetitions)", "{checks}"),
]
B_RULES = "coalescing:\n  enabled: true\n  linger_ms: 0\n"
CHECKS = ("duplicates", "missing", "out_of_order")
RATE_HZ = 100
LIMITS = [
    ("A: kipside proxy CPU per request <= tansu-proxy's", "A proxy_cpu_per_m", "tansu-proxy", 1.0),
    ("A (stretch): kipside proxy CPU per request <= 1.3x relay", "A proxy_cpu_per_m", "relay", 1.3),
    ("A: kipside requests/s >= 0.9x the relay's", "A msgs_per_s", "relay", -0.9),
    ("B: kipside delivered msgs/s >= 1.0x direct", "B msgs_per_s", "direct", -1.0),
]
"""(name, "workload metric", other path, limit): kipside / other at most the limit, or at least
minus the limit when it is negative."""
ADDED = "A: kipside added p50 <= 0.2 ms vs direct"
TARGETS = [Compare(ADDED, "p50_ms", "A direct", 0.2, False, True, "A kipside")]
TARGETS += [
    Compare(name, what[2:], f"{what[0]} {other}", abs(limit), limit < 0, case=f"{what[0]} kipside")
    for name, what, other, limit in LIMITS
]
CHART = [
    Bars("A: proxy CPU us per request", "proxy_cpu_per_m", "{:.1f}", "tansu-proxy", 1, 0, "tansu"),
    Bars("A: requests/s (one in flight)", "msgs_per_s", "{:,.0f}", "relay", 0.9, 0, "0.9x relay"),
]
BENCH = Compared(
    "hotpath",
    "Hot path: cost per request, kipside vs a bare relay, haproxy, tansu proxy",
    {"A (median of {reps})": A_COLUMNS, "B (median of {reps})": B_COLUMNS},
    "direct",
    ["p50_ms", "msgs_per_s"],
    TARGETS,
    CHART,
    "kipside hot path, workload A (median of {reps}, loopback)",
    retries=0,
    tools=["haproxy", "trio"],
    grouped=True,
)


def workload(
    workload: str, path: str, args: argparse.Namespace, during: Any, logdir: Path
) -> dict[str, float]:
    """Workload A or B (then its exactly-once check) on a fresh stack of `path`."""
    load = {"mode": "closed", "seconds": args.seconds, "warm_up_s": args.warm_up}
    load |= {"client_prefix": "bench-hotpath", "topic": "hot" if workload == "A" else "mixed"}
    code, b = args.codes.get(path, INSTALLED), workload == "B"
    with open_stack(path, logdir, code=code, rules=B_RULES if b else None, admin=b) as stack:
        if workload == "A":
            m, _ = fleet(stack, load, [1], partitions=1, during=during(stack) if during else None)
            if m["delivered"] == 0 or m["errors"]:
                raise HarnessError(f"{m['delivered']:.0f} requests, {m['errors']:.0f} errors")
            return m
        m, results = fleet(stack, {**load, "mixed": True}, [8] * 4, partitions=64)
        sent = {k: v for r in results for k, v in r["sequences"].items()}
        check = {"bootstrap": stack.bootstrap, "topic": "mixed", "sent": sent, "seconds": 120}
        found, _ = worker(stack, "verify-sequences", check)
    return {**m, **{k: float(found[k]) for k in CHECKS}}


@contextlib.contextmanager
def py_spy_record(pid: int, seconds: float, raw: Path) -> Iterator[None]:
    """Sample `pid` for `seconds` (whole, at least 1) into `raw`; wait for py-spy on exit."""
    args = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid)]
    args += ["--format", "raw", "--output", str(raw), "--rate", str(RATE_HZ)]
    with raw.with_suffix(".log").open("wb") as log:
        duration = ["--duration", str(max(1, int(seconds)))]
        proc = subprocess.Popen(
            [*args, *duration], stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        yield
    finally:
        try:
            proc.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
    if proc.returncode != 0 or not raw.exists():
        why = raw.with_suffix(".log").read_text(errors="replace").strip()[:300]
        raise HarnessError(f"py-spy failed (code {proc.returncode}): {why}")


def summarise(raw: Path, top: int = 15) -> tuple[int, list[list[str]]]:
    """Busy samples in all, and a table row for each of the `top` functions by own samples."""
    frame = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
    own: Counter[tuple[str, str]] = Counter()
    total: Counter[tuple[str, str]] = Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = [
                (m["function"], m["file"]) if (m := frame.match(f)) else (f, "")
                for f in stack.split(";")
            ]
            own[frames[-1]] += int(count)
            for f in set(frames):
                total[f] += int(count)
    samples = max(1, sum(own.values()))

    def share(n: int) -> str:
        return f"{100 * n / samples:.1f}"

    ranked = enumerate(own.most_common(top), 1)
    rows = [[str(i), f"`{f[0]}`", f[1], str(n), share(n), share(total[f])] for i, (f, n) in ranked]
    return sum(own.values()), rows


def profile(args: argparse.Namespace, path: str) -> None:
    """One extra run of A with py-spy on the proxy; its top functions, in their own section."""
    raw = Path(args.tmp) / "py-spy.txt"

    def during(stack: Any) -> Any:
        return py_spy_record(stack.proxy.popen.pid, args.seconds, raw)

    run = measure(f"A {path}", 0, partial(workload, "A", path, args, during), Path(args.tmp))
    if not run.ok:
        print(f"the profiled run failed: {run.error}", file=sys.stderr)
        return
    samples, rows = summarise(raw)
    m = run.metrics
    what = f"py-spy record --format raw --rate {RATE_HZ} on the proxy during one extra run of A"
    what += f" ({args.seconds:g} s): {samples} busy samples; {m['msgs_per_s']:,.0f} requests/s at"
    what += f" {m['proxy_cpu_per_m']:.1f} proxy CPU us/request (py-spy pauses the process for each"
    what += " sample). own: the function innermost; incl.: anywhere on the stack."
    title = f"Hot path profile: where `{path}` spends its CPU in workload A"
    headers = ["#", "function", "file", "own samples", "own %", "incl. %"]
    found = [Table("Profile", headers, rows, "rllrrr")]
    fx = facts(what, code={path: args.codes[path].label})
    Report(f"hotpath-profile-{path}", title, fx, found).publish(args)


def report(args: argparse.Namespace, runs: list[Run], med: dict[str, Any]) -> Report:
    """The section, with B's checks summed over all repetitions, and the targets on them."""
    checks = {
        case: [sum(r.metrics[c] for r in runs if r.ok and r.case == case) for c in CHECKS]
        for case in med
        if case.startswith("B ")
    }
    for case, sums in checks.items():
        if med[case] is not None:
            med[case]["checks"] = ", ".join(f"{n:.0f}" for n in sums)
    k, bad = med.get("B kipside"), sum(checks.get("B kipside", []))
    fewer = "B: kipside sends >= 8x fewer upstream Produce requests than its clients"
    once = "B: through kipside every acknowledged record exactly once, in order"
    targets = [
        Target(fewer, k["ratio"] >= 8, f"{k['ratio']:.2f}x") if k else Target(fewer, None, "-"),
        Target(once, not bad if k else None, f"{bad:.0f} duplicated, missing or reordered"),
    ]
    for ref in args.baseline_refs:
        for what, key in (
            ("A: proxy CPU per request", "A proxy_cpu_per_m"),
            ("B: kipside CPU per M msgs", "B proxy_cpu_per_m"),
        ):
            workload_, metric = key.split()
            name = f"(no target) {what} vs kipside@{ref}"
            other = f"{workload_} kipside@{ref}"
            compare = Compare(name, metric, other, 9e9, False, case=f"{workload_} kipside")
            targets.append(compare.judge(runs, med))
    code = {p: c.label for p, c in args.codes.items()}
    return BENCH.report(args, runs, med, code=code, targets=targets)


def expand(paths: list[str], refs: list[str]) -> list[str]:
    """The paths, "before" standing for kipside@REF of every ref."""
    return [q for p in paths for q in ([f"kipside@{r}" for r in refs] if p == "before" else [p])]


def main() -> int:
    args = parse_args(__doc__, OPTIONS, QUICK)
    earlier = [f"kipside@{ref}" for ref in args.baseline_refs]
    if args.profile_path not in ("kipside", *earlier):
        sys.exit(f"--profile-path: one of {', '.join(['kipside', *earlier])}")
    with tempfile.TemporaryDirectory(prefix="kipbench-hotpath-") as tmp:
        args.tmp = tmp
        sources = {"kipside": partial(snapshot, Path(tmp) / "now")}
        for i, ref in enumerate(args.baseline_refs):
            sources[f"kipside@{ref}"] = partial(at_ref, ref, Path(tmp) / f"ref{i}")
        paths = expand(args.paths, args.baseline_refs)
        b_paths = expand(list(B_PATHS), args.baseline_refs)
        if args.profile_only:
            args.codes = {args.profile_path: sources[args.profile_path]()}
            profile(args, args.profile_path)
            return 0
        wanted = {*paths, *([args.profile_path] if args.profile else [])}
        args.codes = {path: code() for path, code in sources.items() if path in wanted}
        cases = {
            f"{w} {p}": partial(workload, w, p, args, None)
            for w in args.workloads
            for p in paths
            if w == "A" or p in b_paths
        }
        runs, med = BENCH.run(args, cases)
        report(args, runs, med).publish(args)
        if args.profile and args.profile_path in args.codes:
            profile(args, args.profile_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
