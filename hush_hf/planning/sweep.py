"""Sweeping the LP constant c: retained data vs noise (Hush Fig. 1a and 1c)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from hush_hf.planning.plan import plan_protection

PAPER_C_VALUES = tuple(2.0**k for k in range(-6, 5))  # c = 2^-6 ... 2^4, as in Fig. 1


def sweep_lp_c(
    secret_ids: Any,
    priors: np.ndarray,
    targets: np.ndarray,
    *,
    c_values: Sequence[float] = PAPER_C_VALUES,
    progress: bool = True,
    **plan_kwargs: Any,
) -> list[dict[str, Any]]:
    """One plan per c; returns rows with c, retained fractions and sigma.

    A c for which the plan is infeasible (e.g. sum(w) < B) gets a row with ``error`` set instead of
    numbers, so the sweep shows where the trade-off ends.
    """
    rows = []
    for c in tqdm(list(c_values), desc="Sweeping lp_c", disable=not progress):
        try:
            plan = plan_protection(secret_ids, priors, targets, lp_c=c, progress=False, **plan_kwargs)
        except ValueError as err:
            rows.append({"lp_c": float(c), "error": str(err)})
            continue
        rows.append(
            {
                "lp_c": float(c),
                "retained_fraction": plan.retained_fraction,
                "retained_weight_fraction": plan.retained_weight_fraction,
                "noise_multiplier": plan.noise_multiplier,
                "lp_gap": plan.lp["gap"],
            }
        )
    return rows


def plot_sweep(rows: list[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Two panels: retained fraction vs c (Fig. 1a) and noise multiplier vs c (Fig. 1c)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "error" not in r]
    cs = [r["lp_c"] for r in ok]
    fig, (ax_kept, ax_sigma) = plt.subplots(1, 2, figsize=(10, 4))
    ax_kept.plot(cs, [r["retained_fraction"] for r in ok], "o-", label="examples with w > 0")
    ax_kept.plot(cs, [r["retained_weight_fraction"] for r in ok], "s--", label="sum(w) / n")
    ax_kept.set(
        xscale="log",
        xlabel="LP constant c",
        ylabel="fraction of examples",
        ylim=(0, 1.05),
        title="Retained data",
    )
    ax_kept.legend()
    ax_sigma.plot(cs, [r["noise_multiplier"] for r in ok], "o-", color="C3")
    ax_sigma.set(
        xscale="log", xlabel="LP constant c", ylabel="noise multiplier sigma", title="Calibrated noise"
    )
    for ax in (ax_kept, ax_sigma):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
