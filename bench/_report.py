"""What the benchmarks report: facts of the run, tables, target verdicts, and their sections of
docs/performance.md, each between `<!-- bench:NAME:start -->` and `<!-- bench:NAME:end -->`:
`write_section()` replaces only that block (appending it when missing). The block holds what a
run found; how a benchmark measures is prose written once in the document, after its block.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _harness import REPO
from _measure import Run, per_rep

from kipside.proxy.devbroker import tansu_path

DOC = REPO / "docs" / "performance.md"
IMG_DIR = REPO / "docs" / "img"
INTRO = "# Performance\n"
NAN = float("nan")


# --------------------------------------------------------------------------- facts


def _output(args: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else "unavailable"


def _proc_field(path: str, key: str) -> str:
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    return "unknown"


def machine() -> str:
    """CPUs, model, memory, kernel and Python of this machine, in one line."""
    kib = _proc_field("/proc/meminfo", "MemTotal").split()[0]
    memory = f"{int(kib) / 1024 / 1024:.1f} GiB" if kib.isdigit() else "unknown"
    return (
        f"{len(os.sched_getaffinity(0))} CPUs (nproc), {_proc_field('/proc/cpuinfo', 'model name')}"
        f", {memory} RAM, Linux {platform.release()}, Python {platform.python_version()}"
    )


def versions(*extra: str) -> dict[str, str]:
    """kipside, Tansu and the client library, then each distribution or tool in `extra`."""
    out = {
        "kipside": importlib.metadata.version("kipside"),
        "Tansu": _output([str(tansu_path()), "--version"]).removeprefix("tansu ").strip(),
    }
    import confluent_kafka

    out["confluent-kafka"] = str(confluent_kafka.__version__)
    out["librdkafka"] = str(confluent_kafka.libversion()[0])
    for name in extra:
        if name == "haproxy":
            line = _output(["haproxy", "-v"])
            out[name] = m.group(1) if (m := re.search(r"version (\S+)", line)) else line
        else:
            out[name] = importlib.metadata.version(name)
    return out


def command_line() -> str:
    """The command that started this process, paths relative to the repository."""

    def rel(arg: str) -> str:
        path = Path(arg)
        return (
            str(path.relative_to(REPO)) if path.is_absolute() and path.is_relative_to(REPO) else arg
        )

    return shlex.join([rel(sys.executable), rel(sys.argv[0]), *sys.argv[1:]])


STARTED = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
"""When the benchmark started (this module is imported at its start)."""


def facts(
    *more: str, tools: Sequence[str] = (), code: Mapping[str, str] | None = None
) -> list[str]:
    """The bullet lines every section starts with: command, date, machine, the versions of
    kipside, Tansu, the client and `tools` (and the kipside `code` each path ran), `more`."""
    listed = ", ".join(f"{k} {v}" for k, v in {**versions(*tools), **(code or {})}.items())
    lines = [f"- Command: `{command_line()}`", f"- Date: {STARTED}", f"- Machine: {machine()}"]
    return [*lines, f"- Versions: {listed}", *(f"- {m}" for m in more)]


# --------------------------------------------------------------------------- tables


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A GitHub table; `align` has one of l, r per column (default: first left, rest right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    marks = {"l": ":---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)]) + "\n"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    return "\n".join([fmt(headers), "  ".join("-" * w for w in widths), *map(fmt, rows)]) + "\n"


@dataclass(frozen=True)
class Table:
    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    align: str = ""


@dataclass(frozen=True)
class Target:
    """A target of an issue and what this run found: ok None means not measured."""

    name: str
    ok: bool | None
    detail: str

    @property
    def mark(self) -> str:
        if self.name.startswith("(no target)"):
            return "compared"
        return "not measured" if self.ok is None else ("met" if self.ok else "**MISSED**")


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
        a, b = med.get(self.case), med.get(self.other)
        if not a or not b:
            return Target(self.name, None, f"{self.case} or {self.other} has no result")

        def of(x: float, y: float) -> float:
            return x - y if self.diff else x / y

        r = of(a[self.key], b[self.key])
        k = self.key
        each = per_rep(runs, self.case, self.other, lambda x, y: of(x.metrics[k], y.metrics[k]))
        shown = "{:+.3f}" if self.diff else "{:.2f}x"
        low, high = shown.format(min(each, default=r)), shown.format(max(each, default=r))
        more = f"; per repetition {low} to {high}" if len(each) > 1 else ""
        ok = r >= self.limit if self.at_least else r <= self.limit
        detail = f"{shown.format(r)} ({number(a[self.key])} vs {number(b[self.key])}{more})"
        return Target(self.name, ok, detail)


def relative(med: dict[str, dict[str, float] | None], base: str, keys: Sequence[str]) -> None:
    """Add `KEY_vs` (ratio to `base`'s median) and `KEY_add` (difference) to every case."""
    b = med.get(base)
    for m in med.values():
        for key in keys:
            if m is not None and key in m:
                m[f"{key}_vs"] = m[key] / b[key] if b and b.get(key) else NAN
                m[f"{key}_add"] = m[key] - b[key] if b and key in b else NAN


# --------------------------------------------------------------------------- the document


def write_section(name: str, body: str, *, doc: Path = DOC, intro: str = INTRO) -> Path:
    """Replace the `name` block of `doc` with `body` (creating the file or block if missing)."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}\n"
    text = doc.read_text() if doc.exists() else intro
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return doc


@dataclass
class Report:
    """One benchmark's findings: printed, and written as its section unless `doc` is None."""

    section: str
    title: str
    facts: list[str]
    tables: list[Table]
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    chart: tuple[str, Callable[[Path], None]] | None = None
    """(alt text, draw(png)): the chart, docs/img/SECTION.png."""
    details: Table | None = None
    """Every run, folded away in the document."""

    def publish(self, args: argparse.Namespace) -> None:
        """Print; unless --no-doc, write the section and chart beside --doc."""
        doc = None if args.no_doc else Path(args.doc)
        for t in self.tables:
            print(f"\n{t.title}\n{text_table(t.headers, t.rows)}")
        for target in self.targets:
            print(f"{target.mark.strip('*').upper():>12}  {target.name}: {target.detail}")
        for note in self.notes:
            print(f"{'NOTE':>12}  {note}")
        if doc is None:
            return
        lines = [f"## {self.title}", "", f"Written by `{command_line().split()[1]}`.", ""]
        lines += [*self.facts, ""]
        for t in self.tables:
            lines += [f"### {t.title}", "", markdown_table(t.headers, t.rows, t.align)]
        if self.targets:
            lines += [
                "### Targets",
                "",
                *(f"- {t.name}: {t.mark}: {t.detail}" for t in self.targets),
            ]
        if self.notes:
            lines += ["", "### Notes on this run", "", *(f"- {n}" for n in self.notes)]
        if self.chart is not None:
            png = doc.parent / "img" / f"{self.section}.png"
            self.chart[1](png)
            lines += ["", f"![{self.chart[0]}](img/{png.name})"]
        if self.details is not None:
            table = markdown_table(self.details.headers, self.details.rows, self.details.align)
            lines += ["", "<details><summary>Every run</summary>", "", table, "</details>"]
        write_section(self.section, "\n".join(lines), doc=doc)
        print(f"\nwrote the {self.section} section of {doc}")


def first_line(text: str | None, width: int = 200) -> str:
    return (text or "").strip().splitlines()[0][:width] if (text or "").strip() else ""


def table(
    title: str,
    cases: Sequence[str],
    found: Mapping[str, dict[str, float] | None],
    columns: Sequence[tuple[str, str | Callable[[dict[str, float]], str]]],
    *,
    first: str = "path",
    align: str = "",
) -> Table:
    """A row per case, a column per (header, cell): a cell is a format string over the case's
    numbers ("{p50:.2f} / {p99:.2f}") or a function of them."""

    def show(cell: str | Callable[[dict[str, float]], str], m: dict[str, float]) -> str:
        text = cell.format(**m) if isinstance(cell, str) else cell(m)
        return "-" if "nan" in text else text

    rows = [
        [case, *(show(cell, m) for _, cell in columns)]
        if (m := found.get(case))
        else [case, "failed or skipped", *[""] * (len(columns) - 1)]
        for case in cases
    ]
    return Table(title, [first, *(h for h, _ in columns)], rows, align)


def doc_args(ap: argparse.ArgumentParser) -> None:
    """--doc FILE and --no-doc, the same in every benchmark."""
    ap.add_argument("--doc", type=Path, default=DOC, help="the markdown file to write")
    ap.add_argument("--no-doc", action="store_true", help="print only; leave the document alone")


def run_notes(runs: Sequence[Run], noisy: float) -> list[str]:
    """Failures, what proxies logged, runs measured again and runs disturbed by other load."""
    out = [f"`{r.case}` rep {r.rep} failed: `{first_line(r.error)}`" for r in runs if not r.ok]
    for r in runs:
        out += [f"`{r.case}` rep {r.rep}: the proxy logged `{p[:200]}`" for p in r.problems[:3]]
    if again := [r for r in runs if r.attempts > 1]:
        out.append(f"{len(again)} run(s) measured again after other load; the last attempt counts.")
    if busy := [r for r in runs if r.ok and r.noise > noisy]:
        out.append(
            f"**{len(busy)} of {len(runs)} runs shared the machine with other load** (over "
            f"{noisy} cores busy outside this benchmark): their numbers are depressed."
        )
    return out


def number(v: float) -> str:
    """A figure with the digits that matter: 1,234 or 12.3 or 0.123."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.3f}"
