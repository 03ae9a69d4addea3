"""Reporting helpers shared by the benchmarks: machine/version facts, tables, charts, and the
section writer for docs/performance.md.

Each benchmark owns one section of docs/performance.md, delimited by
`<!-- bench:NAME:start -->` and `<!-- bench:NAME:end -->`; `write_section()` replaces only that
section (appending it when missing) and leaves everything else in the file alone.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
DOC = REPO / "docs" / "performance.md"
IMG_DIR = REPO / "docs" / "img"

INTRO = """\
# Performance

Measurements of kipside against the same broker reached directly and through other proxies,
all on one machine over loopback. Each section below is written by a script under `bench/`
and says how it was run; re-run the script to refresh it. Numbers from different machines or
different runs are not comparable with each other: compare rows within one section.
"""


# --------------------------------------------------------------------------- facts


def machine_info() -> dict[str, str]:
    """nproc, CPU model, memory, kernel and Python of this machine."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                kib = int(line.split()[1])
                mem = f"{kib / 1024 / 1024:.1f} GiB"
                break
    except (OSError, ValueError):
        pass
    return {
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": model,
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def _first_line(args: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    text = (done.stdout or done.stderr).strip().splitlines()
    return text[0] if text else "unavailable"


def versions(*, haproxy: str | None = "/usr/sbin/haproxy") -> dict[str, str]:
    """Versions of kipside, Tansu, the client library and (optionally) haproxy."""
    from kipside.proxy.devbroker import tansu_path

    out: dict[str, str] = {}
    try:
        out["kipside"] = importlib.metadata.version("kipside")
    except importlib.metadata.PackageNotFoundError:
        out["kipside"] = "not installed"
    out["Tansu"] = _first_line([str(tansu_path()), "--version"]).removeprefix("tansu ").strip()
    try:
        import confluent_kafka

        out["confluent-kafka"] = str(confluent_kafka.__version__)
        out["librdkafka"] = str(confluent_kafka.libversion()[0])
    except ImportError:
        out["confluent-kafka"] = "not installed"
    if haproxy is not None:
        line = _first_line([haproxy, "-v"])
        match = re.search(r"version (\S+)", line)
        out["haproxy"] = match.group(1) if match else line
    return out


def command_line() -> str:
    """The command that started this process, with repo paths made relative to the repo."""

    def rel(arg: str) -> str:
        path = Path(arg)
        if path.is_absolute():
            try:
                return str(path.relative_to(REPO))
            except ValueError:
                return arg
        return arg

    return shlex.join([rel(sys.executable), rel(sys.argv[0]), *sys.argv[1:]])


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def facts_markdown(command: str, date: str, machine: dict[str, str], vers: dict[str, str]) -> str:
    mach = (
        f"{machine['nproc']} CPUs (nproc), {machine['cpu']}, {machine['memory']} RAM, "
        f"Linux {machine['kernel']}, Python {machine['python']}"
    )
    ver = ", ".join(f"{k} {v}" for k, v in vers.items())
    return f"- Command: `{command}`\n- Date: {date}\n- Machine: {mach}\n- Versions: {ver}\n"


# --------------------------------------------------------------------------- tables


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None
) -> str:
    """A GitHub markdown table; `align` is one char per column: l, r or c."""
    align = align or "l" + "r" * (len(headers) - 1)
    marks = {"l": ":---", "r": "---:", "c": ":---:"}
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(marks[a] for a in align) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain fixed-width table for the terminal."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(headers), sep, *(fmt(r) for r in rows)]) + "\n"


# --------------------------------------------------------------------------- charts


@dataclass
class Panel:
    """One bar chart panel: a value per label; `None` values are drawn as 'n/a'."""

    title: str
    ylabel: str
    labels: list[str]
    values: list[float | None]
    fmt: str = "{:.3g}"
    reference: float | None = None
    reference_label: str = ""
    colors: list[str] = field(default_factory=list)
    missing: str = "n/a"


PATH_COLORS = {
    "direct": "#7f7f7f",
    "kipside": "#d62728",
    "tansu-proxy": "#1f77b4",
    "haproxy": "#2ca02c",
    "relay": "#bcbd22",
    "kipside-before": "#f4a3a3",
}


def bar_chart(png: Path, panels: Sequence[Panel], title: str, *, cols: int = 2) -> None:
    """Write a grid of bar charts to `png` (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        xs = range(len(panel.labels))
        heights = [v if v is not None else 0.0 for v in panel.values]
        colors = panel.colors or [PATH_COLORS.get(lbl, "#9467bd") for lbl in panel.labels]
        bars = ax.bar(xs, heights, color=colors, width=0.65)
        top = max([*heights, panel.reference or 0.0, 1e-9])
        for bar, value in zip(bars, panel.values, strict=True):
            text = panel.fmt.format(value) if value is not None else panel.missing
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=9,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"},
            )
        if panel.reference is not None:
            ax.axhline(
                panel.reference,
                color="black",
                linestyle="--",
                linewidth=1,
                label=panel.reference_label or None,
            )
            if panel.reference_label:
                ax.legend(loc="upper right", fontsize=8, frameon=False)
        ax.set_xticks(list(xs), panel.labels)
        ax.set_title(panel.title, fontsize=11)
        ax.set_ylabel(panel.ylabel)
        ax.set_ylim(0, top * 1.32)
        ax.spines[["top", "right"]].set_visible(False)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- the document


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def write_section(name: str, body: str, *, doc: Path = DOC, intro: str = INTRO) -> Path:
    """Replace the `name` section of `doc` with `body` (creating the file/section if missing)."""
    start, end = _markers(name)
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
