"""Re-verifying a plan: every secret's posterior bound recomputed from rho, memberships, sigma and T.

What a model card certifies must not rest on numbers read from a file. This module recomputes each
secret's bound b_j with the plan's accountant (``hush_hf.accounting.posterior_bounds``: the same
evaluation the calibration uses for one secret at one sigma, never its search) from

- the sampling probabilities rho_i the sampler draws with (the plan's, which the trainer checks
  row by row against the dataset),
- which examples contain which secret: the dataset's ``secret_ids`` when given, else the memberships
  the plan recorded (``ProtectionPlan.memberships``),
- the noise multiplier and the number of DP steps: at train start the sigma training uses and the
  plan's T; for published weights the plan's training record (:func:`certified_bounds`), never the
  plan's intention,

and compares it with the target r_j (Hush Def. 3.1: posterior <= r_j for prior p_j). Beyond
``EXACT_UP_TO`` secrets, laws that agree to ``ENVELOPE_RESOLUTION`` share the law of their envelope
(a valid, marginally larger bound); secrets that then exceed their target are evaluated again with
their own law and keep the smaller of the two valid bounds. ``workers``: threads the accountant may
evaluate laws on (``tight`` can; the bounds are the same, bitwise, with any number).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hush_hf.accounting import SecretGroups, posterior_bounds, validate_targets
from hush_hf.accounting.threads import validate_workers
from hush_hf.planning.memberships import membership_matrix

EXACT_UP_TO = 500
ENVELOPE_RESOLUTION = 1e-3


@dataclass(frozen=True)
class Verification:
    """Recomputed per-secret bounds at one (sigma, T) with one accountant."""

    noise_multiplier: float
    steps: int
    accountant: str
    prior: np.ndarray
    target: np.ndarray
    bound: np.ndarray
    memberships_from: str

    @property
    def over_target(self) -> np.ndarray:
        """Indices of the secrets whose recomputed bound exceeds their target."""
        return np.flatnonzero(~(self.bound <= self.target))

    @property
    def meets_targets(self) -> bool:
        return self.over_target.size == 0

    def worst(self) -> str:
        """The secret with the largest bound / target, in words (index only)."""
        ratio = self.bound / self.target
        j = int(np.argmax(ratio))
        return (
            f"secret #{j}: bound {self.bound[j]:.4g} against a target of {self.target[j]:.4g} "
            f"(bound/target {ratio[j]:.4g})"
        )

    def describe(self) -> str:
        """One sentence: how many targets hold at this sigma, and the worst secret."""
        n = self.target.size
        over = self.over_target.size
        head = (
            f"recomputed with the {self.accountant} accountant at noise multiplier "
            f"{self.noise_multiplier:.6g} and T={self.steps} (memberships from {self.memberships_from}), "
        )
        if over == 0:
            return head + f"all {n} secrets meet their targets; closest: {self.worst()}"
        return head + f"{over} of {n} secrets exceed their targets; worst: {self.worst()}"

    def table(self, limit: int = 20) -> str:
        """Targets against bounds, the ``limit`` secrets closest to (or over) their target first."""
        ratio = self.bound / self.target
        order = np.argsort(-ratio, kind="stable")[:limit]
        lines = [f"{'secret':>8} {'prior':>11} {'target':>11} {'bound':>11} {'bound/target':>13}  holds"]
        for j in order:
            lines.append(
                f"{int(j):>8} {self.prior[j]:>11.4g} {self.target[j]:>11.4g} {self.bound[j]:>11.4g} "
                f"{ratio[j]:>13.4g}  {'yes' if self.bound[j] <= self.target[j] else 'NO'}"
            )
        if self.target.size > limit:
            lines.append(f"... {self.target.size - limit} more secrets, all with a smaller bound/target")
        return "\n".join(lines)


def certified_bounds(
    plan: Any, *, secret_ids: Any = None, membership: Any = None, workers: int = 1
) -> Verification:
    """Every secret's bound for the weights the plan was published with: at the sigma and the DP steps
    of its training record (``plan.training``); a plan without a record (no run published it), at its
    own sigma and T."""
    record = plan.training
    if record is None:
        return recompute_bounds(plan, secret_ids=secret_ids, membership=membership, workers=workers)
    return recompute_bounds(plan, record.noise_multiplier, steps=record.dp_steps, secret_ids=secret_ids,
                            membership=membership, workers=workers)


def recompute_bounds(
    plan: Any,
    noise_multiplier: float | None = None,
    *,
    steps: int | None = None,
    secret_ids: Any = None,
    membership: Any = None,
    workers: int = 1,
) -> Verification:
    """Every secret's bound at ``noise_multiplier`` and ``steps`` (defaults: the plan's sigma and T) with
    the plan's accountant. After 0 steps nothing released depends on the data: each bound is its prior.

    ``secret_ids``: one list of secret indices per example in plan order (e.g. the dataset's
    column), or ``membership``, the (secrets x examples) matrix made from them; without either the
    plan's recorded memberships are used, and a plan without them is refused. ``workers``: threads the
    accountant may evaluate laws on (the bounds do not depend on it).
    """
    validate_workers(workers)
    sigma = float(plan.noise_multiplier if noise_multiplier is None else noise_multiplier)
    steps = int(plan.steps if steps is None else steps)
    prior = np.asarray(plan.secrets.prior, dtype=np.float64)
    target = np.asarray(plan.secrets.target, dtype=np.float64)
    validate_targets(prior, target)
    if membership is not None:
        source = "the dataset's secret_ids"
    elif secret_ids is not None:
        membership, source = membership_matrix(secret_ids, plan.num_secrets), "the dataset's secret_ids"
    elif plan.memberships is not None:
        membership, source = plan.memberships, "the plan"
    else:
        raise ValueError(
            "the plan records no memberships (which examples contain which secret) and no secret_ids were "
            "given, so its bounds cannot be recomputed; re-create the plan with plan_protection / `hush "
            "plan`, or give the tagged dataset"
        )
    if membership.shape != (plan.num_secrets, plan.num_examples):
        raise ValueError(
            f"memberships cover {membership.shape[1]} examples and {membership.shape[0]} secrets but "
            f"the plan has {plan.num_examples} examples and {plan.num_secrets} secrets"
        )
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if steps == 0:
        return Verification(sigma, 0, plan.accountant, prior, target, prior.copy(), source)
    groups = SecretGroups.from_membership(membership, plan.sampling_probs)
    bound = _bounds(groups, prior, target, sigma, steps, plan.accountant, workers)
    return Verification(sigma, steps, plan.accountant, prior, target, bound, source)


def _bounds(
    groups: SecretGroups,
    prior: np.ndarray,
    target: np.ndarray,
    sigma: float,
    steps: int,
    accountant: str,
    workers: int = 1,
) -> np.ndarray:
    if prior.size <= EXACT_UP_TO:
        return np.asarray(
            posterior_bounds(groups, prior, sigma, steps, accountant=accountant, workers=workers)
        )
    bound = np.asarray(posterior_bounds(
        groups, prior, sigma, steps, accountant=accountant, resolution=ENVELOPE_RESOLUTION, workers=workers
    )).copy()
    over = np.flatnonzero(bound > target)
    if over.size:
        own = posterior_bounds(groups.subset(over), prior[over], sigma, steps, accountant=accountant,
                               workers=workers)
        bound[over] = np.minimum(bound[over], own)
    return bound
