"""What the benchmarks report: their options, facts of the run, tables, target verdicts, and
their sections of docs/performance.md, each between `<!-- bench:NAME:start -->` and
`<!-- bench:NAME:end -->`: `write_section()` replaces only that block (appending it when
missing). The block holds what a run found; how a benchmark measures is prose written once in
the document, after its block. `Compared` is a same-run comparison declared as a table: its
cases run in the same repetitions, and its section is written from their medians.

Targets and their verdicts are printed to the terminal only: the document is user
documentation and states figures and the command that reproduces them, never a verdict (and
its charts draw no target lines).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from _chart import Bars, Lines, Panel, Points, bar_chart, line_chart, scatter_chart
from _harness import REPO
from _measure import Body, Run, medians, per_rep, repeat

from kipside.proxy.devbroker import tansu_path

DOC = REPO / "docs" / "performance.md"
NAN = float("nan")
STARTED = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
"""When the benchmark started (this module is imported at its start)."""
Options = dict[str, tuple[Any, Any, str]]
"""A benchmark's options: flag -> (type, default, help); the type bool makes a switch."""


def listed(kind: Callable[[str], Any] = str, choices: Sequence[Any] = ()) -> Callable[[str], Any]:
    """An option's type: a comma-separated list of `kind`, each one of `choices` if given."""

    def parse(text: str) -> list[Any]:
        items = [kind(item) for item in text.split(",") if item]
        if choices and set(items) - set(choices):
            raise argparse.ArgumentTypeError(f"choose from {','.join(map(str, choices))}")
        return items

    return parse


def parse_args(doc: str | None, options: Options, quick: Mapping[str, Any]) -> argparse.Namespace:
    """A benchmark's command line: its `options`, --quick (a smoke test: `quick` overrides the
    options), and --doc FILE / --no-doc, the same everywhere."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    for flag, (kind, default, text) in options.items():
        if kind is bool:
            ap.add_argument(flag, action="store_true", help=text)
        else:
            ap.add_argument(flag, type=kind, default=default, help=text)
    ap.add_argument("--quick", action="store_true", help="a short smoke test")
    ap.add_argument("--doc", type=Path, default=DOC, help="the markdown file to write")
    ap.add_argument("--no-doc", action="store_true", help="print only; leave the document alone")
    args = ap.parse_args()
    if args.quick:
        vars(args).update(quick)
    return args


# --------------------------------------------------------------------------- facts


def output(args: Sequence[str]) -> str:
    """The first line a command prints, or "unavailable"."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    return ((done.stdout or done.stderr).strip() or "unavailable").splitlines()[0]


def machine() -> str:
    """CPUs, model, memory, kernel and Python of this machine, in one line."""
    info: dict[str, str] = {}
    for path in ("/proc/cpuinfo", "/proc/meminfo"):
        for line in Path(path).read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    memory = int(info.get("MemTotal", "0 kB").split()[0]) / 1024 / 1024
    return (
        f"{len(os.sched_getaffinity(0))} CPUs (nproc), {info.get('model name', 'unknown')}, "
        f"{memory:.1f} GiB RAM, Linux {platform.release()}, Python {platform.python_version()}"
    )


def versions(*tools: str) -> dict[str, str]:
    """kipside, Tansu and the client library, then each distribution or tool in `tools`."""
    import confluent_kafka

    out = {
        "kipside": importlib.metadata.version("kipside"),
        "Tansu": output([str(tansu_path()), "--version"]).removeprefix("tansu ").strip(),
        "confluent-kafka": str(confluent_kafka.__version__),
        "librdkafka": str(confluent_kafka.libversion()[0]),
    }
    for name in tools:
        if name == "haproxy":
            line = output(["haproxy", "-v"])
            out[name] = m.group(1) if (m := re.search(r"version (\S+)", line)) else line
        else:
            out[name] = importlib.metadata.version(name)
    return out


def command_line() -> str:
    """The command that started this process, paths relative to the repository."""

    def relative(arg: str) -> str:
        path = Path(arg)
        inside = path.is_absolute() and path.is_relative_to(REPO)
        return str(path.relative_to(REPO)) if inside else arg

    return shlex.join([relative(sys.executable), relative(sys.argv[0]), *sys.argv[1:]])


def facts(*more: str, tools: Sequence[str] = (), code: Mapping[str, str] = {}) -> list[str]:
    """The bullet lines every section starts with: command, date, machine, the versions of
    kipside, Tansu, the client and `tools` (and the kipside `code` each path ran), `more`."""
    found = ", ".join(f"{k} {v}" for k, v in {**versions(*tools), **code}.items())
    lines = [f"- Command: `{command_line()}`", f"- Date: {STARTED}", f"- Machine: {machine()}"]
    return [*lines, f"- Versions: {found}", *(f"- {m}" for m in more)]


# --------------------------------------------------------------------------- tables and targets


@dataclass(frozen=True)
class Table:
    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    align: str = ""
    """l or r per column (default: the first left, the rest right)."""

    def markdown(self) -> str:
        """A GitHub table, its columns padded so that it reads as well in a terminal."""
        align = self.align or "l" + "r" * (len(self.headers) - 1)
        rows = [self.headers, [":--" if a == "l" else "--:" for a in align], *self.rows]
        widths = [max(len(row[i]) for row in rows) for i in range(len(align))]
        rows[1] = [m[0] + "-" * (w - 2) + m[-1] for m, w in zip(rows[1], widths, strict=True)]
        lines = []
        for row in rows:
            cells = zip(row, widths, align, strict=True)
            lines.append(" | ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in cells))
        return "".join(f"| {line} |\n" for line in lines)


Cell = str | Callable[[dict[str, float]], str]
"""A table cell: a format string over a case's numbers ("{p50_ms:.2f}") or a function of them."""
Columns = Sequence[tuple[str, Cell]]


def table(
    title: str,
    cases: Sequence[str],
    found: Mapping[str, dict[str, float] | None],
    columns: Columns,
    first: str = "path",
) -> Table:
    """A row per case, a column per (header, cell); "-" where a number is NaN."""

    def show(cell: Cell, m: dict[str, float]) -> str:
        text = cell.format(**m) if isinstance(cell, str) else cell(m)
        return "-" if "nan" in text else text

    rows = [
        [case, *(show(cell, m) for _, cell in columns)]
        if (m := found.get(case))
        else [case, "failed or skipped", *[""] * (len(columns) - 1)]
        for case in cases
    ]
    return Table(title, [first, *(h for h, _ in columns)], rows)


def number(v: float) -> str:
    """A figure with the digits that matter: 1,234 or 12.3 or 0.123."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.3f}"


@dataclass(frozen=True)
class Target:
    """A target a benchmark checks and what this run found: ok None means not measured.
    Printed to the terminal, never written into the document."""

    name: str
    ok: bool | None
    detail: str

    def __str__(self) -> str:
        if self.name.startswith("(no target)"):
            mark = "compared"
        else:
            mark = "not measured" if self.ok is None else ("met" if self.ok else "**MISSED**")
        return f"{self.name}: {mark}: {self.detail}"


@dataclass(frozen=True)
class Compare:
    """A target on `case`'s median `key` against `other`'s: their ratio (or with `diff`, their
    difference) at least (or at most) `limit`; the spread over paired repetitions is shown."""

    name: str
    key: str
    other: str
    limit: float
    at_least: bool = True
    diff: bool = False
    case: str = "kipside"

    def judge(self, runs: Sequence[Run], med: Mapping[str, dict[str, float] | None]) -> Target:
        a, b, key = med.get(self.case), med.get(self.other), self.key
        if not a or not b:
            return Target(self.name, None, f"{self.case} or {self.other} has no result")

        def of(x: float, y: float) -> float:
            return x - y if self.diff else x / y

        r, shown = of(a[key], b[key]), "{:+.3f}" if self.diff else "{:.2f}x"
        each = per_rep(runs, self.case, self.other, lambda x, y: of(x.metrics[key], y.metrics[key]))
        detail = f"{shown.format(r)} ({number(a[key])} vs {number(b[key])}"
        if len(each) > 1:
            detail += f"; per repetition {shown.format(min(each))} to {shown.format(max(each))}"
        return Target(
            self.name, r >= self.limit if self.at_least else r <= self.limit, detail + ")"
        )


def relative(med: dict[str, dict[str, float] | None], base: str, keys: Sequence[str]) -> None:
    """Add `KEY_vs` (ratio to `base`'s median) and `KEY_add` (difference) to every case."""
    b = med.get(base) or {}
    for m in med.values():
        for key in keys:
            if m is not None and key in m:
                m[f"{key}_vs"] = m[key] / b[key] if b.get(key) else NAN
                m[f"{key}_add"] = m[key] - b[key] if key in b else NAN


def run_notes(runs: Sequence[Run], noisy: float) -> list[str]:
    """Failures, what proxies logged, runs measured again and runs disturbed by other load."""
    out = []
    for r in runs:
        if not r.ok:
            out.append(f"`{r.case}` rep {r.rep} failed: `{(r.error or '?').splitlines()[0][:200]}`")
        out += [f"`{r.case}` rep {r.rep} logged `{line[:200]}`" for line in r.problems[:3]]
    if again := [r for r in runs if r.attempts > 1]:
        out.append(f"{len(again)} run(s) measured again; the last attempt counts.")
    if busy := [r for r in runs if r.ok and r.noise > noisy]:
        out.append(
            f"**{len(busy)} of {len(runs)} runs shared the machine with other load** (over "
            f"{noisy} cores busy outside this benchmark): their numbers are depressed."
        )
    return out


# --------------------------------------------------------------------------- the document


def write_section(name: str, body: str, doc: Path) -> None:
    """Replace the `name` block of `doc` with `body` (creating the file or block if missing)."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}\n"
    text = doc.read_text() if doc.exists() else "# Performance\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


@dataclass
class Report:
    """One benchmark's findings: printed, and written as its section unless --no-doc."""

    section: str
    title: str
    facts: list[str]
    tables: list[Table]
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    chart: tuple[str, Sequence[Panel]] | None = None
    """(title, panels): drawn as docs/img/SECTION.png."""
    lines: tuple[str, Sequence[Lines]] | None = None
    """(title, panels of lines over time): drawn instead, as docs/img/SECTION.png."""
    points: tuple[str, Sequence[Points]] | None = None
    """(title, panels of points): drawn instead, as docs/img/SECTION.png."""

    def publish(self, args: argparse.Namespace) -> None:
        """Print the section with its targets; write it, without them, unless --no-doc."""
        script = command_line().split()[1]
        lines = [f"## {self.title}", "", f"Written by `{script}`.", "", *self.facts, ""]
        for t in self.tables:
            lines += [f"### {t.title}", "", t.markdown()]
        if self.notes:
            lines += ["### Notes on this run", "", *(f"- {n}" for n in self.notes), ""]
        targets = ["### Targets (terminal only)", "", *(f"- {t}" for t in self.targets), ""]
        print("\n".join(lines + targets if self.targets else lines))
        if args.no_doc:
            return
        png = Path(args.doc).parent / "img" / f"{self.section}.png"
        if self.chart is not None:
            title, panels = self.chart
            plain = [replace(p, reference=None, reference_label="") for p in panels]
            bar_chart(png, title, plain)
            lines += [f"![{self.chart[0]}](img/{png.name})", ""]
        elif self.lines is not None:
            line_chart(png, *self.lines)
            lines += [f"![{self.lines[0]}](img/{png.name})", ""]
        elif self.points is not None:
            scatter_chart(png, *self.points)
            lines += [f"![{self.points[0]}](img/{png.name})", ""]
        write_section(self.section, "\n".join(lines), Path(args.doc))
        print(f"wrote the {self.section} section of {args.doc}")


@dataclass(frozen=True)
class Compared:
    """A benchmark of cases measured in the same repetitions (interleaved, order rotated) and
    reported by their medians: its tables, targets and bar chart. "{reps}" in a title is the
    number of repetitions; every case also gets `KEY_vs` and `KEY_add` against `base` for
    each key of `vs`."""

    section: str
    title: str
    tables: Mapping[str, Columns]
    base: str
    vs: Sequence[str] = ()
    targets: Sequence[Compare] = ()
    bars: Sequence[Bars] = ()
    chart: str = ""
    first: str = "path"
    noisy: float = 0.1
    retries: int = 1
    budget: float = 200.0
    tools: Sequence[str] = ()
    grouped: bool = False
    """Cases are named "GROUP ROW": a table titled "GROUP ..." shows its group's rows, each
    against its group's `base`; the chart shows the first table's."""

    def rows(self, med: dict[str, dict[str, float] | None]) -> list[dict[str, Any]]:
        """Each table's rows: every case, or (grouped) the cases of the table's group."""
        if not self.grouped:
            return [med for _ in self.tables]
        heads = [title.split()[0] + " " for title in self.tables]
        return [{c.removeprefix(h): m for c, m in med.items() if c.startswith(h)} for h in heads]

    def run(
        self, args: argparse.Namespace, cases: Mapping[str, Body]
    ) -> tuple[list[Run], dict[str, dict[str, float] | None]]:
        """Every case in `args.repeats` repetitions; the runs and each case's medians."""
        runs = repeat(
            cases, args.repeats, noisy=self.noisy, retries=self.retries, budget=self.budget
        )
        med = {c: medians(runs, c) for c in cases}
        for rows in self.rows(med) if self.grouped else [med]:
            relative(rows, self.base, self.vs)
        return runs, med

    def report(
        self,
        args: argparse.Namespace,
        runs: Sequence[Run],
        med: dict[str, dict[str, float] | None],
        *more: str,
        notes: Sequence[str] = (),
        code: Mapping[str, str] = {},
        targets: Sequence[Target] = (),
    ) -> Report:
        """The section: `more` facts, the kipside `code` each path ran, `notes` on the run, and
        `targets` judged by the benchmark itself after the declared ones."""
        reps, rows = args.repeats, self.rows(med)
        found = [
            table(title.format(reps=reps), list(cases), cases, columns, self.first)
            for (title, columns), cases in zip(self.tables.items(), rows, strict=True)
            if cases
        ]
        shown = f"Repetitions: {reps}, the cases interleaved (order rotated); median reported."
        chart = (self.chart.format(reps=reps), [b.panel(rows[0], list(rows[0])) for b in self.bars])
        return Report(
            self.section,
            self.title,
            facts(shown, *more, tools=self.tools, code=code),
            found,
            [*(t.judge(runs, med) for t in self.targets), *targets],
            [*notes, *run_notes(runs, self.noisy)],
            chart if self.bars else None,
        )
