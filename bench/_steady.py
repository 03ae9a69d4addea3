"""What the pipeline benchmarks (mirror, lake) share: a baseline against whole `--once` runs of
a kipside pipeline on part of the data and on all of it, each timed over its process tree.

Spark's fixed cost (the JVM's start, planning processes) is the same in both kipside runs, so
their difference is what a pipeline that keeps running pays for the rest of the data: its
steady state. Each kind of run is repeated and its median reported; CPU is every process the
run started, the brokers' apart.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from _chart import Panel
from _harness import HarnessError, Managed
from _measure import wait_until_quiet
from _report import Report, Table, Target, facts
from testkit.cpu import TreeSampler, own_cpu_seconds


@dataclass(frozen=True)
class TreeRun:
    wall_s: float
    cpu_s: float
    """CPU of the command and everything it started (Spark's JVM and Python workers too)."""
    broker_cpu_s: float

    def minus(self, other: TreeRun) -> TreeRun:
        """What this run cost beyond `other` (a smaller run of the same job)."""
        return TreeRun(*(a - b for a, b in zip(self.fields(), other.fields(), strict=True)))

    def fields(self) -> tuple[float, float, float]:
        return self.wall_s, self.cpu_s, self.broker_cpu_s

    @staticmethod
    def median(runs: Sequence[TreeRun]) -> TreeRun:
        return TreeRun(*map(statistics.median, zip(*(r.fields() for r in runs), strict=True)))


def timed(brokers: Sequence[Managed], what: str, args: Sequence[str]) -> TreeRun:
    """Run a command to success on a quiet machine, sampling the CPU of its whole process tree
    every 0.2 s (a daemonised Spark worker is never reaped, so only sampling sees it; each pid
    counts once), with the CPU the brokers spent meanwhile. A kipside pipeline picks Spark's
    Python itself."""
    wait_until_quiet()
    broker0 = sum(b.cpu_seconds() for b in brokers)
    reaped0, t0 = own_cpu_seconds() - own_cpu_seconds(children=False), time.perf_counter()
    proc = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler, out = TreeSampler(proc.pid), list[bytes]()
    reader = threading.Thread(target=lambda: out.extend(proc.communicate(timeout=3600)))
    reader.start()
    while reader.is_alive():
        sampler.sample()
        reader.join(0.2)
    wall = time.perf_counter() - t0
    reaped = own_cpu_seconds() - own_cpu_seconds(children=False) - reaped0
    if len(out) < 2 or proc.returncode != 0:
        proc.kill()
        raise HarnessError(f"{what} failed:\n{(out[1] if out else b'').decode()[-3000:]}")
    broker = sum(b.cpu_seconds() for b in brokers) - broker0
    return TreeRun(wall, max(reaped, sampler.total()), broker)


@dataclass(frozen=True)
class Kind:
    """How one pipeline benchmark names and judges its runs."""

    section: str
    title: str
    unit: str
    per_s: str
    """How a rate is shown: a format of units per second times `scale`."""
    scale: float
    rows: tuple[str, str, str, str]
    """What the runs are: the baseline, kipside's command, the part and the whole of the data."""
    target: float
    """Kipside's CPU per unit at most `target` x the baseline's (or with `efficiency`, its
    units per CPU-second at least `target` x the baseline's)."""
    efficiency: bool
    whole: int = 1
    """The row whose whole `--once` run (Spark's start included) is judged too: 1 part, 2 all."""
    whole_target: float | None = None
    """That run's target, if not `target`."""


def report(kind: Kind, runs: dict[str, list[TreeRun]], units: Sequence[float], data: str) -> Report:
    """The medians of the baseline's, the part's and the whole's runs (in that order, each
    having moved `units` of data), the steady state, and the targets."""
    base, part, whole = (TreeRun.median(r) for r in runs.values())
    rows = [(base, units[0]), (part, units[1]), (whole, units[2])]
    rows.append((whole.minus(part), units[2] - units[1]))
    headers = ["run", kind.unit, "wall s", "per second", "CPU s", f"CPU s per {kind.unit}"]
    headers += ["vs baseline" + (" (per CPU-s)" if kind.efficiency else " (CPU)"), "brokers' CPU s"]
    table, ratios, speeds, base_cost = [], [], [], base.cpu_s / units[0]
    baseline, kipside, part_name, whole_name = kind.rows
    names = [baseline, f"{kipside} ({part_name})", f"{kipside} ({whole_name})"]
    names.append(f"{kipside}: steady state ({whole_name} minus {part_name})")
    for name, (run, n) in zip(names, rows, strict=True):
        cost = run.cpu_s / n
        ratios.append(base_cost / cost if kind.efficiency else cost / base_cost)
        speeds.append(n / run.wall_s)
        shown = [f"{n:,.4g}", f"{run.wall_s:.1f}", kind.per_s.format(speeds[-1] * kind.scale)]
        shown += [
            f"{run.cpu_s:.1f}",
            f"{cost:.1f}",
            f"{ratios[-1]:.2f}x",
            f"{run.broker_cpu_s:.1f}",
        ]
        table.append([name, *shown])
    targets, judged = [], "rows per CPU-second at least" if kind.efficiency else "CPU at most"
    whole_target = kind.target if kind.whole_target is None else kind.whole_target
    judging = [(3, "steady state", kind.target)]
    judging.append((kind.whole, f"{names[kind.whole]} (whole run)", whole_target))
    for row, what, target in judging:
        ok = ratios[row] >= target if kind.efficiency else ratios[row] <= target
        detail = (
            f"{ratios[row]:.2f}x the baseline's, at {speeds[row] / speeds[0]:.2f}x its throughput"
        )
        targets.append(Target(f"{what}: {judged} {target:.3g}x the baseline's", ok, detail))
    fixed = part.cpu_s - (whole.cpu_s - part.cpu_s) / (units[2] - units[1]) * units[1]
    notes = [
        f"Spark's fixed cost: about {fixed:.0f} CPU-seconds a run (part run minus steady share)."
    ]
    labels = ["baseline", "kipside part", "kipside whole", "kipside steady"]
    per = " (rows per CPU-s)" if kind.efficiency else " (CPU per unit)"
    line = f"target {kind.target:.3g}x baseline"
    panels = [
        Panel("vs baseline" + per, labels, {"": ratios}, "{:.2f}", kind.target, line),
        Panel(f"{kind.unit} per second", labels, {"": speeds}, "{:,.3g}"),
    ]
    reps = len(runs["a"])
    chart = (f"{kind.title} (median of {reps} runs, loopback)", panels)
    tables = [Table("Runs", headers, table)]
    return Report(kind.section, kind.title, facts(data), tables, targets, notes, chart)


def merged(reports: Mapping[str, Report]) -> Report:
    """Reports of one pipeline in several modes, measured against the same baseline runs, as
    one: a table of runs with the baseline once, each mode's targets and notes named by its
    mode, and the chart's bars grouped by mode."""
    (_, first), *_rest = reports.items()
    runs = first.tables[0]
    rows = [row for i, r in enumerate(reports.values()) for row in r.tables[0].rows[i > 0 :]]
    targets = [
        Target(f"{mode}: {t.name}", t.ok, t.detail)
        for mode, r in reports.items()
        for t in r.targets
    ]
    notes = [f"{mode}: {n}" for mode, r in reports.items() for n in r.notes]
    chart = first.chart
    if chart is not None:
        panels = [
            replace(
                panel,
                series={mode: r.chart[1][i].series[""] for mode, r in reports.items() if r.chart},
            )
            for i, panel in enumerate(chart[1])
        ]
        chart = (chart[0], panels)
    return replace(
        first,
        tables=[replace(runs, rows=rows), *first.tables[1:]],
        targets=targets,
        notes=notes,
        chart=chart,
    )
