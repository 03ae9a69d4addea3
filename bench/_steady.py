"""What the pipeline benchmarks (mirror, lake) share: a baseline against whole `--once` runs of
a kipside pipeline on part of the data and on all of it.

Spark's fixed cost (the JVM's start, planning processes) is the same in both kipside runs, so
their difference is what a pipeline that keeps running pays for the rest of the data: its
steady state. Each kind of run is repeated and its median reported; CPU is every process the
run started, the brokers' apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from _chart import Panel, bar_chart
from _measure import TreeRun
from _report import Report, Table, Target, facts


@dataclass(frozen=True)
class Steady:
    """The runs' medians, and how much data (in `unit`s) each one moved."""

    base: TreeRun
    part: TreeRun
    whole: TreeRun
    base_units: float
    part_units: float
    whole_units: float

    @classmethod
    def of(cls, runs: dict[str, list[TreeRun]], units: tuple[float, float, float]) -> Steady:
        """Medians of the baseline's, the part's and the whole's runs (in that order)."""
        base, part, whole = (TreeRun.median(r) for r in runs.values())
        return cls(base, part, whole, *units)

    def rows(self) -> list[tuple[TreeRun, float]]:
        steady = (self.whole.minus(self.part), self.whole_units - self.part_units)
        whole = [(self.part, self.part_units), (self.whole, self.whole_units)]
        return [(self.base, self.base_units), *whole, steady]


@dataclass(frozen=True)
class Kind:
    """How one pipeline benchmark names and judges its runs."""

    section: str
    title: str
    unit: str
    per_s: str
    """How a rate is shown: a format of units per second times `scale`."""
    scale: float
    names: tuple[str, str, str, str]
    """Row names: baseline, part, whole, steady state."""
    target: float
    """Kipside's CPU per unit at most `target` x the baseline's (or with `efficiency`, its
    units per CPU-second at least `target` x the baseline's)."""
    efficiency: bool
    whole: int = 1
    """The row whose whole `--once` run (Spark's start included) is judged too: 1 part, 2 all."""


def report(kind: Kind, runs: Steady, data: str, reps: int) -> Report:
    base_cost = runs.base.cpu_s / runs.base_units
    headers = ["run", kind.unit, "wall s", "per second", "CPU s", f"CPU s per {kind.unit}"]
    headers += ["vs baseline" + (" (per CPU-s)" if kind.efficiency else " (CPU)"), "brokers' CPU s"]
    table, ratios, speeds = [], [], []
    for name, (run, units) in zip(kind.names, runs.rows(), strict=True):
        cost = run.cpu_s / units
        ratios.append(base_cost / cost if kind.efficiency else cost / base_cost)
        speeds.append(units / run.wall_s)
        table.append(
            [name, f"{units:,.4g}", f"{run.wall_s:.1f}", kind.per_s.format(speeds[-1] * kind.scale)]
        )
        table[-1] += [
            f"{run.cpu_s:.1f}",
            f"{cost:.1f}",
            f"{ratios[-1]:.2f}x",
            f"{run.broker_cpu_s:.1f}",
        ]
    speed = [s / speeds[0] for s in speeds]
    fixed = (
        runs.part.cpu_s
        - (runs.whole.cpu_s - runs.part.cpu_s)
        / (runs.whole_units - runs.part_units)
        * runs.part_units
    )
    targets, judged = [], "rows per CPU-second at least" if kind.efficiency else "CPU at most"
    for row, what in ((3, "steady state"), (kind.whole, f"{kind.names[kind.whole]} (whole run)")):
        ok = ratios[row] >= kind.target if kind.efficiency else ratios[row] <= kind.target
        detail = f"{ratios[row]:.2f}x the baseline's, at {speed[row]:.2f}x its throughput"
        targets.append(Target(f"{what}: {judged} {kind.target:.3g}x the baseline's", ok, detail))
    notes = [
        f"Spark's fixed cost: about {fixed:.0f} CPU-seconds a run (part run minus steady share)."
    ]
    labels = ["baseline", "kipside\npart", "kipside\nwhole", "kipside\nsteady"]
    title = f"{kind.title} (median of {reps} runs, loopback)"
    line = f"target {kind.target:.3g}x baseline"
    panels = [
        Panel(
            "vs baseline" + (" (rows per CPU-s)" if kind.efficiency else " (CPU per unit)"),
            "x",
            labels,
            ratios,
            "{:.2f}",
            kind.target,
            line,
        ),
        Panel(f"{kind.unit} per second", kind.unit, labels, speeds, "{:,.3g}"),
    ]
    return Report(
        kind.section,
        kind.title,
        facts(data),
        [Table("Runs", headers, table)],
        targets,
        notes,
        (kind.title, lambda png: bar_chart(png, panels, title)),
    )
