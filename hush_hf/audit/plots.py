"""PNG plots for the privacy report (matplotlib's Agg canvas directly: no pyplot, no global backend)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def _figure(width: float = 6.0, height: float = 3.6) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)
    return figure


def _log_bins(values: np.ndarray, bins: int = 30) -> np.ndarray:
    low, high = np.log10(values.min()), np.log10(values.max())
    if high - low < 1e-6:
        low, high = low - 0.05, high + 0.05
    return np.logspace(low, high, bins + 1)


def plot_bound_over_target(plan: Any, path: Path) -> Path:
    """Histogram of bound_j / r_j: every bar must lie at or left of 1 (the target)."""
    ratio = plan.secrets.bound / plan.secrets.target
    figure = _figure()
    axes = figure.add_subplot()
    positive = ratio[ratio > 0]
    if positive.size:
        axes.hist(positive, bins=_log_bins(positive), color="tab:blue")
        axes.set_xscale("log")
    axes.axvline(1.0, color="tab:red", linestyle="--", label="target")
    axes.set_xlabel("certified bound / target posterior")
    axes.set_ylabel("secrets")
    axes.set_title(f"{ratio.size} secrets, {plan.accountant} accountant")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_targets_and_bounds(plan: Any, path: Path) -> Path:
    """Histograms of the priors p_j, targets r_j and certified bounds (log scale)."""
    s = plan.secrets
    figure = _figure()
    axes = figure.add_subplot()
    values = np.concatenate([s.prior, s.target, s.bound])
    values = values[values > 0]
    if values.size:
        bins = _log_bins(values, 40)
        for data, label, color in ((s.prior, "prior p_j", "tab:gray"), (s.target, "target r_j", "tab:orange"),
                                   (s.bound, "certified bound", "tab:blue")):
            axes.hist(data[data > 0], bins=bins, alpha=0.55, label=label, color=color)
        axes.set_xscale("log")
    axes.set_xlabel("probability of reconstructing the secret")
    axes.set_ylabel("secrets")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_exposure(exposure: Mapping[str, Any], path: Path) -> Path:
    """Exposure per canary (by index) against the maximum log2|R| and the chance mean."""
    canaries = exposure["canaries"]
    figure = _figure()
    axes = figure.add_subplot()
    colors = ["tab:red" if c["repetitions"] > 0 else "tab:gray" for c in canaries]
    axes.bar([str(c["index"]) for c in canaries], [c["exposure"] for c in canaries], color=colors)
    axes.axhline(exposure["max_possible"], color="black", linestyle="--", label="max (log2|R|)")
    axes.axhline(exposure["chance_mean"], color="tab:green", linestyle=":", label="chance mean")
    axes.set_xlabel("canary (red: inserted, grey: never inserted)")
    axes.set_ylabel("exposure (bits)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_reconstruction(reconstruction: Mapping[str, Any], path: Path) -> Path:
    """Per secret: the posterior of the true value among its candidates against the certified bound at
    the uniform prior over those candidates (log-log; the mean, not each point, is bounded)."""
    rows = [r for r in reconstruction["secrets"] if r.get("bound_at_candidate_prior")]
    figure = _figure(5.0, 4.2)
    axes = figure.add_subplot()
    bound = np.array([r["bound_at_candidate_prior"] for r in rows])
    posterior = np.array([max(r["probability"], 1e-300) for r in rows])
    axes.scatter(bound, posterior, s=10, label="secrets")
    if rows:
        axes.scatter([bound.mean()], [posterior.mean()], marker="x", color="black", s=60, label="mean")
        low, high = min(bound.min(), posterior.min()), max(bound.max(), posterior.max())
        axes.plot([low, high], [low, high], color="tab:red", linestyle="--", label="posterior = bound")
        axes.set_xscale("log")
        axes.set_yscale("log")
    axes.set_xlabel("certified bound at the prior 1/#candidates")
    axes.set_ylabel("posterior of the true value")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    return path


def report_plot_names(*, plan: Any = None, attacks: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Caption -> file name of every plot the report has for this plan and these attacks (what
    :func:`write_report_plots` draws, and what ``hush verify`` expects privacy_report.md to show)."""
    attacks = attacks or {}
    names: dict[str, str] = {}
    if plan is not None and plan.num_secrets:
        names["Certified bound over target, per secret"] = "bound_over_target.png"
        names["Priors, targets and certified bounds"] = "targets.png"
    if attacks.get("exposure"):
        names["Canary exposure"] = "exposure.png"
    reconstruction = attacks.get("reconstruction")
    if reconstruction and any(r.get("bound_at_candidate_prior") for r in reconstruction["secrets"]):
        names["Secret reconstruction against the bound"] = "reconstruction.png"
    return names


def write_report_plots(output_dir: Path, *, plan: Any = None, attacks: Mapping[str, Any] | None = None
                       ) -> dict[str, Path]:
    """All plots that the available data allows, keyed by caption."""
    attacks = attacks or {}
    draw = {
        "bound_over_target.png": lambda path: plot_bound_over_target(plan, path),
        "targets.png": lambda path: plot_targets_and_bounds(plan, path),
        "exposure.png": lambda path: plot_exposure(attacks["exposure"], path),
        "reconstruction.png": lambda path: plot_reconstruction(attacks["reconstruction"], path),
    }
    return {caption: draw[name](output_dir / name)
            for caption, name in report_plot_names(plan=plan, attacks=attacks).items()}
