"""What bench/hotpath.py found, as tables, target verdicts, a chart and its docs sections.

Pure formatting of measured runs: nothing here starts a process or measures anything.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from _profile import PROFILE_HEADERS, RATE_HZ, Profile, profile_rows
from _report import (
    PATH_COLORS,
    Panel,
    bar_chart,
    command_line,
    facts_markdown,
    machine_info,
    markdown_table,
    text_table,
    versions,
    write_section,
)

SECTION = "hotpath"
PNG_NAME = "hotpath.png"
# Targets of issue 11.
CPU_VS_TANSU_PROXY = 1.0
STRETCH_CPU_VS_RELAY = 1.3
RPS_VS_RELAY = 0.9
ADDED_P50_MS = 0.2
B_REQUEST_RATIO = 8.0
B_RATE_VS_DIRECT = 1.0
NOISE_CORES = 0.1
# Workload B, and the record size of both.
B_PRODUCERS, B_PROCESSES, B_PARTITIONS = 32, 4, 64
B_PRODUCERS_TEXT = f"{B_PRODUCERS} closed-loop producers"
RECORD_SIZE = 100
VERIFY_KEYS = ("duplicates", "missing", "out_of_order", "unacknowledged_present")


@dataclass
class Run:
    """One workload ("A" or "B") on one path in one repetition (0: the profiled run)."""

    workload: str
    path: str
    rep: int
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    log_problems: list[str] = field(default_factory=list)


@dataclass
class Sources:
    """Where each kipside path's code comes from, and what to call it in the report."""

    trees: dict[str, Path] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass
class Result:
    args: argparse.Namespace
    runs: list[Run]
    sources: Sources
    profiled: tuple[Profile, Run] | str | None
    """The profile and its run, or why there is none (None: not asked for)."""
    started: str
    wall_s: float
    load: float

    def medians(self, workload: str) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for path in self.args.paths:
            ok = [r for r in self.runs if (r.workload, r.path) == (workload, path) and not r.error]
            if ok:
                out[path] = {k: statistics.median(r.metrics[k] for r in ok) for k in ok[0].metrics}
                for key in VERIFY_KEYS if workload == "B" else ():
                    out[path][key] = sum(r.metrics[key] for r in ok)  # every repetition counts
        return out

    def paired(self, workload: str, a: str, b: str, fn: Callable[[Run, Run], float]) -> str:
        """fn over the repetitions where paths a and b both ran: their range, if several."""
        ok = {(r.path, r.rep): r for r in self.runs if r.workload == workload and not r.error}
        reps = [rep for rep in range(1, self.args.repeats + 1) if (a, rep) in ok and (b, rep) in ok]
        vals = [fn(ok[(a, rep)], ok[(b, rep)]) for rep in reps]
        return f"; per repetition {min(vals):.2f} to {max(vals):.2f}" if len(vals) > 1 else ""


# --------------------------------------------------------------------------- tables

A_HEADERS = [
    "path",
    "requests/s",
    "p50 / p99 ms",
    "added p50 ms",
    "proxy CPU us/request",
    "Tansu CPU us/request",
    "client CPU us/request",
    "Produce requests/record",
]
B_HEADERS = [
    "path",
    "delivered msgs/s",
    "vs direct",
    "p50 / p99 ms",
    "client Produce requests",
    "upstream Produce requests",
    "client / upstream",
    "Tansu CPU s/M msgs",
    "kipside CPU s/M msgs",
    "exactly once, in order",
]
RUN_HEADERS = ["rep", "workload", "path", "result", "other load (cores)"]


def _rows(
    med: dict[str, dict[str, float]],
    paths: list[str],
    width: int,
    cells: Callable[[str, dict[str, float]], list[str]],
) -> list[list[str]]:
    missing = ["failed or skipped"] + [""] * (width - 2)
    return [[p, *cells(p, med[p])] if p in med else [p, *missing] for p in paths]


def a_rows(med: dict[str, dict[str, float]], paths: list[str]) -> list[list[str]]:
    d = med.get("direct")

    def cells(path: str, m: dict[str, float]) -> list[str]:
        proxied = path != "direct"
        return [
            f"{m['rps']:,.0f}",
            f"{m['p50_ms']:.3f} / {m['p99_ms']:.3f}",
            f"{m['p50_ms'] - d['p50_ms']:+.3f}" if d and proxied else "-",
            f"{m['proxy_us_req']:.1f}" if proxied else "-",
            f"{m['broker_us_req']:.1f}",
            f"{m['client_us_req']:.1f}",
            f"{m['reqs_per_record']:.3f}",
        ]

    return _rows(med, paths, len(A_HEADERS), cells)


def exactly_once(m: dict[str, float]) -> str:
    counts = f"{m['duplicates']:.0f} duplicates, {m['missing']:.0f} missing, "
    counts += f"{m['out_of_order']:.0f} out of order"
    bad = m["duplicates"] or m["missing"] or m["out_of_order"]
    return f"{'no' if bad else 'yes'} ({counts})"


def b_rows(med: dict[str, dict[str, float]], paths: list[str]) -> list[list[str]]:
    d = med.get("direct")

    def cells(path: str, m: dict[str, float]) -> list[str]:
        kipside = path != "direct"
        return [
            f"{m['msgs_per_s']:,.0f}",
            f"{m['msgs_per_s'] / d['msgs_per_s']:.2f}x" if d else "-",
            f"{m['p50_ms']:.2f} / {m['p99_ms']:.2f}",
            f"{m['client_reqs']:,.0f}",
            f"{m['upstream_reqs']:,.0f}" if kipside else "(same)",
            f"{m['ratio']:.2f}x" if kipside else "1x",
            f"{m['broker_cpu_per_m']:.1f}",
            f"{m['proxy_cpu_per_m']:.1f}" if kipside else "-",
            exactly_once(m),
        ]

    return _rows(med, paths, len(B_HEADERS), cells)


def run_rows(runs: list[Run]) -> list[list[str]]:
    rows: list[list[str]] = []
    for r in sorted(runs, key=lambda r: (r.rep, r.workload)):
        if r.error is not None:
            rows.append([str(r.rep), r.workload, r.path, f"error: {_first(r.error, 80)}", ""])
            continue
        m = r.metrics
        if r.workload == "A":
            what = f"{m['rps']:,.0f} req/s, p50 {m['p50_ms']:.3f} ms, "
            what += f"proxy {m['proxy_us_req']:.1f} / Tansu {m['broker_us_req']:.1f} us/req"
        else:
            what = f"{m['msgs_per_s']:,.0f} msgs/s, {m['ratio']:.2f}x, {exactly_once(m)}"
        noisy = " (noisy)" if m["noise_cores"] > NOISE_CORES else ""
        rows.append([str(r.rep), r.workload, r.path, what, f"{m['noise_cores']:.2f}{noisy}"])
    return rows


def _first(text: str, width: int) -> str:
    return text.strip().splitlines()[0][:width] if text.strip() else ""


# --------------------------------------------------------------------------- targets


@dataclass
class Target:
    name: str
    ok: bool | None
    """None: not measured."""
    detail: str

    @property
    def mark(self) -> str:
        return "not measured" if self.ok is None else ("met" if self.ok else "**MISSED**")


@dataclass(frozen=True)
class Ratio:
    """A target on kipside's median `key` divided by path `other`'s in `workload`."""

    workload: str
    name: str
    other: str
    key: str
    limit: float
    at_least: bool

    def judge(self, res: Result) -> Target:
        med = res.medians(self.workload)
        k, o, key = med.get("kipside"), med.get(self.other), self.key
        if k is None or o is None:
            return Target(self.name, None, f"kipside or {self.other} has no result")
        r = k[key] / o[key]
        spread = res.paired(
            self.workload, "kipside", self.other, lambda a, b: a.metrics[key] / b.metrics[key]
        )
        ok = r >= self.limit if self.at_least else r <= self.limit
        return Target(self.name, ok, f"{r:.2f}x ({k[key]:,.1f} vs {o[key]:,.1f}{spread})")


RATIOS = (
    Ratio("A", "A: kipside proxy CPU per request <= tansu-proxy's", "tansu-proxy",
          "proxy_us_req", CPU_VS_TANSU_PROXY, at_least=False),
    Ratio("A", f"A (stretch): kipside proxy CPU per request <= {STRETCH_CPU_VS_RELAY}x the "
          "relay's", "relay", "proxy_us_req", STRETCH_CPU_VS_RELAY, at_least=False),
    Ratio("A", f"A: kipside requests/s >= {RPS_VS_RELAY}x the relay's", "relay", "rps",
          RPS_VS_RELAY, at_least=True),
    Ratio("B", f"B: kipside delivered msgs/s >= {B_RATE_VS_DIRECT}x direct", "direct",
          "msgs_per_s", B_RATE_VS_DIRECT, at_least=True),
)  # fmt: skip


def a_targets(res: Result) -> list[Target]:
    out = [r.judge(res) for r in RATIOS if r.workload == "A"]
    med = res.medians("A")
    k, d = med.get("kipside"), med.get("direct")
    name = f"A: kipside added p50 latency <= {ADDED_P50_MS} ms vs direct"
    if k is None or d is None:
        return [*out, Target(name, None, "kipside or direct has no result")]
    added = k["p50_ms"] - d["p50_ms"]
    detail = f"{added:+.3f} ms ({k['p50_ms']:.3f} vs {d['p50_ms']:.3f} ms)"
    return [*out, Target(name, added <= ADDED_P50_MS, detail)]


def b_targets(res: Result) -> list[Target]:
    k = res.medians("B").get("kipside")
    fewer = f"B: kipside sends >= {B_REQUEST_RATIO:g}x fewer upstream Produce requests"
    once = "B: through kipside every acknowledged record exactly once, in order"
    ratios = [r.judge(res) for r in RATIOS if r.workload == "B"]
    if k is None:
        return [Target(fewer, None, "kipside has no result"), *ratios, Target(once, None, "-")]
    upstream = f"{k['client_reqs']:,.0f} client, {k['upstream_reqs']:,.0f} upstream"
    return [
        Target(fewer, k["ratio"] >= B_REQUEST_RATIO, f"{k['ratio']:.2f}x ({upstream})"),
        *ratios,
        Target(once, exactly_once(k).startswith("yes"), exactly_once(k)),
    ]


COMPARED = (
    ("A", "proxy_us_req", "proxy CPU per request (us)"),
    ("A", "rps", "requests/s"),
    ("B", "proxy_cpu_per_m", "CPU s per million messages"),
    ("B", "msgs_per_s", "delivered msgs/s"),
)


def comparisons(res: Result) -> list[str]:
    """kipside against kipside-before: no target, but the point of the rewrite."""
    lines = []
    for workload, key, what in COMPARED:
        med = res.medians(workload)
        k, b = med.get("kipside"), med.get("kipside-before")
        if k and b:
            lines.append(
                f"{workload}: kipside's {what} is {k[key] / b[key]:.2f}x kipside-before's "
                f"({k[key]:,.1f} vs {b[key]:,.1f})"
            )
    return lines


# --------------------------------------------------------------------------- chart and doc


@dataclass(frozen=True)
class Bars:
    """One chart panel: the median `key` of `workload` per path, and a target line at
    `reference` times `reference_path`'s bar (or at `reference` itself)."""

    workload: str
    title: str
    ylabel: str
    key: str
    fmt: str
    reference: float
    reference_path: str | None
    reference_label: str


CHART = (
    Bars("A", "A: proxy CPU per request (closed loop)", "CPU us/request", "proxy_us_req",
         "{:.1f}", CPU_VS_TANSU_PROXY, "tansu-proxy", "tansu-proxy (target)"),
    Bars("A", "A: requests/s (one in flight)", "requests/s", "rps", "{:,.0f}", RPS_VS_RELAY,
         "relay", f"{RPS_VS_RELAY}x relay (target)"),
    Bars("B", f"B: delivered msgs/s ({B_PRODUCERS_TEXT})", "msgs/s", "msgs_per_s", "{:,.0f}",
         B_RATE_VS_DIRECT, "direct", f"{B_RATE_VS_DIRECT:g}x direct (target)"),
    Bars("B", "B: client / upstream Produce requests", "ratio", "ratio", "{:.1f}x",
         B_REQUEST_RATIO, None, f"{B_REQUEST_RATIO:g}x (target)"),
)  # fmt: skip


def _panel(res: Result, bars: Bars) -> Panel | None:
    med = res.medians(bars.workload)
    shown = [p for p in res.args.paths if p in med]
    if not shown:
        return None
    ref: float | None = bars.reference
    if bars.reference_path is not None:
        of = med.get(bars.reference_path)
        ref = of[bars.key] * bars.reference if of else None
    return Panel(
        bars.title,
        bars.ylabel,
        [p.replace("-", "\n") for p in shown],  # six labels fit a panel
        [med[p][bars.key] if p != "direct" or bars.key != "proxy_us_req" else None for p in shown],
        fmt=bars.fmt,
        reference=ref,
        reference_label=bars.reference_label,
        colors=[PATH_COLORS.get(p, "#9467bd") for p in shown],
        missing="no proxy",
    )


def chart(res: Result, png: Path) -> None:
    panels = [panel for bars in CHART if (panel := _panel(res, bars)) is not None]
    bar_chart(png, panels, f"kipside hot path (median of {res.args.repeats}, loopback)")


def _facts(res: Result) -> str:
    vers = {**versions(), "trio": importlib.metadata.version("trio"), **res.sources.labels}
    return facts_markdown(command_line(), res.started, machine_info(), vers).rstrip()


def description(res: Result) -> list[str]:
    args = res.args
    return [
        "Paths, each against its own fresh in-memory Tansu, interleaved per repetition:",
        "- **direct**: the client talks to Tansu;",
        "- **relay**: `bench/_relay.py`, a bare trio TCP relay (two tasks per connection, "
        "256 KiB reads, nothing parsed): the floor for a proxy in Python on trio;",
        "- **haproxy** in plain TCP mode and **tansu-proxy** (Tansu's Rust proxy); for the relay "
        "and haproxy, Tansu advertises the relay's port so all traffic goes through it;",
        "- **kipside**: the working tree (a snapshot taken at the start); **kipside-before**: "
        f"kipside at `{args.baseline_ref}`, run with the same interpreter.",
        "",
        f"- **A, closed loop**: one confluent-kafka producer, linger.ms=0, acks=all, "
        f"{RECORD_SIZE} B values, each record produced only once the previous one's delivery "
        f"report is in: one Produce request per record, one in flight. {args.seconds:g} s "
        f"measured after {args.warm_up:g} s of the same; CPU (psutil) of the proxy and Tansu "
        "over exactly that window, divided by the requests. kipside runs with default rules.",
        f"- **B, {B_PRODUCERS_TEXT}**: the same closed loop in {B_PRODUCERS} producers (threads, "
        f"in {B_PROCESSES} processes) on one topic of {B_PARTITIONS} partitions; keyed by "
        "(producer, sequence number), so the default partitioner spreads each producer's "
        "records over the partitions; acks "
        "alternates 1 / all, every acks=all producer is idempotent, compression cycles none, "
        "gzip, snappy, lz4, zstd. kipside runs with `coalescing: {enabled: true, linger_ms: 0}` "
        "(default lanes). Client Produce requests from librdkafka's statistics, upstream ones "
        "from kipside's `/metrics`. Afterwards a consumer reads the whole topic: every "
        "acknowledged record must be there exactly once and, per partition, each producer's "
        "sequence numbers must increase.",
    ]


def notes(res: Result) -> list[str]:
    out = [
        f"`{p}` was not measured: `{_first(why, 200)}`" for p, why in res.sources.skipped.items()
    ]
    for r in res.runs:
        where = f"`{r.path}` {r.workload} rep {r.rep}"
        if r.error is not None:
            out.append(f"{where} failed: `{_first(r.error, 200)}`")
        out += [f"{where} logged: `{problem[:200]}`" for problem in r.log_problems[:5]]
    noisy = [r for r in res.runs if not r.error and r.metrics["noise_cores"] > NOISE_CORES]
    if noisy:
        out.append(
            f"**{len(noisy)} of {len(res.runs)} runs shared the machine with other load** "
            f"(> {NOISE_CORES} cores busy outside this benchmark; see 'Every run')."
        )
    return out


def section(res: Result, targets: list[Target], png: Path) -> str:
    n = res.args.repeats
    lines = [
        "## Hot path (issue 11): cost per request, kipside vs a bare relay, haproxy, tansu proxy",
        "",
        "Written by `bench/hotpath.py`.",
        "",
        _facts(res),
        f"- Repetitions: {n}, paths interleaved (order rotated each time); median reported. "
        f"Wall time {res.wall_s:.0f} s; 1-minute load average {res.load:.2f} at the start.",
        "",
        *description(res),
        "",
    ]
    for title, headers, rows in tables(res):
        lines += [f"### {title}", "", markdown_table(headers, rows).rstrip(), ""]
    lines += [
        "### Targets",
        "",
        *(f"- {t.name}: {t.mark}: {t.detail}" for t in targets),
        *(f"- (no target) {line}" for line in comparisons(res)),
    ]
    if found := notes(res):
        lines += ["", "### Notes on this run", "", *(f"- {n}" for n in found)]
    lines += [
        "",
        f"![proxy CPU per request and requests/s per path](img/{png.name})",
        "",
        "<details><summary>Every run</summary>",
        "",
        markdown_table(RUN_HEADERS, run_rows(res.runs), "rllll").rstrip(),
        "",
        "</details>",
    ]
    return "\n".join(lines) + "\n"


def tables(res: Result) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, headers, rows) of each workload that ran."""
    n, out = res.args.repeats, []
    if "A" in res.args.workloads:
        rows = a_rows(res.medians("A"), res.args.paths)
        out.append((f"A: one closed-loop producer (median of {n})", A_HEADERS, rows))
    if "B" in res.args.workloads:
        rows = b_rows(res.medians("B"), b_paths(res))
        title = f"B: {B_PRODUCERS_TEXT}, mixed acks and codecs (median of {n}; checks summed)"
        out.append((title, B_HEADERS, rows))
    return out


def b_paths(res: Result) -> list[str]:
    return [p for p in res.args.paths if p in ("direct", "kipside", "kipside-before")]


def profile_section(res: Result, profile: Profile, run: Run) -> str:
    args, m = res.args, run.metrics
    source = res.sources.labels.get(args.profile_path, args.profile_path)
    seconds = max(1, int(args.seconds))
    cpu_samples = m["proxy_us_req"] * m["rps"] / 1e6 * RATE_HZ * seconds
    lines = [
        f"### Hot path profile, {args.profile_label}: where `{args.profile_path}` spends its CPU "
        "in workload A",
        "",
        f"- Command: `{command_line()}`; date {res.started}",
        f"- Code: {source}",
        f"- One extra run of workload A ({args.seconds:g} s, not among the results above) with "
        f"`py-spy record --format raw --rate {RATE_HZ}` attached to the proxy for {seconds} s; "
        f"py-spy leaves idle samples out. {profile.samples} busy samples, where psutil's CPU "
        f"time is worth {cpu_samples:.0f} (py-spy does not always see a thread waiting in "
        "epoll as idle, so trio's `get_events` holds some waiting too). The run did "
        f"{m['rps']:,.0f} requests/s at {m['proxy_us_req']:.1f} proxy CPU us/request (py-spy "
        "pauses the process for each sample, so slower than unprofiled).",
        "- own: samples with the function innermost (where the CPU was); incl.: anywhere on "
        "the stack.",
        "",
        markdown_table(PROFILE_HEADERS, profile_rows(profile), "rllrrr").rstrip(),
    ]
    return "\n".join(lines) + "\n"


def publish(res: Result) -> None:
    """Print the tables and verdicts; write the doc's sections and the chart unless --no-doc."""
    args = res.args
    targets = [
        *(a_targets(res) if "A" in args.workloads else []),
        *(b_targets(res) if "B" in args.workloads else []),
    ]
    print(f"\n{res.wall_s:.0f} s\n")
    for title, headers, rows in tables(res):
        print(f"{title}\n{text_table(headers, rows)}")
    for t in targets:
        print(f"{t.mark.strip('*').upper():>12}  {t.name}: {t.detail}")
    for line in comparisons(res):
        print(f"{'COMPARED':>12}  {line}")
    for note in notes(res):
        print(f"{'NOTE':>12}  {note}")
    if isinstance(res.profiled, str):
        print(f"{'PROFILE':>12}  failed: {res.profiled}")
    elif res.profiled is not None:
        print(f"\nprofile ({args.profile_label}, {res.profiled[0].samples} busy samples)")
        print(text_table(PROFILE_HEADERS, profile_rows(res.profiled[0])))
    if args.no_doc:
        return
    png = args.doc.parent / "img" / PNG_NAME
    chart(res, png)
    write_section(SECTION, section(res, targets, png), doc=args.doc)
    if isinstance(res.profiled, tuple):
        body = profile_section(res, *res.profiled)
        write_section(f"{SECTION}-profile-{args.profile_label}", body, doc=args.doc)
    print(f"\nwrote {args.doc} and {png}")
