"""Figures of an experiment: PNG plots drawn on the Agg canvas (no pyplot state, no display needed).

Secrets are referred to by index only: nothing here receives a secret string.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hush_hf.experiments.results import markdown_table


def new_figure(rows: int, cols: int, *, width: float, height: float) -> tuple[Any, Any]:
    """A matplotlib figure on the Agg canvas (no pyplot state, works without a display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, cols, squeeze=False)
    return figure, axes


def save_figure(figure: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path)
    return path


def bar_panels(
    path: Path,
    labels: Sequence[str],
    panels: Sequence[tuple[str, Sequence[Any], float | None]],
    *,
    title: str,
    colors: Sequence[str] | None = None,
) -> Path:
    """One bar chart per panel ``(title, value per label, reference line or None)``, side by side."""
    figure, axes = new_figure(1, len(panels), width=3.8 * len(panels), height=3.6)
    for ax, (panel_title, values, reference) in zip(axes.ravel(), panels, strict=True):
        heights = [math.nan if v is None else v for v in values]
        ax.bar(list(labels), heights, color=colors)
        ax.set_title(panel_title, fontsize=10)
        ax.tick_params(axis="x", labelsize=8, labelrotation=20)
        if reference is not None:
            ax.axhline(reference, color="black", linestyle=":", linewidth=1)
    figure.suptitle(title, fontsize=10)
    return save_figure(figure, path)


def line_panels(
    path: Path,
    panels: Sequence[Mapping[str, Any]],
    *,
    title: str,
    columns: int = 2,
) -> Path:
    """Line plots, one panel per mapping: ``title``, ``xlabel``, ``ylabel``, ``series`` ({label: (xs, ys)}),
    optional ``hline`` (value, label), ``logx`` (base), ``logy`` (bool)."""
    rows = math.ceil(len(panels) / columns)
    figure, axes = new_figure(rows, columns, width=5.5 * columns, height=4 * rows)
    markers = "osd^v<>"
    for ax, panel in zip(axes.ravel(), panels, strict=False):
        for k, (label, (xs, ys)) in enumerate(panel["series"].items()):
            ax.plot(xs, ys, marker=markers[k % len(markers)], label=label)
        if panel.get("hline"):
            value, label = panel["hline"]
            ax.axhline(value, color="gray", linestyle=":", label=label)
        if panel.get("logx"):
            ax.set_xscale("log", base=panel["logx"])
        if panel.get("logy"):
            ax.set_yscale("log")
        ax.set(xlabel=panel["xlabel"], ylabel=panel["ylabel"], title=panel["title"])
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    figure.suptitle(title, fontsize=10)
    return save_figure(figure, path)


def comparison(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    panels: Sequence[tuple[str, str, float | None]],
    path: Path,
    *,
    title: str,
    label: str = "arm",
    draw: bool = True,
) -> str:
    """A comparison of trained models: the markdown table of ``columns`` (one row each) and, at ``path``
    (when ``draw``), a bar chart per panel ``(column, panel title, reference line or None)``; returns the
    table and the figure's link."""
    colors = ["tab:red", "tab:gray", "tab:orange", "tab:blue", "tab:green", "tab:purple"]
    if draw:
        bars = [(name, [r.get(key) for r in rows], line) for key, name, line in panels]
        names = [str(r[label]) for r in rows]
        bar_panels(path, names, bars, title=title, colors=(colors * len(rows))[: len(rows)])
    table = markdown_table(columns, [[r.get(c) for c in columns] for r in rows])
    return f"{table}\n\n![{path.stem}]({path.name})"


def series_by(rows: Sequence[Mapping[str, Any]], group: str, x: str, y: str) -> dict[str, tuple[list, list]]:
    """``{group value: (xs, ys)}`` from the rows that have a ``y`` (in row order): the lines of a plot."""
    series: dict[str, tuple[list, list]] = {}
    for row in rows:
        if row.get(y) is not None:
            xs, ys = series.setdefault(str(row[group]), ([], []))
            xs.append(row[x])
            ys.append(row[y])
    return series


def bounds_figure(rows: Sequence[Mapping[str, Any]], path: Path, *, what: str = "secret") -> Path:
    """Per secret (a row with ``examples``, ``bound``, ``target`` and ``sensitive``): the certified posterior
    bound over its target against the number of training examples holding it, sensitive secrets apart."""
    figure, axes = new_figure(1, 1, width=6.5, height=4)
    ax = axes[0, 0]
    for flag, color, label in ((False, "tab:blue", "ordinary"), (True, "tab:red", "sensitive")):
        group = [r for r in rows if r["sensitive"] == flag]
        ax.scatter([r["examples"] for r in group], [r["bound"] / r["target"] for r in group], s=12,
                   color=color, label=f"{label} {what}s ({len(group)})")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="target")
    ax.set(xscale="log", xlabel=f"training sequences containing the {what}",
           ylabel="certified bound / target", title=f"Per-{what} certified posterior bound (hush_hf plan)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(figure, path)

