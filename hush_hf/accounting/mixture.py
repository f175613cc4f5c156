"""The one-step pair P = sum_s pi_s N(s, sigma^2) vs Q = N(0, sigma^2) on a quadrature grid.

In standard units z = x / sigma, with c_s = s / sigma, the likelihood ratio is
L(z) = dP/dQ(z) = sum_s pi_s exp(c_s z - c_s^2 / 2). Integrals E_Q[f(L)] are computed with the
trapezoidal rule on a uniform grid, which converges geometrically for integrands analytic in a
strip (Trefethen & Weideman 2014, Thm 5.1): Re L(z + iy) > 0 for |y| < pi / (2 c_max), so
f(L) is analytic there for f = log, x^alpha; a spacing h <= GRID_STEP_SCALE / c_max (and <= 0.5
for the Gaussian factor) makes the discretisation error ~exp(-2 pi d / h) < 1e-15. The grid spans
[-12.5, alpha c_max + 12.5], which holds all but ~1e-34 of the mass of phi(z) L(z)^alpha.
Tested against mpmath (tests/test_accounting_divergences.py).

Here pi is the conditional pmf of S given S <= K; callers add the tail above K separately.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID_STEP_SCALE = 0.25
MAX_GRID_STEP = 0.5
GRID_MARGIN = 12.5
_MAX_CELLS = 4_000_000  # rows x points x components per block


@dataclass(frozen=True)
class MixtureGrid:
    """z grid (rows x points), its spacing per row, log phi(z), log L(z) and u = L - 1."""

    z: np.ndarray
    step: np.ndarray
    log_phi: np.ndarray
    log_ratio: np.ndarray
    ratio_minus_one: np.ndarray


def conditional_pmf(pmf: np.ndarray, tail_mass: np.ndarray) -> np.ndarray:
    """pi_s / P(S <= K): the pmf of S given S <= K (rows)."""
    total = pmf.sum(axis=1, keepdims=True)
    return pmf / np.where(total > 0, total, 1.0)


def largest_count(pi: np.ndarray) -> np.ndarray:
    """Per row, the largest s with pi_s > 0."""
    counts = np.arange(pi.shape[1], dtype=np.float64)
    return np.where(pi > 0, counts[None, :], 0.0).max(axis=1)


#: ``grid_size`` saturates here: callers fall back to a closed-form bound far below it, and the
#: count stays a valid int64 for any sigma > 0 (at sigma ~1e-10 the exact count overflows int64).
POINTS_CAP = 1 << 40


def grid_size(pi: np.ndarray, sigma: np.ndarray, alpha_max: np.ndarray | float) -> np.ndarray:
    """Number of grid points per row for orders up to alpha_max (alpha = 1 for KL), at most POINTS_CAP.

    Counted in floating point (width / step ~ alpha c_max^2 / GRID_STEP_SCALE grows like sigma^-2)
    and capped before the cast: an overflowing cast wrapped to a negative count, which once sent
    sigma = 1e-10 to the fine-grid route with a grid of nothing (KL = 0, the bound = the prior).
    """
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        c_max = largest_count(pi) / sigma
        step = np.minimum(MAX_GRID_STEP, GRID_STEP_SCALE / np.maximum(c_max, 1e-300))
        points = np.ceil((alpha_max * c_max + 2 * GRID_MARGIN) / step)
    points = np.where(np.isnan(points), POINTS_CAP, np.minimum(points, POINTS_CAP))
    return points.astype(np.int64) + 1


def evaluate_grid(pi: np.ndarray, sigma: np.ndarray, alpha_max: float, points: int) -> MixtureGrid:
    """log L and L - 1 on a uniform grid of ``points`` points per row covering orders <= alpha_max.

    ``pi`` (rows x K+1) is normalised; ``sigma`` (rows,) > 0.
    """
    return evaluate_grid_rows(pi, sigma, np.full(pi.shape[0], float(alpha_max)), points)


def evaluate_grid_rows(pi: np.ndarray, sigma: np.ndarray, alpha_max: np.ndarray, points: int) -> MixtureGrid:
    """As ``evaluate_grid`` with one largest order per row."""
    rows, width = pi.shape
    counts = np.arange(width, dtype=np.float64)
    present = pi > 0
    c = counts[None, :] / sigma[:, None]
    c_max = largest_count(pi) / sigma
    z_lo = -GRID_MARGIN
    z_hi = alpha_max * c_max + GRID_MARGIN
    step = (z_hi - z_lo) / (points - 1)
    z = z_lo + step[:, None] * np.arange(points)[None, :]
    with np.errstate(divide="ignore"):
        log_pi = np.log(pi)
    exponent = c[:, None, :] * z[:, :, None] - 0.5 * c[:, None, :] ** 2  # rows x points x K+1
    log_terms = np.where(present[:, None, :], log_pi[:, None, :] + exponent, -np.inf)
    peak = log_terms.max(axis=2)
    log_ratio = peak + np.log(np.exp(log_terms - peak[:, :, None]).sum(axis=2))
    # u = sum pi_s expm1(a_s), free of cancellation near L = 1 (exp(log pi + a) - pi for large a);
    # only used where log L < 1, where every log(pi_s) + a_s < 1 too.
    with np.errstate(invalid="ignore"):
        capped = np.minimum(log_terms, 1.0)
        near = pi[:, None, :] * np.expm1(np.minimum(exponent, 1.0))
        terms = np.where(exponent < 1.0, near, np.exp(capped) - pi[:, None, :])
    terms = np.where(present[:, None, :], terms, 0.0)
    ratio_minus_one = np.where(log_ratio < 1.0, terms.sum(axis=2), np.expm1(np.minimum(log_ratio, 700.0)))
    log_phi = -0.5 * z**2 - 0.5 * np.log(2 * np.pi)
    return MixtureGrid(z, step, log_phi, log_ratio, ratio_minus_one)


def row_blocks(num_rows: int, points: int, width: int) -> list[slice]:
    """Row slices so that each block's rows x points x width stays under a memory cap."""
    per_block = max(1, _MAX_CELLS // max(1, points * width))
    return [slice(a, min(num_rows, a + per_block)) for a in range(0, num_rows, per_block)]
