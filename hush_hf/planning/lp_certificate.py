"""Independent checks of any LP answer: exact primal feasibility (with repair) and a dual upper bound.

The LP (Hush eq. (1)) with implied bounds u_i <= 1:  max 1^T w  s.t.  A w <= cap,  0 <= w <= u.
No solver's word is taken here: weights are verified against every constraint, and the optimum is
bounded from above by weak duality from whatever dual vector the solver returned.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from hush_hf.planning.lp_types import LPSolverError

EPS = np.finfo(np.float64).eps / 2  # unit roundoff u = 2^-53
_MAX_REPAIR_ROUNDS = 4


def clip_to_bounds(weights: np.ndarray, upper: np.ndarray, solver: str) -> np.ndarray:
    """Project a solver's weights onto 0 <= w <= u (solvers return values a tolerance outside)."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != upper.shape:
        raise LPSolverError(f"{solver} returned {weights.size} weights for {upper.size} variables")
    if not np.all(np.isfinite(weights)):
        raise LPSolverError(f"{solver} returned non-finite weights")
    return np.clip(weights, 0.0, upper)


def infeasible_rows(csr: sp.csr_matrix, capacity: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Indices j with sum_{i in D_j} w_i > cap_j, decided exactly (no rounding error can hide one).

    A row passes at once when fl(A w)_j * (1 + 2 gamma_k) <= cap_j, where gamma_k = k u / (1 - k u)
    bounds the relative error of any float64 summation order of k non-negative terms (Higham, Accuracy
    and Stability, Thm. 4.4). The rest are decided by ``math.fsum`` of (w_i ..., -cap_j): it is correctly
    rounded, so its sign is the exact sign of sum_i w_i - cap_j.
    """
    sums = csr @ weights
    sizes = np.diff(csr.indptr).astype(np.float64)
    gamma = sizes * EPS / (1.0 - sizes * EPS)
    surely_bad = sums * (1.0 - 2.0 * gamma) > capacity
    unsure = np.flatnonzero(~surely_bad & (sums * (1.0 + 2.0 * gamma) > capacity))
    exact_bad = [
        j for j in unsure
        if math.fsum([*weights[csr.indices[csr.indptr[j] : csr.indptr[j + 1]]].tolist(), -capacity[j]]) > 0.0
    ]
    return np.union1d(np.flatnonzero(surely_bad), np.asarray(exact_bad, dtype=np.int64))


def repair_feasible(csr: sp.csr_matrix, capacity: np.ndarray, weights: np.ndarray, solver: str) -> np.ndarray:
    """Scale weights down until A w <= cap holds exactly; never scale anything up.

    Each example i of an over-full row j is multiplied by min over its over-full rows of
    cap_j (1 - m_j) / (A w)_j, a factor < 1, with the margin m_j = 8 (|D_j| + 2) u covering the
    rounding of the sum and of the products, so that a repaired row passes ``infeasible_rows``.
    Rows that were feasible lose nothing except where they share examples with over-full rows.
    """
    weights = weights.copy()
    row_of_entry = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
    for _ in range(_MAX_REPAIR_ROUNDS):
        bad = infeasible_rows(csr, capacity, weights)
        if bad.size == 0:
            return weights
        sums = csr[bad] @ weights
        margin = 8.0 * (np.diff(csr.indptr)[bad] + 2.0) * EPS
        row_factor = np.ones(csr.shape[0])
        row_factor[bad] = capacity[bad] * (1.0 - margin) / sums
        in_bad = row_factor[row_of_entry] < 1.0
        example_factor = np.ones_like(weights)
        np.minimum.at(example_factor, csr.indices[in_bad], row_factor[row_of_entry[in_bad]])
        weights *= example_factor
    raise LPSolverError(f"{solver}: weights could not be repaired to feasibility in {_MAX_REPAIR_ROUNDS} "
                        "rounds")


def dual_upper_bound(csr: sp.csr_matrix, capacity: np.ndarray, upper: np.ndarray, duals: np.ndarray) -> float:
    """Certified upper bound on the LP optimum from any y >= 0 (weak duality; the solver's y, clipped at 0).

    For feasible w:  1^T w = y^T A w + sum_i w_i (1 - (A^T y)_i)
                          <= cap^T y + sum_i u_i max(0, 1 - (A^T y)_i).
    Rounding is taken against us: (A^T y)_i is shrunk by its summation error bound before use, the sums
    are correctly rounded (``math.fsum``), and the result is inflated by 8 u for the products.
    """
    y = np.asarray(duals, dtype=np.float64)
    if y.shape != capacity.shape or not np.all(np.isfinite(y)):
        raise LPSolverError("dual vector has the wrong shape or non-finite entries; cannot certify the "
                            "optimum")
    y = np.maximum(y, 0.0)
    col_sums = csr.T @ y
    degree = np.bincount(csr.indices, minlength=csr.shape[1]).astype(np.float64)
    gamma = degree * EPS / (1.0 - degree * EPS)
    slack = np.maximum(0.0, 1.0 - col_sums * (1.0 - 2.0 * gamma))
    total = math.fsum((capacity * y).tolist()) + math.fsum((upper * slack).tolist())
    return total * (1.0 + 8.0 * EPS)


def relative_gap(objective: float, upper_bound: float, solver: str) -> float:
    """(UB - obj) / UB, and 0 for the empty problem (UB = 0).

    obj <= OPT <= UB holds for feasible weights and y >= 0, so obj > UB means a broken invariant: raise.
    """
    if objective > upper_bound:
        raise LPSolverError(f"{solver}: objective {objective!r} exceeds its certified bound {upper_bound!r}")
    if upper_bound == 0.0:
        return 0.0
    return (upper_bound - objective) / upper_bound
