"""The LP-constant sweep of Hush Fig. 1: a plan per (setting, c), the runs they share, the table and figure.

A *setting* is an LP budget with an accountant (the paper's ``c * mu_j`` with the KL accountant, hush_hf's
``c * g_j`` with the tight one). c is ``relative`` by default: c = 2^4 is exactly where the LP keeps every
example, the paper's statement about its Fig. 1 (taken literally, mu_j would need c in the thousands).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hush_hf.data import SECRET_IDS_COLUMN
from hush_hf.experiments.checks import check_choice, check_int, check_names, check_number
from hush_hf.experiments.figures import line_panels, series_by
from hush_hf.experiments.logs import logger
from hush_hf.experiments.planning import no_preprocessing_lp_c, plan_many
from hush_hf.experiments.results import pivot_table
from hush_hf.experiments.training import train_model

NO_PREPROCESSING_C = 2.0**4  # the paper: at c = 2^4 the LP keeps every example
# Hush Fig. 1's settings: name -> (LP budget, accountant).
FIG1_SETTINGS = {"paper": ("paper", "kl"), "hush_hf": ("tight", "tight")}


@dataclass
class SweepArguments:
    """The fields of an experiment that sweeps the LP constant (mixed into its argument dataclass)."""

    settings: list[str] = field(
        default_factory=lambda: list(FIG1_SETTINGS), metadata={"help": "paper, hush_hf."}
    )
    c_exponents: list[int] | None = field(default=None, metadata={"help": "Plan c = 2^k for these k."})
    train_c_exponents: list[int] | None = field(default=None, metadata={"help": "Train these k (planned)."})
    c_unit: str = field(default="relative", metadata={"help": "relative (c = 2^4 keeps all) or absolute."})
    accounting_scale: float | None = field(default=None, metadata={"help": "Train with sigma/s: uncertified"})
    planning_workers: int | None = field(default=None, metadata={"help": "Processes computing the plans."})


def check_sweep_arguments(args: SweepArguments) -> None:
    """ValueError naming the field and value for a bad :class:`SweepArguments` field."""
    check_choice("c_unit", args.c_unit, ("relative", "absolute"))
    check_names("settings", args.settings, list(FIG1_SETTINGS))
    check_int("planning_workers", args.planning_workers, minimum=1)
    missing = sorted(set(args.train_c_exponents or []) - set(args.c_exponents or []))
    if not args.c_exponents or missing:
        raise ValueError(f"train_c_exponents {missing} are not in c_exponents={args.c_exponents!r}")
    check_number("accounting_scale", args.accounting_scale, low=0.0, high=math.inf)
    if args.accounting_scale < 1:
        raise ValueError(f"accounting_scale must be >= 1 (1: certified noise), got {args.accounting_scale!r}")


def accounting_scale_warning(scale: float) -> str | None:
    """None at scale 1; else the warning every output of a run trained with sigma / scale carries (Hush
    Sec. 5.1 simulates a 10x larger batch and dataset this way: its bounds do not hold for this run)."""
    if scale == 1:
        return None
    return (
        f"ACCOUNTING SCALE {scale:g}: EVERY MODEL IS TRAINED WITH sigma / {scale:g}. THE CERTIFIED "
        f"PER-SECRET BOUNDS HOLD ONLY FOR THE SIMULATED SETTING WITH A {scale:g}x LARGER BATCH AND DATASET, "
        "NOT FOR THE MODELS THIS RUN TRAINS (Hush Sec. 5.1 reproduction). Do not publish these models as "
        "protected."
    )


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
            jobs.append({SECRET_IDS_COLUMN: secret_ids, "priors": secrets.priors, "targets": secrets.targets,
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


def train_sweep(
    rows: Sequence[dict[str, Any]],
    plans: Mapping[tuple[str, int], Any],
    *,
    build_model: Callable[[], Any],
    score: Callable[[Any], dict[str, Any]],
    config: Any,
    train: Any,
    collator: Any,
    output_dir: Path,
    trainer_class: type | None = None,
    save_models: bool = False,
) -> list[dict[str, Any]]:
    """The plain ``Trainer`` (run ``non_private``), then each planned (setting, c) row without noise and
    with its ``noise_multiplier_trained``, each on a fresh ``build_model()`` scored by ``score`` (which
    gives at least ``test_loss``); the rows get their runs' test losses and names. A run equal to an
    earlier one (:func:`same_run`) is not trained again. Returns the records of the runs trained."""
    from tqdm.auto import tqdm

    jobs: list[tuple[Any, str, Any, float]] = [(None, "non_private", None, 0.0)]
    for row in rows:
        if (plan := plans.get((row["setting"], row["c_exponent"]))) is not None:
            jobs += [(row, "no_noise", plan, 0.0), (row, "noise", plan, row["noise_multiplier_trained"])]
    trained: list[tuple[Any, float, dict[str, Any]]] = []
    for row, kind, plan, sigma in tqdm(jobs, desc="Training runs"):
        name = kind if row is None else f"{row['setting']}_c{row['c_exponent']:+d}_{kind}"
        record = next((r for p, s, r in trained if same_run(plan, sigma, p, s)), None)
        if record is None:
            logger.info("Run %s (sigma = %.4g)", name, sigma)
            model, run_dir = build_model(), output_dir / "runs" / name
            trainer, record = train_model(model, config, plan, train=train, collator=collator,
                                          run_dir=run_dir, trainer_class=trainer_class,
                                          noise_multiplier=sigma)
            if save_models and trainer.is_world_process_zero():
                trainer.save_model(str(run_dir))
            record = {"name": name, "sigma": sigma, **record, **score(model)}
            trained.append((plan, sigma, record))
        if row is not None:
            row[f"test_loss_{kind}"], row[f"run_{kind}"] = record["test_loss"], record["name"]
    return [record for _, _, record in trained]


def sweep_arms(
    arms: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]], *,
    smallest_c: int,
) -> list[dict[str, Any]]:
    """The comparison at one guarantee: one row per arm that was trained. ``arms`` maps an arm's name to
    the (setting, c exponent) of its noisy run, ``None`` for the plain ``Trainer`` run or ``"min"`` for
    hush_hf at ``smallest_c``, the smallest trained c."""
    by_name, by_key = {r["name"]: r for r in runs}, {(r["setting"], r["c_exponent"]): r for r in rows}
    found = []
    for arm, key in arms.items():
        key = ("hush_hf", smallest_c) if key == "min" else key
        row = by_key.get(key, {}) if key else {"run_noise": "non_private"}
        if (run := by_name.get(row.get("run_noise"))) is not None:
            found.append({"arm": arm, "c": key and f"2^{key[1]}", "accountant": row.get("accountant"), **{
                k: run[k] for k in ("sigma", "test_loss", "exposure_mean", "exposure_max", "name")}})
    return found


def gap_closed(arms: Sequence[Mapping[str, Any]], *, baseline: str, best: str, method: str) -> float | None:
    """(L_baseline - L_method) / (L_baseline - L_best): the share of the baseline arm's test-loss gap to
    the ``best`` arm (e.g. non-private training) that ``method`` closes; None when an arm was not
    trained or there is no gap."""
    loss = {a["arm"]: a["test_loss"] for a in arms}
    if {best, baseline, method} - set(loss) or loss[baseline] == loss[best]:
        return None
    return (loss[baseline] - loss[method]) / (loss[baseline] - loss[best])


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
