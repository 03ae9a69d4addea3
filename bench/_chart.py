"""The benchmarks' charts (matplotlib): panels of bars, a group per label with a bar per series;
panels of lines over time (the soak); and panels of points, one metric against another (latency
against broker requests)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PATH_COLORS = {"direct": "#7f7f7f", "kipside": "#d62728", "tansu-proxy": "#1f77b4"}
PATH_COLORS |= {"haproxy": "#2ca02c", "relay": "#bcbd22", "kipside-before": "#f4a3a3"}
SERIES_COLORS = ("#fcae91", "#fb6a4a", "#cb181d", "#67000d")


@dataclass(frozen=True)
class Panel:
    """One chart panel. A series named "" has its bars colored by their labels (paths)."""

    title: str
    labels: Sequence[str]
    series: Mapping[str, Sequence[float | None]]
    fmt: str = "{:,.3g}"
    reference: float | None = None
    reference_label: str = ""
    log: bool = False


@dataclass(frozen=True)
class Bars:
    """A panel of one median per case, with a line at `factor` x `case`'s bar plus `add`."""

    title: str
    key: str
    fmt: str = "{:,.3g}"
    case: str | None = None
    factor: float = 1.0
    add: float = 0.0
    line: str = ""

    def panel(self, med: Mapping[str, dict[str, float] | None], cases: Sequence[str]) -> Panel:
        shown = [c for c in cases if med.get(c)]
        base = med.get(self.case) if self.case else None
        ref = base[self.key] * self.factor + self.add if base else None
        return grouped(self.title, med, self.key, shown, {"": shown}, self.fmt, ref, self.line)


def grouped(
    title: str,
    found: Mapping[str, Mapping[str, float] | None],
    key: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[str]],
    fmt: str = "{:,.3g}",
    reference: float | None = None,
    line: str = "",
    log: bool = False,
) -> Panel:
    """A panel of `key` of the cases in `found`: `series` names each series' case per label."""
    values = {
        name: [(found.get(c) or {}).get(key) for c in cases] for name, cases in series.items()
    }
    return Panel(title, labels, values, fmt, reference, line, log)


def grid(panels: Sequence[Any], cols: int, width: float, height: float) -> tuple[Any, list[Any]]:
    """A figure of `cols` columns of axes, one titled axes per panel (the spare ones hidden)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.6), squeeze=False)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        ax.set_title(panel.title, fontsize=10.5)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, list(axes.flat)[: len(panels)]


def save(fig: Any, png: Path, title: str, legend: Sequence[Any] = ()) -> None:
    """Title the figure, add one legend for all panels (if any) and write it as `png`."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=11.5)
    if legend:
        fig.legend(handles=list(legend), loc="lower center", ncol=len(legend), frameon=False)
    fig.tight_layout(rect=(0, 0.05 if legend else 0, 1, 1))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def bar_chart(png: Path, title: str, panels: Sequence[Panel], cols: int = 2) -> None:
    """A grid of panels in one PNG, with one legend for the series."""
    from matplotlib.patches import Patch

    fig, axes = grid(panels, cols, 5.6, 3.6)
    legend: dict[str, Patch] = {}
    for ax, panel in zip(axes, panels, strict=True):
        width = 0.8 / len(panel.series)
        for j, (name, values) in enumerate(panel.series.items()):
            shown = [None if v is None or v != v else v for v in values]  # NaN: no bar
            if name:
                color = PATH_COLORS.get(name, SERIES_COLORS[j % len(SERIES_COLORS)])
                colors = [color] * len(shown)
                legend.setdefault(name, Patch(facecolor=color, label=name))
            else:
                colors = [PATH_COLORS.get(label, "#9467bd") for label in panel.labels]
            xs = [i + (j - (len(panel.series) - 1) / 2) * width for i in range(len(shown))]
            floor = 1e-3 if panel.log else 0.0
            heights = [floor if v is None else max(v, floor) for v in shown]
            bars = ax.bar(xs, heights, width * 0.92, color=colors)
            for bar, value in zip(bars, shown, strict=True):
                text = "-" if value is None else panel.fmt.format(value)
                top = (bar.get_x() + bar.get_width() / 2, bar.get_height())
                ax.annotate(
                    text, top, xytext=(0, 2), textcoords="offset points", ha="center", fontsize=8
                )
        if panel.reference is not None:
            line = ax.axhline(panel.reference, color="black", linestyle="--", linewidth=1)
            line.set_label(panel.reference_label)
            ax.legend(handles=[line], loc="upper left", fontsize=8, frameon=False)
        labels = [label.replace("-", "\n").replace(", ", "\n") for label in panel.labels]
        ax.set_xticks(list(range(len(labels))), labels, fontsize=8)
        ax.set_yscale("log" if panel.log else "linear")
        ax.margins(y=0.25)
    save(fig, png, title, list(legend.values()))


@dataclass(frozen=True)
class Lines:
    """One chart panel of lines over a shared x axis (e.g. minutes into a run)."""

    title: str
    x: Sequence[float]
    series: Mapping[str, Sequence[float]]
    xlabel: str = ""
    ylabel: str = ""


def line_chart(png: Path, title: str, panels: Sequence[Lines], cols: int = 1) -> None:
    """A grid of line panels in one PNG; each panel's y axis starts at 0, so that a flat line
    looks flat."""
    fig, axes = grid(panels, cols, 9, 2.6)
    for ax, panel in zip(axes, panels, strict=True):
        for j, (name, values) in enumerate(panel.series.items()):
            color = SERIES_COLORS[(j + 2) % len(SERIES_COLORS)]
            ax.plot(panel.x, values, label=name, color=color, linewidth=1.2)
        top = max((max(v) for v in panel.series.values() if v), default=1.0)
        ax.set_ylim(bottom=0, top=top * 1.2)
        ax.set_xlabel(panel.xlabel, fontsize=9)
        ax.set_ylabel(panel.ylabel, fontsize=9)
        if len(panel.series) > 1:
            ax.legend(fontsize=8, frameon=False, loc="lower right")
    save(fig, png, title)


@dataclass(frozen=True)
class Points:
    """One chart panel of points: per path, (x, y) pairs drawn with one marker each."""

    title: str
    points: Mapping[str, Sequence[tuple[float, float]]]
    markers: Sequence[tuple[str, str]]
    """(marker, label) of each pair's position: e.g. ("o", "p50"), ("^", "p99")."""
    xlabel: str = ""
    ylabel: str = ""


def scatter_chart(png: Path, title: str, panels: Sequence[Points], cols: int = 2) -> None:
    """A grid of point panels in one PNG; both axes start at 0, one legend for the paths and
    the markers."""
    from matplotlib.lines import Line2D

    fig, axes = grid(panels, cols, 5.6, 3.8)
    legend: dict[str, Line2D] = {}
    for ax, panel in zip(axes, panels, strict=True):
        for path, pairs in panel.points.items():
            color = PATH_COLORS.get(path.split("@")[0], "#9467bd")
            for (x, y), (marker, _label) in zip(pairs, panel.markers, strict=False):
                ax.plot([x], [y], marker=marker, color=color, markersize=8, linestyle="")
                ax.annotate(f"{y:.3g}", (x, y), xytext=(6, 0), textcoords="offset points",
                            fontsize=8, va="center")  # fmt: skip
            legend.setdefault(path, Line2D([], [], color=color, marker="s", linestyle="",
                                           label=path))  # fmt: skip
        for marker, label in panel.markers:
            legend.setdefault(label, Line2D([], [], color="black", marker=marker,
                                            linestyle="", label=label))  # fmt: skip
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.margins(x=0.25, y=0.2)
        ax.set_xlabel(panel.xlabel, fontsize=9)
        ax.set_ylabel(panel.ylabel, fontsize=9)
    save(fig, png, title, list(legend.values()))
