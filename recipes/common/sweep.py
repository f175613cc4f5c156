"""The LP-constant sweep of Hush Fig. 1: a plan per (setting, c), the runs they share, the table and figure.

A *setting* is an LP budget with an accountant (the paper's ``c * mu_j`` with the KL accountant, hush_hf's
``c * g_j`` with the tight one). c is ``relative`` by default: c = 2^4 is exactly where the LP keeps every
example, the paper's statement about its Fig. 1 (taken literally, mu_j would need c in the thousands).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common.logs import logger
from common.outputs import line_panels, pivot_table, series_by
from common.planning import no_preprocessing_lp_c, plan_many

NO_PREPROCESSING_C = 2.0**4  # the paper: at c = 2^4 the LP keeps every example


def c_unit_for(sizes: np.ndarray, budget: np.ndarray, c_unit: str) -> float:
    """The factor k with lp_c = c * k; ``relative``: c = 2^4 is exactly where the LP keeps every example."""
    if c_unit == "absolute":
        return 1.0
    try:
        return no_preprocessing_lp_c(sizes, budget) / NO_PREPROCESSING_C
    except ValueError:
        raise ValueError("no training example contains any secret; widen --secret_band") from None


def plan_sweep(
    settings: Mapping[str, tuple[str, str]],
    c_exponents: Sequence[int],
    secret_ids: Any,
    secrets: Any,
    sizes: np.ndarray,
    *,
    config: Any,
    c_unit: str,
    workers: int,
    keep: Sequence[int],
    plan_dir: Path,
    **plan_kwargs: Any,
) -> tuple[list[dict[str, Any]], dict[tuple[str, int], Any]]:
    """One plan per (setting, c = 2^k): the table's rows, and the plans of the k in ``keep`` (saved in
    ``plan_dir``). ``sizes[j]`` = |D_j|; the slow plans (tight accountant, small c) are computed first, in
    ``workers`` processes; a plan that cannot be made (e.g. too little weight for B) gets ``error``."""
    from hush_hf.accounting import lp_budget

    rows, jobs = [], []
    for setting, (budget, accountant) in settings.items():
        unit = c_unit_for(sizes, lp_budget(secrets.priors, secrets.targets, budget), c_unit)
        for k in c_exponents:
            rows.append({"setting": setting, "c_exponent": k, "c": 2.0**k, "lp_c": 2.0**k * unit,
                         "budget": budget, "accountant": accountant})
            jobs.append({"secret_ids": secret_ids, "priors": secrets.priors, "targets": secrets.targets,
                         "expected_batch_size": config.expected_batch_size, "steps": config.max_steps,
                         "lp_c": 2.0**k * unit, "accountant": accountant, "budget": budget, **plan_kwargs})
    order = sorted(range(len(jobs)), key=lambda n: (jobs[n]["accountant"] != "tight", rows[n]["c_exponent"]))
    outcomes = plan_many([jobs[n] for n in order], workers=workers, desc="Planning (setting, c)")
    plans = {}
    for n, (plan, error, seconds) in zip(order, outcomes, strict=True):
        row = rows[n]
        row["plan_seconds"] = seconds
        if plan is None:
            row["error"] = error
            continue
        row.update(retained_fraction=plan.retained_fraction, noise_multiplier=plan.noise_multiplier,
                   retained_weight_fraction=plan.retained_weight_fraction, meets_targets=plan.meets_targets,
                   bound_over_target_max=plan.summary()["bound_over_target_max"])
        logger.info("%s, c = 2^%d: retained %.3f, sigma %.4g (%.0f s)", row["setting"], row["c_exponent"],
                    plan.retained_fraction, plan.noise_multiplier, seconds)
        if row["c_exponent"] in keep:
            plans[(row["setting"], row["c_exponent"])] = plan
            plan.save(plan_dir / f"{row['setting']}_c{row['c_exponent']:+d}.json")
    return rows, plans


def same_run(plan: Any, sigma: float, other_plan: Any, other_sigma: float) -> bool:
    """Same sigma and sampling probabilities (to 1e-9, the LP's rounding): one experiment, trained once
    (e.g. c = 2^4 keeps every example in every setting). ``None`` (no plan) equals only itself."""
    if plan is None or other_plan is None:
        return plan is other_plan
    same_rates = np.allclose(plan.sampling_probs, other_plan.sampling_probs, rtol=1e-9, atol=0)
    return sigma == other_sigma and same_rates


def sweep_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Fig. 1 as a table: a line per c, retained fraction, sigma and both test losses per setting."""
    return pivot_table(rows, row="c_exponent", column="setting", row_title="c", row_format="2^{}", values={
        "retained_fraction": "retained", "noise_multiplier": "sigma", "test_loss_no_noise": "loss (no noise)",
        "test_loss_noise": "loss (sigma)"})


def sweep_figure(rows: Sequence[Mapping[str, Any]], path: Path, *, init_loss: float, title: str) -> Path:
    """Fig. 1a-d: retained examples, test loss without noise, sigma and test loss with sigma, against c."""
    panels = []
    for key, ylabel, panel in (("retained_fraction", "fraction with w > 0", "(a) retained examples"),
                               ("test_loss_no_noise", "test loss", "(b) test loss, trained without noise"),
                               ("noise_multiplier", "noise multiplier sigma", "(c) calibrated noise"),
                               ("test_loss_noise", "test loss", "(d) test loss, trained with sigma")):
        panels.append({"title": panel, "xlabel": "LP constant c", "ylabel": ylabel, "logx": 2,
                       "series": series_by(rows, "setting", "c", key), "logy": key == "noise_multiplier",
                       "hline": (init_loss, "at initialisation") if key == "test_loss_noise" else None})
    return line_panels(path, panels, title=title)
