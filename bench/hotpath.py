"""Hot path (issue 11): kipside's cost per request against a bare relay, haproxy and tansu proxy.

    .venv/bin/python bench/hotpath.py [--seconds 6] [--repeats 3] [--paths direct,relay,...]
                                      [--baseline-ref 823d7af] [--profile] [--doc FILE]

Paths, each against its own fresh in-memory Tansu, interleaved per repetition:
- direct: the client talks to Tansu;
- relay: bench/_relay.py, a bare trio TCP relay (two tasks per connection, 256 KiB reads, nothing
  parsed): the floor for a proxy in Python on trio; Tansu advertises the relay's port;
- haproxy (plain TCP mode, Tansu advertising its port) and tansu-proxy (Tansu's Rust proxy);
- kipside: the working tree, from a snapshot taken when the benchmark starts;
- kipside-before: kipside at --baseline-ref, extracted with `git archive` into a temp dir.

Workload A, closed loop, on every path: one confluent-kafka producer (linger.ms=0, acks=all,
100 B values) produces a record only once the previous one's delivery report is in, so every
record is one Produce request and one is in flight; --seconds after a --warm-up of the same.
Measured between GO and FINISHED (bench/_staged.py): requests/s, delivery-report latency, and
the proxy's and Tansu's CPU seconds (psutil) per request.

Workload B, 32 request-per-message producers, on direct, kipside and kipside-before: the same
closed loop in 32 producers (8 threads in each of 4 processes) on one topic of 64 partitions,
keyed by (producer, sequence number) so each producer's records spread over the partitions by
the default partitioner; acks alternates 1 / all, every acks=all producer is idempotent, and
compression cycles none, gzip, snappy, lz4, zstd (_coalesce_load.mixed_config). kipside runs with
`coalescing: {enabled: true, linger_ms: 0}` and default lanes. Afterwards the whole topic is read
back and every acknowledged record must be there exactly once, in order per partition.

--profile adds one run of workload A on the profiled path with py-spy attached (not counted in
the results) and writes its top functions to the section `hotpath-profile-LABEL`. Prints tables
and writes the `hotpath` section of --doc, with a chart in img/ beside it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    HOST,
    HarnessError,
    Stack,
    exit_cleanly_on_sigterm,
    kipside_available,
    on_stack,
    run_worker,
    wait_until_quiet,
)
from _hotpath_report import (
    B_PARTITIONS,
    B_PROCESSES,
    B_PRODUCERS,
    RECORD_SIZE,
    Result,
    Run,
    Sources,
    publish,
    run_rows,
)
from _kipside import baseline_tree, produce_counts, snapshot_kipside
from _profile import Profile, py_spy_record, summarise
from _report import DOC, utc_now
from _staged import Window, run_staged

from kipside.proxy.devbroker import free_port

LOAD = Path(__file__).resolve().parent / "_coalesce_load.py"
A_PATHS = ("direct", "relay", "haproxy", "tansu-proxy", "kipside", "kipside-before")
B_PATHS = ("direct", "kipside", "kipside-before")
KIPSIDE_PATHS = ("kipside", "kipside-before")
A_TOPIC, B_TOPIC = "bench-hotpath", "bench-hotpath-mixed"
B_RULES = "coalescing:\n  enabled: true\n  linger_ms: 0\n"
VERIFY_SECONDS = 120.0


def on_path(
    run: Run,
    args: argparse.Namespace,
    sources: Sources,
    body: Callable[[Stack], dict[str, float]],
    kipside_args: Sequence[str] = (),
) -> Run:
    """Measure `body` on a fresh stack of `run.path`: fill in the run and return it."""
    logdir = Path(tempfile.mkdtemp(prefix=f"{run.workload}-{run.path}-", dir=args.logroot))
    wait_until_quiet(timeout=args.quiet_wait)
    metrics, run.error, run.log_problems = on_stack(
        "kipside" if run.path in KIPSIDE_PATHS else run.path,
        body,
        logdir=logdir,
        kipside_args=kipside_args,
        kipside_source=sources.trees.get(run.path),
    )
    run.metrics = metrics or {}
    return run


def _load(stack: Stack, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """Arguments of one closed-loop _coalesce_load.py process."""
    return {
        "bootstrap": stack.bootstrap,
        "size": RECORD_SIZE,
        "seconds": args.seconds,
        "warm_up_s": args.warm_up,
        "closed_loop": True,
        "client_prefix": "bench-hotpath",
        "go_timeout": 120,
        **extra,
    }


def _latency_ms(results: list[dict[str, Any]]) -> tuple[float, float]:
    lat = [v for r in results for v in r["latencies_us"]]
    if len(lat) < 2:
        return float("nan"), float("nan")
    return statistics.median(lat) / 1000, statistics.quantiles(lat, n=100)[98] / 1000


def _topic(stack: Stack, topic: str, partitions: int) -> None:
    args = {"bootstrap": stack.bootstrap, "topics": [topic], "partitions": partitions}
    run_worker(stack, "create-topics", args, timeout=60)


def closed_loop(
    stack: Stack, args: argparse.Namespace, during: AbstractContextManager[object] | None = None
) -> dict[str, float]:
    """Workload A on a running stack: its metrics."""
    _topic(stack, A_TOPIC, 1)
    load = _load(stack, args, topic=A_TOPIC, producers=1, first_index=0)
    w = run_staged(stack, LOAD, [load], seconds=args.seconds, during=during)
    r = w.results[0]
    requests = int(r["delivered"])
    if requests == 0 or r["errors"]:
        raise HarnessError(f"{requests} requests, {r['errors']} errors: {r['first_error']}")
    p50, p99 = _latency_ms(w.results)
    return {
        "requests": requests,
        "rps": requests / (r["end"] - r["start"]),
        "p50_ms": p50,
        "p99_ms": p99,
        "proxy_us_req": w.proxy_cpu_s / requests * 1e6,
        "broker_us_req": w.broker_cpu_s / requests * 1e6,
        "client_us_req": float(r["cpu_s"]) / requests * 1e6,
        "reqs_per_record": int(r["client_produce_requests"]) / requests,
        "noise_cores": w.noise_cores,
    }


def mixed_producers(stack: Stack, args: argparse.Namespace, admin: int | None) -> dict[str, float]:
    """Workload B on a running stack, then the exactly-once check: its metrics."""
    _topic(stack, B_TOPIC, B_PARTITIONS)
    per = [B_PRODUCERS // B_PROCESSES + (i < B_PRODUCERS % B_PROCESSES) for i in range(B_PROCESSES)]
    loads = [
        _load(stack, args, topic=B_TOPIC, producers=n, first_index=sum(per[:i]), mixed=True)
        for i, n in enumerate(per)
    ]
    w = run_staged(stack, LOAD, loads, seconds=args.seconds, admin_port=admin)
    sent = {k: v for r in w.results for k, v in r["sequences"].items()}
    check = run_worker(
        stack,
        "verify-sequences",
        {"bootstrap": stack.bootstrap, "topic": B_TOPIC, "sent": sent, "seconds": VERIFY_SECONDS},
        timeout=VERIFY_SECONDS + 60,
    ).data
    return {**_window_metrics(w), **{k: float(v) for k, v in check.items()}}


def _window_metrics(w: Window) -> dict[str, float]:
    delivered = sum(int(r["delivered"]) for r in w.results)
    span = max(r["end"] for r in w.results) - min(r["start"] for r in w.results)
    client = float(sum(int(r["client_produce_requests"]) for r in w.results))
    upstream = client
    if w.metrics_after:
        upstream = produce_counts(w.metrics_after)[1] - produce_counts(w.metrics_before)[1]
    millions = max(delivered, 1) / 1e6
    p50, p99 = _latency_ms(w.results)
    return {
        "delivered": delivered,
        "errors": sum(int(r["errors"]) for r in w.results),
        "msgs_per_s": delivered / span if span > 0 else 0.0,
        "p50_ms": p50,
        "p99_ms": p99,
        "client_reqs": client,
        "upstream_reqs": upstream,
        "ratio": client / upstream if upstream else float("nan"),
        "broker_cpu_per_m": w.broker_cpu_s / millions,
        "proxy_cpu_per_m": w.proxy_cpu_s / millions,
        "noise_cores": w.noise_cores,
    }


def measure(workload: str, path: str, rep: int, args: argparse.Namespace, sources: Sources) -> Run:
    run = Run(workload, path, rep)
    if workload == "A":
        return on_path(run, args, sources, lambda stack: closed_loop(stack, args))
    admin = free_port(HOST) if path in KIPSIDE_PATHS else None
    extra = ["--admin", f"{HOST}:{admin}", "--rules", str(args.rules)] if admin else []
    return on_path(run, args, sources, lambda stack: mixed_producers(stack, args, admin), extra)


def profile_run(args: argparse.Namespace, sources: Sources) -> tuple[Profile, Run] | str:
    """One extra run of workload A on the profiled path with py-spy attached to the proxy;
    what went wrong if it failed."""
    if args.profile_path in sources.skipped:
        return f"{args.profile_path} is not usable"
    raw = args.logroot / "py-spy.txt"

    def profiled(stack: Stack) -> dict[str, float]:
        assert stack.proxy is not None
        return closed_loop(stack, args, py_spy_record(stack.proxy.pid, args.seconds, raw))

    run = on_path(Run("A", args.profile_path, 0), args, sources, profiled)
    if run.error is not None:
        return run.error
    return summarise(raw, top=args.profile_top), run


def prepare_sources(args: argparse.Namespace, tmp: Path) -> Sources:
    """Snapshot the working tree and extract the baseline, for the kipside paths asked for."""
    sources = Sources()
    wanted = {*args.paths, *([args.profile_path] if args.profile else [])}
    if "kipside" in wanted:
        ok, why, digest = snapshot_kipside(tmp / "working-tree")
        if ok:
            sources.trees["kipside"] = tmp / "working-tree"
            sources.labels["kipside"] = f"working tree (snapshot, sha256 of sources {digest})"
        else:
            sources.skipped["kipside"] = why
    if "kipside-before" in wanted:
        try:
            commit = baseline_tree(args.baseline_ref, tmp / "baseline")
        except RuntimeError as exc:
            sources.skipped["kipside-before"] = str(exc)
        else:
            ok, why = kipside_available(source=tmp / "baseline")
            if ok:
                sources.trees["kipside-before"] = tmp / "baseline"
                sources.labels["kipside-before"] = f"{args.baseline_ref} (commit {commit})"
            else:
                sources.skipped["kipside-before"] = why
    for path, why in sources.skipped.items():
        print(f"{path} is not usable, skipping it: {why}", file=sys.stderr)
    return sources


def _progress(run: Run, seconds: float) -> None:
    rep, workload, path, what, load = run_rows([run])[0]
    if run.error is not None:
        what = f"FAILED\n{run.error}"
    line = f"[rep {rep}] {workload} {path:15s} {what}; other load {load} ({seconds:.0f} s)"
    print(line, file=sys.stderr)


def measure_all(args: argparse.Namespace, sources: Sources) -> list[Run]:
    """Every repetition: workload A on its paths, then B on its paths, each order rotated."""
    plans = [
        ("A", [p for p in args.paths if p not in sources.skipped]),
        ("B", [p for p in args.paths if p in B_PATHS and p not in sources.skipped]),
    ]
    runs: list[Run] = []
    for rep in range(1, args.repeats + 1):
        for workload, paths in plans:
            if workload not in args.workloads or not paths:
                continue
            shift = (rep - 1) % len(paths)
            for path in paths[shift:] + paths[:shift]:
                t = time.monotonic()
                runs.append(measure(workload, path, rep, args, sources))
                _progress(runs[-1], time.monotonic() - t)
    return runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per run")
    ap.add_argument("--warm-up", type=float, default=1.0, help="closed-loop seconds before that")
    ap.add_argument("--repeats", type=int, default=3, help="repetitions (median reported)")
    ap.add_argument("--paths", default=",".join(A_PATHS), help="comma-separated subset")
    ap.add_argument("--workloads", default="A,B", help="comma-separated subset of A,B")
    ap.add_argument("--baseline-ref", default="823d7af", help="git ref for kipside-before")
    ap.add_argument("--profile", action="store_true", help="one extra run of A under py-spy")
    ap.add_argument("--profile-path", choices=KIPSIDE_PATHS, default="kipside")
    ap.add_argument("--profile-label", help="section hotpath-profile-LABEL (default: after/before)")
    ap.add_argument("--profile-top", type=int, default=15, help="functions in the profile table")
    ap.add_argument("--doc", type=Path, default=DOC, help="the markdown file to write")
    ap.add_argument("--no-doc", action="store_true", help="print only")
    ap.add_argument("--quiet-wait", type=float, default=3.0, help="max wait for an idle machine")
    args = ap.parse_args(argv)
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    args.workloads = {w.strip().upper() for w in args.workloads.split(",") if w.strip()}
    if set(args.paths) - set(A_PATHS) or not args.paths:
        ap.error(f"--paths: choose from {','.join(A_PATHS)}")
    if args.workloads - {"A", "B"}:
        ap.error("--workloads: choose from A,B")
    if not 0 < args.seconds <= 120 or args.repeats < 1:
        ap.error("--seconds must be in (0, 120] and --repeats at least 1")
    if args.profile_label is None:
        args.profile_label = "after" if args.profile_path == "kipside" else "before"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_cleanly_on_sigterm()
    started, load, t0 = utc_now(), os.getloadavg()[0], time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="kipbench-hotpath-"))
    args.logroot = tmp / "logs"
    args.logroot.mkdir()
    args.rules = tmp / "rules.yaml"
    args.rules.write_text(B_RULES)
    try:
        sources = prepare_sources(args, tmp)
        runs = measure_all(args, sources)
        profiled = profile_run(args, sources) if args.profile else None
        publish(Result(args, runs, sources, profiled, started, time.monotonic() - t0, load))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
