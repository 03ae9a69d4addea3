"""Hot path (issue 11): kipside's cost per request against a bare relay, haproxy and tansu proxy.

    .venv/bin/python bench/hotpath.py [--seconds 6] [--repeats 3] [--paths direct,relay,...]
        [--workloads A,B] [--baseline-ref 823d7af] [--profile] [--profile-path kipside] [--quick]

A: one closed-loop producer (one Produce request per record, one in flight) on every path.
B: 32 closed-loop producers with mixed acks and codecs on direct, kipside and kipside-before,
then every acknowledged record checked exactly once, in order. kipside runs from a snapshot of
the working tree, kipside-before from --baseline-ref. --profile adds one run of A with py-spy
on the proxy. docs/performance.md ("Hot path") says what each measures.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from _chart import Bars, bar_chart
from _fleet import fleet
from _harness import HOST, HarnessError, Stack, at_ref, open_stack, snapshot
from _measure import Run, attempt, medians, repeat, worker
from _report import Compare, Report, Table, Target, doc_args, facts, relative, run_notes, table
from testkit.ports import free_port

A_PATHS = ("direct", "relay", "haproxy", "tansu-proxy", "kipside", "kipside-before")
B_PATHS = ("direct", "kipside", "kipside-before")
B_PRODUCERS, B_PROCESSES, B_PARTITIONS = 32, 4, 64
B_RULES = "coalescing:\n  enabled: true\n  linger_ms: 0\n"
CHECKS = ("duplicates", "missing", "out_of_order")
NOISY = 0.1
TITLE = "Hot path (issue 11): cost per request, kipside vs a bare relay, haproxy, tansu proxy"
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
TARGETS = [
    ("A: kipside proxy CPU per request <= tansu-proxy's", "A proxy_cpu_per_m", "tansu-proxy", 1.0),
    ("A (stretch): kipside proxy CPU per request <= 1.3x relay", "A proxy_cpu_per_m", "relay", 1.3),
    ("A: kipside requests/s >= 0.9x the relay's", "A msgs_per_s", "relay", -0.9),
    ("B: kipside delivered msgs/s >= 1.0x direct", "B msgs_per_s", "direct", -1.0),
    ("(no target) A: proxy CPU per request", "A proxy_cpu_per_m", "kipside-before", 9e9),
    ("(no target) B: kipside CPU per M msgs", "B proxy_cpu_per_m", "kipside-before", 9e9),
]
"""(name, "workload metric", other path, limit): kipside / other at most the limit, or at least
minus the limit when it is negative."""
CHART = [
    Bars("A: proxy CPU us per request", "proxy_cpu_per_m", "{:.1f}", "tansu-proxy", 1, 0, "tansu"),
    Bars("A: requests/s (one in flight)", "msgs_per_s", "{:,.0f}", "relay", 0.9, 0, "0.9x relay"),
]


RATE_HZ = 100
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
HEADERS = ["#", "function", "file", "own samples", "own %", "incl. %"]


@contextlib.contextmanager
def py_spy_record(pid: int, seconds: float, raw: Path) -> Iterator[None]:
    """Sample `pid` for `seconds` (whole, at least 1) into `raw`; wait for py-spy on exit."""
    args = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid)]
    args += ["--format", "raw", "--output", str(raw), "--rate", str(RATE_HZ)]
    args += ["--duration", str(max(1, int(seconds)))]
    with raw.with_suffix(".log").open("wb") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
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
    own: Counter[tuple[str, str]] = Counter()
    total: Counter[tuple[str, str]] = Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = [
                (m["function"], m["file"]) if (m := FRAME.match(f)) else (f, "")
                for f in stack.split(";")
            ]
            own[frames[-1]] += int(count)
            for frame in set(frames):
                total[frame] += int(count)
    samples = max(1, sum(own.values()))
    shares = {k: f"{100 * n / samples:.1f}" for k, n in total.items()}
    ranked = enumerate(own.most_common(top), 1)
    rows = [
        [str(i), f"`{k[0]}`", k[1], str(n), f"{100 * n / samples:.1f}", shares[k]]
        for i, (k, n) in ranked
    ]
    return sum(own.values()), rows


def closed_loop(stack: Stack, args: argparse.Namespace, during: Any = None) -> dict[str, float]:
    """Workload A on a running stack."""
    load = {"topic": "hot", "seconds": args.seconds, "warm_up_s": args.warm_up, "closed_loop": True}
    m, _ = fleet(
        stack, {**load, "client_prefix": "bench-hotpath"}, [1], partitions=1, during=during
    )
    if m["delivered"] == 0 or m["errors"]:
        raise HarnessError(f"{m['delivered']:.0f} requests, {m['errors']:.0f} errors")
    return m


def mixed(stack: Stack, args: argparse.Namespace, admin: int | None) -> dict[str, float]:
    """Workload B on a running stack, then the exactly-once check."""
    load = {"topic": "mixed", "seconds": args.seconds, "warm_up_s": args.warm_up, "mixed": True}
    load |= {"closed_loop": True, "client_prefix": "bench-hotpath"}
    counts = [B_PRODUCERS // B_PROCESSES] * B_PROCESSES
    m, results = fleet(stack, load, counts, partitions=B_PARTITIONS, admin=admin)
    sent = {k: v for r in results for k, v in r["sequences"].items()}
    check = {"bootstrap": stack.bootstrap, "topic": "mixed", "sent": sent, "seconds": 120}
    found, _ = worker(stack, "verify-sequences", check)
    return {**m, **{k: float(found[k]) for k in CHECKS}}


def measure(
    case: str,
    rep: int,
    args: argparse.Namespace,
    body: Callable[..., dict[str, float]] | None = None,
) -> Run:
    workload, path = case.split()
    logdir = Path(tempfile.mkdtemp(prefix=f"{rep}-", dir=args.tmp))
    admin = free_port() if path.startswith("kipside") else None
    extra = (
        ["--admin", f"{HOST}:{admin}", "--rules", str(args.rules)]
        if admin and workload == "B"
        else []
    )
    run = Run(case, rep)
    try:
        with open_stack(path, logdir, kipside_args=extra, code=args.codes.get(path)) as stack:
            if body is None:
                body = (
                    partial(closed_loop, args=args)
                    if workload == "A"
                    else partial(mixed, args=args, admin=admin if extra else None)
                )
            attempt(run, partial(body, stack))
            run.problems = stack.proxy.problems() if stack.proxy else []
    except Exception as exc:
        run.error = str(exc)
    return run


def profile(args: argparse.Namespace) -> None:
    """One extra run of A with py-spy on the proxy; its top functions, in their own section."""
    raw = Path(args.tmp) / "py-spy.txt"

    def profiled(stack: Stack) -> dict[str, float]:
        assert stack.proxy is not None
        return closed_loop(stack, args, py_spy_record(stack.proxy.pid, args.seconds, raw))

    run = measure(f"A {args.profile_path}", 0, args, profiled)
    if not run.ok:
        print(f"the profiled run failed: {run.error}", file=sys.stderr)
        return
    samples, rows = summarise(raw)
    m, label = run.metrics, "after" if args.profile_path == "kipside" else "before"
    what = f"py-spy record --format raw --rate {RATE_HZ} on the proxy during one extra run of A"
    what += f" ({args.seconds:g} s): {samples} busy samples; {m['msgs_per_s']:,.0f} requests/s at"
    what += f" {m['proxy_cpu_per_m']:.1f} proxy CPU us/request (py-spy pauses the process for each"
    what += " sample). own: the function innermost; incl.: anywhere on the stack."
    title = f"Hot path profile, {label}: where `{args.profile_path}` spends its CPU in workload A"
    code = {args.profile_path: args.codes[args.profile_path].label}
    found = [Table("Profile", HEADERS, rows, "rllrrr")]
    Report(f"hotpath-profile-{label}", title, facts(what, code=code), found).publish(args)


def targets(runs: list[Run], med: dict[str, dict[str, float] | None]) -> list[Target]:
    added = "A: kipside added p50 <= 0.2 ms vs direct"
    out = [Compare(added, "p50_ms", "A direct", 0.2, False, True, "A kipside")]
    for name, what, other, limit in TARGETS:
        w, key = what.split()
        out.append(Compare(name, key, f"{w} {other}", abs(limit), limit < 0, case=f"{w} kipside"))
    found = [t.judge(runs, med) for t in out]
    k = med.get("B kipside")
    fewer = "B: kipside sends >= 8x fewer upstream Produce requests than its clients"
    found.append(
        Target(fewer, k["ratio"] >= 8, f"{k['ratio']:.2f}x") if k else Target(fewer, None, "-")
    )
    once = "B: through kipside every acknowledged record exactly once, in order"
    bad = sum(r.metrics[c] for r in runs if r.ok and r.case == "B kipside" for c in CHECKS)
    found.append(
        Target(once, not bad if k else None, f"{bad:.0f} duplicated, missing or reordered")
    )
    return found


def report(args: argparse.Namespace, runs: list[Run]) -> Report:
    tables, med = [], {}
    for w, columns in (("A", A_COLUMNS), ("B", B_COLUMNS)):
        paths = [p for p in args.paths if f"{w} {p}" in {r.case for r in runs}]
        found = {p: medians(runs, f"{w} {p}") for p in paths}
        relative(found, "direct", ["p50_ms", "msgs_per_s"])
        for p, m in found.items():
            med[f"{w} {p}"] = m
            if m is not None and w == "B":
                checks = [
                    sum(r.metrics[c] for r in runs if r.ok and r.case == f"B {p}") for c in CHECKS
                ]
                m["checks"] = ", ".join(f"{c:.0f}" for c in checks)  # type: ignore[assignment]
        if paths:
            tables.append(table(f"{w} (median of {args.repeats})", paths, found, columns))
    more = f"Repetitions: {args.repeats}, paths interleaved (order rotated); median reported."
    a_med = {p: med.get(f"A {p}") for p in args.paths}
    title = f"kipside hot path, workload A (median of {args.repeats}, loopback)"
    draw = partial(bar_chart, panels=[b.panel(a_med, args.paths) for b in CHART], title=title)
    chart = ("proxy CPU per request and requests/s per path", draw)
    code = {p: c.label for p, c in args.codes.items()}
    fx, notes = facts(more, tools=["haproxy", "trio"], code=code), run_notes(runs, NOISY)
    return Report("hotpath", TITLE, fx, tables, targets(runs, med), notes, chart)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per run")
    ap.add_argument("--warm-up", type=float, default=1.0, help="closed-loop seconds before that")
    ap.add_argument("--repeats", type=int, default=3, help="repetitions (median reported)")
    ap.add_argument("--paths", default=",".join(A_PATHS), help="a comma-separated subset")
    ap.add_argument("--workloads", default="A,B", help="a comma-separated subset of A,B")
    ap.add_argument("--baseline-ref", default="823d7af", help="git ref for kipside-before")
    ap.add_argument("--profile", action="store_true", help="one extra run of A under py-spy")
    ap.add_argument("--profile-path", choices=("kipside", "kipside-before"), default="kipside")
    ap.add_argument("--quick", action="store_true", help="one short repetition: a smoke test")
    doc_args(ap)
    args = ap.parse_args(argv)
    args.paths, args.workloads = args.paths.split(","), args.workloads.upper().split(",")
    if set(args.paths) - set(A_PATHS) or set(args.workloads) - {"A", "B"}:
        ap.error(f"--paths: choose from {','.join(A_PATHS)}; --workloads from A,B")
    if args.quick:
        args.repeats, args.seconds, args.warm_up = 1, 1.0, 0.2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kipbench-hotpath-") as tmp:
        args.tmp, args.rules, args.codes = tmp, Path(tmp) / "rules.yaml", {}
        args.rules.write_text(B_RULES)
        wanted = {*args.paths, *([args.profile_path] if args.profile else [])}
        sources = {"kipside": partial(snapshot, Path(tmp) / "now")}
        sources["kipside-before"] = partial(at_ref, args.baseline_ref, Path(tmp) / "ref")
        for path in ("kipside", "kipside-before"):
            if path in wanted:
                with contextlib.suppress(HarnessError):
                    args.codes[path] = sources[path]()
                if path not in args.codes:
                    print(f"{path} does not start; skipping it", file=sys.stderr)
                    args.paths = [p for p in args.paths if p != path]
        cases = [f"{w} {p}" for w in args.workloads for p in args.paths if w == "A" or p in B_PATHS]
        runs = repeat(
            cases, args.repeats, lambda c, rep: measure(c, rep, args), noisy=9.0, retries=0
        )
        report(args, runs).publish(args)
        if args.profile and args.profile_path in args.codes:
            profile(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
