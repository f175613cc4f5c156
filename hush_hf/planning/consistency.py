"""What a plan's numbers must satisfy among themselves, and against the secrets file and the data.

The bounds (``hush_hf.planning.verification``) are recomputed from the plan's rho, memberships, the
record's sigma and DP steps, and priors/targets. These checks bind those inputs to what else is
known:

- among themselves: rho_i = B w_i / sum(w) exactly as hush_hf computes it (Hush Alg. 2 line 3),
  0 <= rho_i <= 1 and sum(rho) = B; the per-secret columns and bounds the plan states equal the
  recomputed ones; the record took no more DP steps than the plan's T; a plan that says its sigma
  was calibrated meets every target at that sigma and its T, and has the smallest such sigma (to
  ``CALIBRATION_SLACK``);
- against the secrets file: the number of secrets and every secret's prior and target, by index
  (and the secret-set fingerprint, which only a local plan holds);
- against the data: the exact (secret, example) memberships, and the LP constraints of Hush eq. (1)
  (0 <= w_i <= 1, sum_{i in D_j} w_i <= c * budget_j) at the secrets file's priors and targets.

Each check returns a :class:`Check`; none raises on a mismatch (bad input still raises ValueError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from hush_hf.accounting import lp_budget
from hush_hf.planning.lp_certificate import infeasible_rows
from hush_hf.planning.probabilities import sampling_probabilities
from hush_hf.planning.verification import Verification, recompute_bounds

#: Recomputed floats (rho, sum(rho), per-secret sums and bounds) may differ from the file's in the
#: last bits between machines and library versions; differences below this are not findings.
RTOL = 1e-9
#: calibrate_noise returns sigma within (1 + rtol) of the smallest sigma meeting every target, rtol
#: <= 1e-3 (``validate_rtol``): at sigma / (1 + 1e-2) a calibrated plan must miss a target.
CALIBRATION_SLACK = 1e-2


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``passed`` is True, False, or None when it could not be made."""

    name: str
    passed: bool | None
    detail: str

    @property
    def status(self) -> str:
        return {True: "ok", False: "FAILED", None: "not checked"}[self.passed]


def check_sampling(plan: Any) -> Check:
    """rho_i = B w_i / sum(w) (as :func:`sampling_probabilities` computes it), 0 <= rho_i <= 1, sum = B."""
    name = "sampling probabilities"
    weights, rho, batch = plan.weights, plan.sampling_probs, float(plan.expected_batch_size)
    if weights.shape != rho.shape:
        return Check(name, False, f"{rho.size} sampling probabilities for {weights.size} weights")
    outside = np.flatnonzero(~np.isfinite(rho) | (rho < 0) | (rho > 1))
    if outside.size:
        k = int(outside[0])
        return Check(name, False, f"{outside.size} outside [0, 1] (first: example {k}: {float(rho[k])!r})")
    try:
        expected = sampling_probabilities(weights, batch)
    except ValueError as err:
        return Check(name, False, f"the plan's weights give none: {err}")
    differs = np.flatnonzero(~np.isclose(rho, expected, rtol=RTOL, atol=0.0))
    if differs.size:
        k = int(differs[0])
        return Check(name, False, f"rho_i != B w_i / sum(w) at {differs.size} examples (first: example {k}: "
                                  f"{rho[k]:.6g} in the plan, {expected[k]:.6g} from its weight)")
    total = math.fsum(rho.tolist())
    if abs(total - batch) > RTOL * batch:
        return Check(name, False, f"sum(rho) = {total!r}, not B = {batch!r}")
    return Check(name, True, f"rho_i = B w_i / sum(w) for all {rho.size} examples, in [0, 1], "
                             f"sum(rho) = B = {batch:g}")


def check_stated_numbers(plan: Any, verification: Verification, membership: Any, summary: Any) -> Check:
    """The per-secret columns (examples, sum of rho, bound) and the summary the plan states equal the
    ones recomputed from its memberships, rho and record (a stated bound may be larger than the
    recomputed one, never smaller); its record took at most T DP steps."""
    from hush_hf.accounting import SecretGroups
    from hush_hf.jsonfile import first_difference

    name = "numbers the plan states"
    groups = SecretGroups.from_membership(membership, plan.sampling_probs)
    s = plan.secrets
    for column, stated, recomputed in (("examples per secret", s.num_examples, groups.sizes),
                                       ("sum of rho per secret", s.sum_rho, groups.sum_rho()),
                                       ("bound per secret", s.bound, verification.bound)):
        if column.startswith("bound"):  # a larger stated bound is still true (calibration's may be)
            differs = np.flatnonzero(~(stated >= recomputed * (1 - RTOL)))
        else:
            differs = np.flatnonzero(~np.isclose(stated, recomputed, rtol=RTOL, atol=0.0))
        if differs.size:
            j = int(differs[0])
            return Check(name, False, f"{column}: secret #{j} has {stated[j]:.6g} in the plan, "
                                      f"{recomputed[j]:.6g} recomputed ({differs.size} secrets differ)")
    if summary is not None:
        difference = first_difference(summary, plan.summary(), rtol=RTOL, path="summary")
        if difference is not None:
            return Check(name, False, difference)
    if plan.training is not None and plan.training.dp_steps > plan.steps:
        return Check(name, False, f"the training record has {plan.training.dp_steps} DP steps, more than the "
                                  f"plan's T = {plan.steps} (a hush_hf run never takes more)")
    return Check(name, True, "per-secret examples and sums of rho equal the recomputed ones, no stated "
                             "bound is below its recomputed one, and the summary agrees")


def check_calibration(plan: Any, membership: Any) -> Check:
    """A plan that says its sigma was calibrated must meet every target at sigma and its own T, and
    miss one at sigma / (1 + CALIBRATION_SLACK) and T: otherwise its priors, targets, rho, memberships
    or T are not the ones it was calibrated with (e.g. T raised or lowered, or a binding secret's target
    raised, after planning)."""
    name = "calibration"
    sigma = float(plan.noise_multiplier)
    if not plan.calibrated:
        return Check(name, None, "the plan's sigma was given, not calibrated: nothing to re-check")
    if sigma == 0:
        return Check(name, None, "the plan needs no noise (no secret is ever sampled)")
    at_sigma = recompute_bounds(plan, sigma, steps=plan.steps, membership=membership)
    if not at_sigma.meets_targets:
        over = f"{at_sigma.over_target.size} of {plan.num_secrets}"
        return Check(name, False, f"the plan says sigma = {sigma:.6g} was calibrated for T = {plan.steps}, "
                                  f"but at T = {plan.steps} {over} secrets exceed their targets "
                                  f"({at_sigma.worst()}): its T, targets, priors, rho or memberships are not "
                                  "those it was calibrated with")
    lower = sigma / (1 + CALIBRATION_SLACK)
    weaker = recompute_bounds(plan, lower, steps=plan.steps, membership=membership)
    if weaker.meets_targets:
        return Check(name, False, f"the plan says sigma = {sigma:.6g} is the smallest meeting every target "
                                  f"at T = {plan.steps}, but every target also holds at {lower:.6g}: its T, "
                                  "targets, priors, rho or memberships are not those it was calibrated with")
    return Check(name, True, f"sigma = {sigma:.6g} meets every target at T = {plan.steps} and is the "
                             f"smallest that does (to {CALIBRATION_SLACK:.0%}; {weaker.worst()} at sigma "
                             f"{lower:.6g})")


def check_secret_set(plan: Any, priors: Any, targets: Any, fingerprint: str | None) -> list[Check]:
    """The secrets file against the plan: count, each prior and target by index, and the fingerprint
    (ids, terms, priors, targets, in order) when the plan holds one (a local plan)."""
    priors, targets = np.asarray(priors, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    if priors.size != plan.num_secrets:
        return [Check("secrets file", False, f"{priors.size} secrets, the plan covers {plan.num_secrets}")]
    checks = []
    pairs = (("prior", priors, plan.secrets.prior), ("target", targets, plan.secrets.target))
    for what, filed, planned in pairs:
        differs = np.flatnonzero(filed != planned)
        if differs.size:
            j = int(differs[0])
            detail = (f"{differs.size} secrets have another {what} in the plan (first: secret #{j}: "
                      f"{float(planned[j])!r} in the plan, {float(filed[j])!r} in the file)")
            checks.append(Check("secrets file", False, detail))
    if not checks:
        checks.append(Check("secrets file", True, f"{priors.size} secrets; every prior and target equals the "
                                                  "plan's, by index"))
    if plan.secret_set_fingerprint is None:
        checks.append(Check("secret ids", None, "a published plan holds no secret ids (nor hashes of them); "
                                                "their order is checked through the memberships the data "
                                                "gives (--dataset)"))
    elif plan.secret_set_fingerprint == fingerprint:
        checks.append(Check("secret ids", True, "the plan's secret-set fingerprint matches the file (ids, "
                                                "terms, priors, targets, in order)"))
    else:
        checks.append(Check("secret ids", False, "the plan was made with another secret set (fingerprints "
                                                 "differ: ids, terms, priors or targets, or their order)"))
    return checks


def check_memberships(plan: Any, membership: Any) -> Check:
    """The plan's recorded (secret, example) pairs are exactly the ones recomputed from the data."""
    name = "memberships"
    if plan.memberships is None:
        return Check(name, False, "the plan records no memberships to compare with the data")
    ours, theirs = _binary(membership), _binary(plan.memberships)
    if ours.shape != theirs.shape:
        return Check(name, False, f"the data gives {ours.shape[0]} secrets x {ours.shape[1]} examples, the "
                                  f"plan {theirs.shape[0]} x {theirs.shape[1]}")
    missing, extra = _pairs(ours - ours.multiply(theirs)), _pairs(theirs - theirs.multiply(ours))
    if missing or extra:
        parts = []
        if missing:
            j, i = missing[1]
            parts.append(f"{missing[0]} (secret, example) pairs of the data are missing from the plan "
                         f"(first: secret #{j} in example {i})")
        if extra:
            j, i = extra[1]
            parts.append(f"{extra[0]} pairs of the plan are not in the data (first: secret #{j} in example "
                         f"{i})")
        return Check(name, False, "; ".join(parts))
    return Check(name, True, f"the plan's {ours.nnz} (secret, example) pairs are exactly the data's")


def check_lp_constraints(plan: Any, priors: Any, targets: Any, membership: Any) -> Check:
    """The weights satisfy Hush eq. (1) with the plan's c and budget kind at these priors and targets:
    0 <= w_i <= 1 and sum_{i in D_j} w_i <= c * budget_j, decided exactly (``infeasible_rows``) against
    capacities widened by ``RTOL`` for the rounding of a recomputed budget."""
    name = "LP constraints"
    weights = plan.weights
    outside = np.flatnonzero(~np.isfinite(weights) | (weights < 0) | (weights > 1))
    if outside.size:
        k = int(outside[0])
        return Check(name, False, f"{outside.size} weights outside [0, 1] (first: example {k}: "
                                  f"{float(weights[k])!r})")
    capacity = plan.lp_c * lp_budget(np.asarray(priors, dtype=np.float64),
                                     np.asarray(targets, dtype=np.float64), plan.budget)
    bad = infeasible_rows(sp.csr_matrix(_binary(membership)), capacity * (1 + RTOL), weights)
    if bad.size:
        j = int(bad[0])
        return Check(name, False, f"{bad.size} secret(s) whose examples weigh more than c * budget_j (first: "
                                  f"secret #{j}, capacity {capacity[j]:.6g} with c = {plan.lp_c:g}, "
                                  f"budget '{plan.budget}')")
    return Check(name, True, f"0 <= w_i <= 1 and every secret's sum of weights is within c * budget_j "
                             f"(c = {plan.lp_c:g}, budget '{plan.budget}')")


def check_plan_columns(plan: Any, columns: dict[str, Any]) -> list[Check]:
    """A dataset's ``hush_weight`` / ``hush_sampling_prob`` columns (``plan.attach``) equal the plan's,
    row by row."""
    checks = []
    for column, values in columns.items():
        found = np.asarray(values, dtype=np.float64)
        planned = plan.weights if column == "hush_weight" else plan.sampling_probs
        if found.shape != planned.shape:
            checks.append(Check(f"column {column}", False, f"{found.size} rows, the plan has {planned.size}"))
            continue
        differs = np.flatnonzero(found != planned)
        checks.append(Check(f"column {column}", not differs.size,
                            f"differs from the plan at {differs.size} rows (first: row {int(differs[0])})"
                            if differs.size else "equals the plan's, row by row"))
    return checks


def _binary(matrix: Any) -> sp.csr_matrix:
    csr = sp.csr_matrix(matrix, dtype=np.float64, copy=True)
    csr.sum_duplicates()
    csr.eliminate_zeros()
    csr.data[:] = 1.0
    return csr


def _pairs(difference: sp.csr_matrix) -> tuple[int, tuple[int, int]] | None:
    """(count, first (secret, example)) of the nonzero entries of a 0/1 difference, or None."""
    coo = sp.coo_matrix(difference)
    keep = coo.data > 0
    if not np.any(keep):
        return None
    rows, cols = coo.row[keep], coo.col[keep]
    first = int(np.lexsort((cols, rows))[0])
    return int(keep.sum()), (int(rows[first]), int(cols[first]))
