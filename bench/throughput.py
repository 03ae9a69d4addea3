"""Throughput and latency of one Kafka client through kipside vs. direct, tansu proxy, haproxy.

    .venv/bin/python bench/throughput.py [--seconds S] [--messages N] [--repeats R]

For each path (direct to Tansu, through kipside, through `tansu proxy`, through haproxy in plain
TCP mode) and each repetition, a fresh in-memory Tansu (and proxy) is started and three
confluent-kafka workloads run, each in its own process (bench/_workload.py):

1. latency probe: PROBE_MESSAGES records paced at PROBE_RATE msgs/s, linger.ms=0, acks=all;
   per-message delivery-report latency (produce() to delivery callback) without queueing;
2. producer: up to --messages 100 B records as fast as possible (linger.ms=5, acks=all), capped
   at --seconds; msgs/s, MB/s and delivery-report latency under saturation;
3. consumer: a fresh consumer assigned to every partition from the beginning reads them all.

CPU seconds of the proxy and of Tansu are taken with psutil around the producer and consumer
runs. Paths are interleaved (rep 1 of every path, then rep 2, ...) so drift hits them alike, and
the median of the repetitions is reported. Prints a table and rewrites the `throughput` section
of docs/performance.md together with docs/img/throughput.png.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    PATHS,
    Stack,
    exit_cleanly_on_sigterm,
    kipside_available,
    on_stack,
    run_worker,
    wait_until_quiet,
)
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

SECTION = "throughput"
RECORD_SIZE = 100
PROBE_MESSAGES = 2000
PROBE_RATE = 1000
TPUT_TOPIC = "bench-throughput"
PROBE_TOPIC = "bench-probe"
# librdkafka pauses fetching for fetch.queue.backoff.ms (default 1000 ms) whenever its local
# queue holds queued.min.messages (default 100k). A fast path fills that queue and then idles
# for a second, so by default the *faster* path measures slower. Back off briefly instead.
CONSUMER_CONFIG: dict[str, Any] = {"fetch.queue.backoff.ms": 5}

LATENCY_BUDGET_MS = 0.5
# A run during which the rest of the machine kept more than this many cores busy is flagged.
NOISE_CORES = 0.1
THROUGHPUT_RATIO = 0.9


@dataclass
class Run:
    """One repetition of the three workloads on one path."""

    path: str
    rep: int
    metrics: dict[str, float] = field(default_factory=dict)
    capped: bool = False
    error: str | None = None
    log_problems: list[str] = field(default_factory=list)
    attempts: int = 1


METRICS: dict[str, str] = {
    "prod_msgs": "produce msgs/s",
    "prod_mb": "produce MB/s",
    "prod_p50": "produce p50 ms (saturated)",
    "prod_p99": "produce p99 ms (saturated)",
    "probe_p50": "probe p50 ms",
    "probe_p99": "probe p99 ms",
    "cons_msgs": "consume msgs/s",
    "cons_mb": "consume MB/s",
    "proxy_cpu_prod": "proxy CPU s (produce)",
    "proxy_cpu_cons": "proxy CPU s (consume)",
    "broker_cpu_prod": "Tansu CPU s (produce)",
    "broker_cpu_cons": "Tansu CPU s (consume)",
    "client_cpu_prod": "client CPU s (produce)",
    "client_cpu_cons": "client CPU s (consume)",
    "proxy_us_msg": "proxy CPU us/msg",
    "proxy_us_req": "proxy CPU us/request (probe: one record per request)",
    "messages": "messages",
    "noise_cores": "other processes' CPU (cores) during the runs",
}


def _noisy(run: Run) -> bool:
    return run.error is None and run.metrics["noise_cores"] > NOISE_CORES


def _progress(run: Run, seconds: float) -> None:
    head = f"[rep {run.rep}] {run.path:12s}"
    if run.error is not None:
        print(f"{head} FAILED\n{run.error}", file=sys.stderr)
        return
    m = run.metrics
    print(
        f"{head} produce {_k(m['prod_msgs'])}/s consume {_k(m['cons_msgs'])}/s "
        f"probe p50 {m['probe_p50']:.3f} ms other load {m['noise_cores']:.2f} cores "
        f"({seconds:.1f} s)",
        file=sys.stderr,
    )


def measure(path: str, rep: int, args: argparse.Namespace, logroot: Path, attempt: int = 1) -> Run:
    run = Run(path, rep, attempts=attempt)
    logdir = logroot / f"{path}-{rep}-{attempt}"
    logdir.mkdir()
    wait_until_quiet(timeout=args.quiet_wait)
    _, run.error, run.log_problems = on_stack(
        path, lambda stack: _measure_on(stack, run, args), logdir=logdir
    )
    return run


def _measure_on(stack: Stack, run: Run, args: argparse.Namespace) -> None:
    boot = stack.bootstrap
    run_worker(
        stack,
        "create-topics",
        {"bootstrap": boot, "topics": [TPUT_TOPIC, PROBE_TOPIC], "partitions": args.partitions},
    )
    probe = run_worker(
        stack,
        "probe",
        {
            "bootstrap": boot,
            "topic": PROBE_TOPIC,
            "messages": args.probe_messages,
            "rate": args.probe_rate,
            "size": RECORD_SIZE,
            "linger_ms": 0,
            "acks": "all",
        },
    )
    prod = run_worker(
        stack,
        "produce",
        {
            "bootstrap": boot,
            "topic": TPUT_TOPIC,
            "messages": args.messages,
            "seconds": args.seconds,
            "size": RECORD_SIZE,
            "linger_ms": 5,
            "acks": "all",
        },
    )
    produced = int(prod.data["messages"])
    cons = run_worker(
        stack,
        "consume",
        {
            "bootstrap": boot,
            "topic": TPUT_TOPIC,
            "messages": produced,
            "seconds": args.seconds,
            "config": CONSUMER_CONFIG,
        },
    )
    run.capped = bool(prod.data["time_capped"] or cons.data["time_capped"])
    proxy_cpu = prod.proxy_cpu_s + cons.proxy_cpu_s
    measured = (probe, prod, cons)
    noise = sum(w.other_cpu_s for w in measured) / sum(w.wall_s for w in measured)
    run.metrics = {
        "prod_msgs": prod.data["msgs_per_s"],
        "prod_mb": prod.data["mb_per_s"],
        "prod_p50": prod.data["latency_p50_ms"],
        "prod_p99": prod.data["latency_p99_ms"],
        "probe_p50": probe.data["latency_p50_ms"],
        "probe_p99": probe.data["latency_p99_ms"],
        "cons_msgs": cons.data["msgs_per_s"],
        "cons_mb": cons.data["mb_per_s"],
        "proxy_cpu_prod": prod.proxy_cpu_s,
        "proxy_cpu_cons": cons.proxy_cpu_s,
        "broker_cpu_prod": prod.broker_cpu_s,
        "broker_cpu_cons": cons.broker_cpu_s,
        "client_cpu_prod": prod.data["client_cpu_s"],
        "client_cpu_cons": cons.data["client_cpu_s"],
        "proxy_us_msg": proxy_cpu / (produced + cons.data["messages"]) * 1e6,
        "proxy_us_req": probe.proxy_cpu_s / probe.data["messages"] * 1e6,
        "messages": float(produced),
        "noise_cores": noise,
    }


def medians(runs: list[Run]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for path in dict.fromkeys(r.path for r in runs):
        ok = [r for r in runs if r.path == path and r.error is None]
        if ok:
            out[path] = {k: statistics.median(r.metrics[k] for r in ok) for k in METRICS}
    return out


# --------------------------------------------------------------------------- formatting


def _k(v: float) -> str:
    return f"{v / 1000:,.0f} k"


def _f(digits: int) -> Callable[[float], str]:
    return lambda v: f"{v:.{digits}f}"


def result_rows(med: dict[str, dict[str, float]], paths: list[str]) -> list[list[str]]:
    direct = med.get("direct")
    rows: list[list[str]] = []
    for path in paths:
        m = med.get(path)
        if m is None:
            rows.append([path] + ["failed"] + [""] * 9)
            continue

        def ratio(key: str, m: dict[str, float] = m) -> str:
            return f"{m[key] / direct[key]:.2f}x" if direct else "-"

        added = f"{m['probe_p50'] - direct['probe_p50']:+.3f}" if direct else "-"
        rows.append(
            [
                path,
                _k(m["prod_msgs"]),
                f"{m['prod_mb']:.1f}",
                ratio("prod_msgs"),
                f"{m['prod_p50']:.1f} / {m['prod_p99']:.1f}",
                f"{m['probe_p50']:.3f} / {m['probe_p99']:.3f}",
                added,
                _k(m["cons_msgs"]),
                f"{m['cons_mb']:.1f}",
                ratio("cons_msgs"),
            ]
        )
    return rows


RESULT_HEADERS = [
    "path",
    "produce msgs/s",
    "produce MB/s",
    "vs direct",
    "produce p50 / p99 ms (saturated)",
    "probe p50 / p99 ms",
    "added probe p50 ms",
    "consume msgs/s",
    "consume MB/s",
    "vs direct",
]

CPU_HEADERS = [
    "path",
    "messages",
    "proxy CPU s produce / consume",
    "proxy CPU us/msg",
    "proxy CPU us/request (probe)",
    "Tansu CPU s produce / consume",
    "client CPU s produce / consume",
]


def cpu_rows(med: dict[str, dict[str, float]], paths: list[str]) -> list[list[str]]:
    rows = []
    for path in paths:
        m = med.get(path)
        if m is None:
            rows.append([path, "failed", "", "", "", "", ""])
            continue
        proxied = path != "direct"
        rows.append(
            [
                path,
                f"{m['messages']:,.0f}",
                f"{m['proxy_cpu_prod']:.2f} / {m['proxy_cpu_cons']:.2f}" if proxied else "-",
                f"{m['proxy_us_msg']:.2f}" if proxied else "-",
                f"{m['proxy_us_req']:.0f}" if proxied else "-",
                f"{m['broker_cpu_prod']:.2f} / {m['broker_cpu_cons']:.2f}",
                f"{m['client_cpu_prod']:.2f} / {m['client_cpu_cons']:.2f}",
            ]
        )
    return rows


RUN_HEADERS = [
    "rep",
    "path",
    "produce msgs/s",
    "produce p50 / p99 ms",
    "probe p50 / p99 ms",
    "consume msgs/s",
    "proxy CPU s",
    "Tansu CPU s",
    "other load (cores)",
]


def _rep(run: Run) -> str:
    return f"{run.rep} (attempt {run.attempts})" if run.attempts > 1 else str(run.rep)


def run_rows(runs: list[Run]) -> list[list[str]]:
    rows = []
    for r in sorted(runs, key=lambda r: (r.rep, r.path)):
        if r.error is not None:
            first = r.error.strip().splitlines()[0][:80]
            rows.append([_rep(r), r.path, f"error: {first}", "", "", "", "", "", ""])
            continue
        m = r.metrics
        rows.append(
            [
                _rep(r),
                r.path,
                _k(m["prod_msgs"]) + (" (time-capped)" if r.capped else ""),
                f"{m['prod_p50']:.1f} / {m['prod_p99']:.1f}",
                f"{m['probe_p50']:.3f} / {m['probe_p99']:.3f}",
                _k(m["cons_msgs"]),
                f"{m['proxy_cpu_prod'] + m['proxy_cpu_cons']:.2f}",
                f"{m['broker_cpu_prod'] + m['broker_cpu_cons']:.2f}",
                f"{m['noise_cores']:.2f}" + (" (noisy)" if m["noise_cores"] > NOISE_CORES else ""),
            ]
        )
    return rows


@dataclass
class Target:
    name: str
    status: str  # "met", "missed", "not measured"
    detail: str


def _per_rep(runs: list[Run], a: str, b: str, fn: Callable[[Run, Run], float]) -> list[float]:
    """fn(run of path a, run of path b) for every repetition where both succeeded."""
    ok = {(r.path, r.rep): r for r in runs if r.error is None}
    reps = sorted({r.rep for r in runs})
    return [fn(ok[(a, rep)], ok[(b, rep)]) for rep in reps if (a, rep) in ok and (b, rep) in ok]


def _spread(values: list[float], fmt: str) -> str:
    if len(values) < 2:
        return ""
    return f"; per repetition {fmt.format(min(values))} to {fmt.format(max(values))}"


def evaluate_targets(med: dict[str, dict[str, float]], runs: list[Run]) -> list[Target]:
    """The targets, each with the medians' verdict and the spread over paired repetitions."""
    k, d, t = med.get("kipside"), med.get("direct"), med.get("tansu-proxy")
    out: list[Target] = []

    def ratios(other: str, key: str) -> str:
        vals = _per_rep(runs, "kipside", other, lambda a, b: a.metrics[key] / b.metrics[key])
        return _spread(vals, "{:.2f}x")

    def add(name: str, ok: bool | None, detail: str) -> None:
        status = "not measured" if ok is None else ("met" if ok else "missed")
        out.append(Target(name, status, detail))

    for key, what in (("prod_msgs", "producer"), ("cons_msgs", "consumer")):
        name = f"kipside {what} throughput >= {THROUGHPUT_RATIO}x direct"
        if k and d:
            ratio = k[key] / d[key]
            detail = f"{ratio:.2f}x ({_k(k[key])} vs {_k(d[key])}{ratios('direct', key)})"
            add(name, ratio >= THROUGHPUT_RATIO, detail)
        else:
            add(name, None, "kipside or direct has no result")
    for key, what in (("prod_msgs", "producer"), ("cons_msgs", "consumer")):
        name = f"kipside {what} throughput >= tansu proxy"
        if k and t:
            ratio = k[key] / t[key]
            detail = f"{ratio:.2f}x ({_k(k[key])} vs {_k(t[key])}{ratios('tansu-proxy', key)})"
            add(name, ratio >= 1.0, detail)
        else:
            add(name, None, "kipside or tansu proxy has no result")
    name = f"added p50 produce latency <= {LATENCY_BUDGET_MS} ms vs direct (probe)"
    if k and d:
        added = k["probe_p50"] - d["probe_p50"]
        diffs = _per_rep(
            runs, "kipside", "direct", lambda a, b: a.metrics["probe_p50"] - b.metrics["probe_p50"]
        )
        add(
            name,
            added <= LATENCY_BUDGET_MS,
            f"{added:+.3f} ms ({k['probe_p50']:.3f} vs {d['probe_p50']:.3f} ms"
            f"{_spread(diffs, '{:+.3f} ms')})",
        )
    else:
        add(name, None, "kipside or direct has no result")
    return out


def chart(med: dict[str, dict[str, float]], paths: list[str], png: Path, reps: int) -> None:
    shown = [p for p in paths if p in med]

    def vals(key: str, scale: float = 1.0) -> list[float | None]:
        return [med[p][key] * scale for p in shown]

    direct = med.get("direct")
    panels = [
        Panel(
            "Producer (100 B, linger 5 ms, acks=all)",
            "k msgs/s",
            shown,
            vals("prod_msgs", 1e-3),
            fmt="{:,.0f}",
            reference=direct["prod_msgs"] * 1e-3 * THROUGHPUT_RATIO if direct else None,
            reference_label=f"{THROUGHPUT_RATIO}x direct",
        ),
        Panel(
            "Consumer (assigned, from the beginning)",
            "k msgs/s",
            shown,
            vals("cons_msgs", 1e-3),
            fmt="{:,.0f}",
            reference=direct["cons_msgs"] * 1e-3 * THROUGHPUT_RATIO if direct else None,
            reference_label=f"{THROUGHPUT_RATIO}x direct",
        ),
        Panel(
            f"Produce latency p50, probe at {PROBE_RATE} msgs/s",
            "ms",
            shown,
            vals("probe_p50"),
            fmt="{:.3f}",
            reference=direct["probe_p50"] + LATENCY_BUDGET_MS if direct else None,
            reference_label=f"direct + {LATENCY_BUDGET_MS} ms",
        ),
        Panel(
            "Proxy CPU per message (produce + consume)",
            "CPU us/msg",
            shown,
            [med[p]["proxy_us_msg"] if p != "direct" else None for p in shown],
            fmt="{:.2f}",
            missing="no proxy",
        ),
    ]
    bar_chart(png, panels, f"kipside throughput benchmark (median of {reps} runs, loopback)")


def section(
    args: argparse.Namespace,
    runs: list[Run],
    med: dict[str, dict[str, float]],
    paths: list[str],
    targets: list[Target],
    skipped: dict[str, str],
    png: Path,
    started: str,
    wall: float,
    load: float,
) -> str:
    facts = facts_markdown(command_line(), started, machine_info(), versions())
    lines = [
        "## Throughput and latency: direct vs kipside vs tansu proxy vs haproxy",
        "",
        "Written by `bench/throughput.py`. One confluent-kafka client per measurement, in its "
        "own process, against a fresh in-memory Tansu per path and repetition "
        f"({args.partitions} partition(s) per topic); "
        f"{RECORD_SIZE} B records, no keys, no compression. MB/s counts record values only.",
        "",
        facts.rstrip(),
        f"- Repetitions: {args.repeats} per path, interleaved; median reported. "
        f"Wall time {wall:.0f} s; 1-minute load average {load:.2f} when it started.",
        "",
        "Workloads:",
        f"- **probe**: {args.probe_messages} records at {args.probe_rate} msgs/s, linger.ms=0, "
        "acks=all; latency = produce() to delivery report (librdkafka `Message.latency()`). "
        "No queueing, so the difference to direct is the latency the path adds.",
        f"- **producer**: up to {args.messages:,} records as fast as one producer can "
        f"(linger.ms=5, acks=all), stopped after {args.seconds:g} s if not done. Its p50/p99 is "
        "the same delivery-report latency at saturation: mostly time in librdkafka's queue.",
        "- **consumer**: a fresh consumer `assign()`ed to every partition at the beginning "
        "reads everything the producer wrote (`fetch.queue.backoff.ms=5`: with librdkafka's "
        "default of 1000 ms a consumer that fills its local queue idles for a second, which "
        "penalises the faster paths).",
        "- **haproxy** is a plain TCP relay (no Kafka awareness); its Tansu advertises the "
        "haproxy port so all traffic goes through it. It is the floor for proxy overhead.",
        "- All processes share the machine's CPUs: proxy CPU time is taken from the client "
        "and the broker, as it would be for a sidecar.",
        "",
        f"### Results (median of {args.repeats})",
        "",
        markdown_table(RESULT_HEADERS, result_rows(med, paths)).rstrip(),
        "",
        markdown_table(CPU_HEADERS, cpu_rows(med, paths)).rstrip(),
        "",
        "### Targets",
        "",
    ]
    for t in targets:
        mark = {"met": "met", "missed": "**MISSED**", "not measured": "not measured"}[t.status]
        lines.append(f"- {t.name}: {mark}: {t.detail}")
    notes: list[str] = []
    for path, why in skipped.items():
        notes.append(f"`{path}` was not measured: `{why}`")
    for r in runs:
        if r.error is not None:
            first = r.error.strip().splitlines()[0]
            notes.append(f"`{r.path}` rep {r.rep} failed: `{first[:200]}`")
        for problem in r.log_problems[:5]:
            notes.append(f"`{r.path}` rep {r.rep} logged: `{problem[:200]}`")
    repeated = [r for r in runs if r.attempts > 1]
    if repeated:
        notes.append(
            f"{len(repeated)} run(s) were measured again because other processes kept more "
            f"than {NOISE_CORES} cores busy during them (only the last attempt counts)."
        )
    noisy = [r for r in runs if _noisy(r)]
    if noisy:
        notes.append(
            f"**{len(noisy)} of {len(runs)} run(s) shared the machine with other load** "
            f"(> {NOISE_CORES} cores busy outside this benchmark, see 'other load' under "
            "'Every run'): their numbers are depressed; re-run on an idle machine."
        )
    capped = [r for r in runs if r.capped]
    if capped:
        notes.append(
            f"{len(capped)} run(s) hit the {args.seconds:g} s cap "
            "(rates are over what was done in that time)."
        )
    if notes:
        lines += ["", "### Notes on this run", "", *(f"- {n}" for n in notes)]
    rel_png = png.relative_to(IMG_DIR.parent) if png.is_relative_to(IMG_DIR.parent) else png
    lines += [
        "",
        f"![Throughput, latency and proxy CPU per path]({rel_png.as_posix()})",
        "",
        "<details><summary>Every run</summary>",
        "",
        markdown_table(RUN_HEADERS, run_rows(runs)).rstrip(),
        "",
        "</details>",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--messages", type=int, default=2_000_000, help="records per producer run")
    ap.add_argument(
        "--seconds", type=float, default=8.0, help="cap on each producer and consumer run"
    )
    ap.add_argument("--repeats", type=int, default=3, help="repetitions per path (median)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions per topic")
    ap.add_argument("--probe-messages", type=int, default=PROBE_MESSAGES)
    ap.add_argument("--probe-rate", type=float, default=PROBE_RATE, help="probe msgs/s")
    ap.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"comma-separated subset of {','.join(PATHS)}",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=3.0,
        help="before each run, wait up to this many seconds for the machine to be idle",
    )
    ap.add_argument(
        "--noisy-retries",
        type=int,
        default=2,
        help="measure a run again (up to this many times) if other load ran during it",
    )
    ap.add_argument(
        "--retry-budget",
        type=float,
        default=150.0,
        help="no more noisy-run retries once the benchmark has run this many seconds",
    )
    ap.add_argument("--no-doc", action="store_true", help="print only; leave docs/ alone")
    ap.add_argument("--png", type=Path, default=IMG_DIR / "throughput.png")
    args = ap.parse_args(argv)
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = set(args.paths) - set(PATHS)
    if unknown:
        ap.error(f"unknown path(s): {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_cleanly_on_sigterm()
    started = utc_now()
    load = os.getloadavg()[0]
    t_start = time.monotonic()
    paths: list[str] = list(args.paths)
    skipped: dict[str, str] = {}
    if "kipside" in paths:
        ok, why = kipside_available()
        if not ok:
            print(f"kipside serve is not usable, skipping it: {why}", file=sys.stderr)
            skipped["kipside"] = why
    measured = [p for p in paths if p not in skipped]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="kipbench-throughput-") as tmp:
        for rep in range(1, args.repeats + 1):
            shift = (rep - 1) % len(measured)
            for path in measured[shift:] + measured[:shift]:
                attempt = 1
                while True:
                    t_run = time.monotonic()
                    run = measure(path, rep, args, Path(tmp), attempt)
                    _progress(run, time.monotonic() - t_run)
                    if (
                        not _noisy(run)
                        or attempt > args.noisy_retries
                        or time.monotonic() - t_start > args.retry_budget
                    ):
                        break
                    attempt += 1
                    print(f"[rep {rep}] {path}: other load during the run; again", file=sys.stderr)
                runs.append(run)
    wall = time.monotonic() - t_start
    med = medians(runs)
    targets = evaluate_targets(med, runs)

    print(f"\nmedian of {args.repeats} runs per path ({wall:.0f} s)\n")
    print(text_table(RESULT_HEADERS, result_rows(med, paths)))
    print(text_table(CPU_HEADERS, cpu_rows(med, paths)))
    for t in targets:
        print(f"{t.status.upper():>12}  {t.name}: {t.detail}")
    for path, why in skipped.items():
        print(f"{'SKIPPED':>12}  {path}: {why}")
    noisy = [r for r in runs if _noisy(r)]
    if noisy:
        print(f"{'NOISY':>12}  {len(noisy)} run(s) shared the machine with other load")
    for r in runs:
        for problem in r.log_problems:
            print(f"{'LOGGED':>12}  {r.path} rep {r.rep}: {problem}")

    if not args.no_doc:
        chart(med, paths, args.png, args.repeats)
        body = section(args, runs, med, paths, targets, skipped, args.png, started, wall, load)
        doc = write_section(SECTION, body)
        print(f"\nwrote {doc} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
