"""Plans of an experiment: at the run's B, T and accountant, the LP constant that keeps every example, and
many plans in parallel."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hush_hf.experiments.checks import check_int


def no_preprocessing_lp_c(sizes: Any, budget: Any) -> float:
    """The smallest LP constant c at which every weight w_i = 1 is feasible in Hush eq. (1).

    All ones are feasible exactly when |D_j| <= c * budget_j for every secret j, i.e. for
    c >= max_j |D_j| / budget_j: from there on the LP keeps every example (uniform sampling).
    """
    import numpy as np

    sizes, budget = np.asarray(sizes, dtype=np.float64), np.asarray(budget, dtype=np.float64)
    used = sizes > 0
    if not used.any():
        raise ValueError("no training example contains any secret")
    return float(np.max(sizes[used] / budget[used]))


def _timed_plan(kwargs: dict[str, Any]) -> tuple[Any, str | None, float]:
    """``plan_protection(**kwargs)`` -> (plan or None, error message or None, seconds); runs in a worker."""
    from hush_hf.planning import plan_protection

    start = time.perf_counter()
    try:
        return plan_protection(**kwargs), None, time.perf_counter() - start
    except ValueError as error:  # e.g. the LP keeps too little weight to fill a batch of B
        return None, str(error), time.perf_counter() - start


def plan_many(
    jobs: Sequence[dict[str, Any]], *, workers: int, desc: str = "Planning"
) -> list[tuple[Any, str | None, float]]:
    """``plan_protection`` for every keyword set in ``jobs``, in ``workers`` processes, in order.

    Planning is single-threaded NumPy/HiGHS work, so separate processes use separate cores (the tight
    calibration of one plan takes 1-15 s on the demo). A ``ValueError`` (an infeasible plan) becomes the
    job's error message; anything else is raised.
    """
    from tqdm.auto import tqdm

    check_int("planning_workers", workers, minimum=1)
    if workers == 1 or len(jobs) < 2:
        return [_timed_plan(dict(job)) for job in tqdm(jobs, desc=desc)]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        return list(tqdm(pool.map(_timed_plan, [dict(job) for job in jobs]), total=len(jobs), desc=desc))


def plan_for_config(
    secret_ids: Any, secrets: Any, config: Any, *, lp_c: float, noise_multiplier: float | None = None,
    **kwargs: Any,
) -> Any:
    """``plan_protection`` of ``secret_ids`` (a column, or a tagged dataset) for ``secrets`` (a
    ``SecretSet``: priors and targets) at the run's B, T and accountant (``config``, a
    ``SecretProtectionConfig``); ``noise_multiplier=None`` calibrates sigma, a number fixes it."""
    from hush_hf.planning import plan_protection

    return plan_protection(secret_ids, secrets.priors, secrets.targets, lp_c=lp_c,
                           expected_batch_size=config.expected_batch_size, steps=config.max_steps,
                           accountant=config.accountant, noise_multiplier=noise_multiplier, **kwargs)
