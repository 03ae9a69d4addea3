"""The benchmarks' charts: panels of bars (one per case, or grouped series), matplotlib Agg."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PATH_COLORS = {"direct": "#7f7f7f", "kipside": "#d62728", "tansu-proxy": "#1f77b4"}
PATH_COLORS |= {"haproxy": "#2ca02c", "relay": "#bcbd22", "kipside-before": "#f4a3a3"}
SERIES_COLORS = ("#fcae91", "#fb6a4a", "#cb181d", "#67000d")


@dataclass
class Panel:
    """One chart panel: a bar per label, or with `values` a dict, a group of bars per label
    (one series each). `None` values are drawn as `missing`."""

    title: str
    ylabel: str
    labels: list[str]
    values: Sequence[float | None] | Mapping[str, Sequence[float | None]]
    fmt: str | Callable[[float], str] = "{:.3g}"
    reference: float | None = None
    reference_label: str = ""
    colors: list[str] = field(default_factory=list)
    missing: str = "n/a"
    log: bool = False
    hatched: list[list[bool]] | None = None
    """Per series, per label: draw the bar hatched (e.g. the run was overloaded)."""


def bar_chart(png: Path, panels: Sequence[Panel], title: str, *, cols: int = 2) -> None:
    """A grid of (grouped) bar panels in one PNG, one legend for the series (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.6 * cols, 3.6 * rows + 0.6), squeeze=False)
    legend: dict[str, Patch] = {}
    for ax, panel in zip(axes.flat, panels, strict=False):
        series = panel.values if isinstance(panel.values, Mapping) else {"": panel.values}
        n, width = len(series), 0.8 / len(series)
        series = {k: [None if v is None or v != v else v for v in vs] for k, vs in series.items()}
        every = [v for vals in series.values() for v in vals if v is not None]
        for j, (name, values) in enumerate(series.items()):
            color = SERIES_COLORS[j % len(SERIES_COLORS)] if name else None
            colors = (
                [color] * len(values)
                if color
                else panel.colors or [PATH_COLORS.get(lbl, "#9467bd") for lbl in panel.labels]
            )
            if name:
                legend.setdefault(name, Patch(facecolor=color, label=name))
            xs = [i + (j - (n - 1) / 2) * width for i in range(len(values))]
            floor = 1e-3 if panel.log else 0.0
            heights = [max(v, floor) if v is not None else floor for v in values]
            bars = ax.bar(xs, heights, width * 0.92, color=colors)
            for i, (bar, value) in enumerate(zip(bars, values, strict=True)):
                if panel.hatched is not None and panel.hatched[j][i]:
                    bar.set_hatch("////")
                    bar.set_edgecolor("white")
                    hatch: dict[str, Any] = {
                        "facecolor": "#999",
                        "hatch": "////",
                        "edgecolor": "white",
                    }
                    legend.setdefault("~", Patch(**hatch, label="hatched: overloaded"))
                shown = panel.fmt if callable(panel.fmt) else panel.fmt.format
                text = panel.missing if value is None else shown(value)
                xy, size = (
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    6.5 if n >= 4 else 8,
                )
                style: dict[str, Any] = {
                    "textcoords": "offset points",
                    "ha": "center",
                    "va": "bottom",
                }
                ax.annotate(text, xy, xytext=(0, 2), fontsize=size, **style)
        if panel.reference is not None:
            line = ax.axhline(panel.reference, color="black", linestyle="--", linewidth=1)
            if panel.reference_label:
                line.set_label(panel.reference_label)
                ax.legend(handles=[line], loc="upper left", fontsize=8, frameon=False)
        ax.set_xticks(list(range(len(panel.labels))), panel.labels, fontsize=8.5)
        ax.set_title(panel.title, fontsize=10.5)
        ax.set_ylabel(panel.ylabel)
        top = max([*every, panel.reference or 0.0, 1e-9])
        if panel.log:
            ax.set_yscale("log")
            ax.set_ylim(min([v for v in every if v > 0], default=1.0) / 3, top * 30)
        else:
            ax.set_ylim(0, top * 1.3)
        ax.spines[["top", "right"]].set_visible(False)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    height = fig.get_figheight()
    fig.suptitle(title, fontsize=11.5, y=1 - 0.12 / height)
    if legend:
        anchor, handles = (0.5, 1 - 0.42 / height), list(legend.values())
        place: dict[str, Any] = {"loc": "upper center", "bbox_to_anchor": anchor, "frameon": False}
        fig.legend(handles=handles, ncol=len(handles), fontsize=9, **place)
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.75 if legend else 0.4) / height))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)


@dataclass(frozen=True)
class Bars:
    """A chart panel of one median per case, with a line at `ref_factor` x `ref_case`'s bar
    plus `ref_add` (or at `ref_add` alone, with no `ref_case`)."""

    title: str
    key: str
    fmt: str = "{:,.3g}"
    ref_case: str | None = None
    ref_factor: float = 1.0
    ref_add: float = 0.0
    ref_label: str = ""

    def panel(self, med: Mapping[str, dict[str, float] | None], cases: Sequence[str]) -> Panel:
        shown = [c for c in cases if med.get(c)]
        values: list[float | None] = [(med[c] or {})[self.key] for c in shown]
        if self.ref_case is None:
            ref = self.ref_add if self.ref_label else None
        else:
            base = med.get(self.ref_case)
            ref = base[self.key] * self.ref_factor + self.ref_add if base else None
        labels = [c.replace("-", "\n") for c in shown]
        colors = [PATH_COLORS.get(c, "#9467bd") for c in shown]
        return Panel(self.title, "", labels, values, self.fmt, ref, self.ref_label, colors, "-")
