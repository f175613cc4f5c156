"""Each secret's training mechanism as a dp_accounting event, so a bound can be rechecked with
dp_accounting alone (no hush_hf accountant involved).

One step of secret j releases N(S_j, sigma^2) against N(0, sigma^2), S_j the number of its examples
in the batch (Poisson-binomial over their rho_i): dp_accounting's ``MixtureOfGaussiansDpEvent`` with
sensitivities 0..n_j and sampling probabilities Pr[S_j = s]; T steps are its ``SelfComposedDpEvent``.
The posterior bound is the blow-up function's bound min_eps [e^eps p + delta_T(eps)]
(docs/design.md#per-secret-accounting), with delta_T read from dp_accounting's PLD accountant.

Not written into the plan file: the plan already holds what the events are made of (memberships,
sampling probabilities, sigma, T), and one pmf per secret would add a number per membership.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def count_pmf(rho: Sequence[float]) -> np.ndarray:
    """Pr[S = s], s = 0..n, for S a sum of independent Bernoulli(rho_i): the convolution of the
    Bernoulli pmfs (exact up to rounding, non-negative terms only)."""
    pmf = np.ones(1)
    for r in np.asarray(rho, dtype=np.float64):
        pmf = np.convolve(pmf, [1.0 - r, r])
    return pmf


def secret_dp_event(rho: Sequence[float], sigma: float, steps: int) -> Any:
    """T-fold composition of the mixture-of-Gaussians step of a secret whose examples have ``rho``."""
    from dp_accounting import dp_event

    pmf = count_pmf(rho)
    step = dp_event.MixtureOfGaussiansDpEvent(
        standard_deviation=float(sigma),
        sensitivities=[float(s) for s in range(pmf.size)],
        sampling_probs=(pmf / pmf.sum()).tolist(),
    )
    return dp_event.SelfComposedDpEvent(step, int(steps))


def plan_dp_events(plan: Any, sigma: float | None = None, steps: int | None = None) -> list[Any]:
    """One event per secret of a ``ProtectionPlan`` (from its memberships and sampling probabilities)
    at ``sigma`` and ``steps`` (default: what the plan's training record says was trained, else the
    plan's own)."""
    if plan.memberships is None:
        raise ValueError("the plan has no memberships: its secrets' mechanisms cannot be written")
    record = plan.training
    sigma = sigma if sigma is not None else (record.noise_multiplier if record else plan.noise_multiplier)
    steps = steps if steps is not None else (record.dp_steps if record else plan.steps)
    rows = plan.memberships.tocsr()
    rho = np.asarray(plan.sampling_probs, dtype=np.float64)
    return [
        secret_dp_event(rho[rows.indices[rows.indptr[j] : rows.indptr[j + 1]]], sigma, steps)
        for j in range(rows.shape[0])
    ]


def dp_accounting_bound(
    event: Any, prior: float, *, discretization: float = 1e-3, max_loss: float = 40.0
) -> float:
    """min_eps [e^eps p + delta(eps)] over eps in [0, max_loss], delta from dp_accounting's pessimistic
    PLD accountant (add-or-remove, at least the direction needed; its loss grid ``discretization``).
    Any eps gives a valid bound; grids of step 0.25, 5e-3 and 1e-4, each around the last one's best,
    find the minimum (f is unimodal in eps) with a few hundred reads of delta."""
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretization)
    accountant.compose(event)
    center, width, bound = max_loss / 2, max_loss / 2, 1.0
    for step in (0.25, 5e-3, 1e-4):
        losses = np.arange(max(0.0, center - width), center + width + step, step)
        values = [math.exp(eps) * prior + accountant.get_delta(float(eps)) for eps in losses]
        center, width, bound = float(losses[int(np.argmin(values))]), step, min(bound, min(values))
    return min(1.0, bound)
