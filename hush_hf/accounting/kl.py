"""The ``kl`` accountant (Hush, Lemma 3.2): T * KL(P || Q) <= KL(Bern(r) || Bern(p)).

KL of the one-step pair P = sum_s pi_s N(s, sigma^2), Q = N(0, sigma^2) is the 1-D integral
KL(P||Q) = E_Q[h(L - 1)] with h(u) = (1 + u) log1p(u) - u >= 0 (no cancellation, see
``special.kl_kernel``), computed on the trapezoidal grid of ``mixture``. The pmf is exact up to
K; by joint convexity of KL the counts above K add at most sum_{s>K} pi_s s^2 / (2 sigma^2),
bounded with the Chernoff tail (``counts.tail_moment_bound``). KL composes additively over the
T steps, and Lemma 3.2 turns T * KL into the posterior bound q >= p with KL(q||p) = T * KL.

Cheap bounds used for ranking and checks: (E S)^2 / (2 sigma^2) <= KL <= E[S^2] / (2 sigma^2)
(the upper one is joint convexity over the mixture components).
"""

from __future__ import annotations

import numpy as np

from hush_hf.accounting.budgets import kl_posterior
from hush_hf.accounting.counts import CountDistributions, tail_moment_bound
from hush_hf.accounting.mixture import MixtureGrid, conditional_pmf, evaluate_grid, grid_size, row_blocks
from hush_hf.accounting.special import kl_kernel

#: Relative allowance added to every computed KL: covers quadrature and rounding error, which
#: the mpmath comparison in the tests puts below 1e-11 across sigma in [0.3, 1e4].
QUADRATURE_ALLOWANCE = 1e-9
MAX_GRID_POINTS = 20_000


def mixture_kl(dists: CountDistributions, sigma: np.ndarray) -> np.ndarray:
    """Upper bound on KL(P || Q) for each row at its noise multiplier (one step)."""
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (dists.num_rows,)).copy()
    out = np.zeros(dists.num_rows)
    has_signal = dists.pmf[:, 1:].sum(axis=1) + dists.tail_mass > 0
    pi = conditional_pmf(dists.pmf, dists.tail_mass)
    body = np.zeros(dists.num_rows)
    rows = np.flatnonzero(has_signal & (pi[:, 1:].sum(axis=1) > 0))
    points = grid_size(pi[rows], sigma[rows], 1.0)
    # Very small sigma needs very fine grids; the joint-convexity bound E[S^2]/(2 sigma^2) is
    # valid there (and far from any calibrated sigma), so it is used instead.
    coarse = points > MAX_GRID_POINTS
    tail_second = tail_moment_bound(dists, lambda s: s**2)  # E[S^2 1{S > K}]
    second = dists.pmf @ np.arange(dists.pmf.shape[1]) ** 2 + tail_second
    body_is_bound = np.zeros(dists.num_rows, dtype=bool)
    body_is_bound[rows[coarse]] = True
    rows, points = rows[~coarse], points[~coarse]
    if rows.size:
        order = rows[np.argsort(points)]
        sorted_points = np.sort(points)
        for block in row_blocks(order.size, int(sorted_points.max()), pi.shape[1]):
            idx = order[block]
            grid = evaluate_grid(pi[idx], sigma[idx], 1.0, int(sorted_points[block].max()))
            body[idx] = grid.step * _weighted_kernel(grid).sum(axis=1)
    tail = _over_two_sigma_squared(tail_second, sigma)
    out = (1.0 - dists.tail_mass) * body * (1.0 + QUADRATURE_ALLOWANCE) + tail
    out = np.where(body_is_bound, _over_two_sigma_squared(second, sigma), out)
    return np.where(has_signal, out, 0.0)


def _over_two_sigma_squared(moment: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """moment / (2 sigma^2), divided twice by sigma: sigma^2 underflows to 0 below ~1e-162, and
    moment / 0 would be NaN for a zero moment; here it is 0 for a zero moment and +inf (KL infinite,
    the bound 1) for a positive one."""
    with np.errstate(over="ignore"):
        return 0.5 * (moment / sigma / sigma)


def _weighted_kernel(grid: MixtureGrid) -> np.ndarray:
    """phi(z) h(L(z) - 1); in log space where L is huge (h = L (log L - 1) + 1)."""
    log_ratio = grid.log_ratio
    big = log_ratio > 30.0
    phi = np.exp(grid.log_phi)
    small_value = phi * kl_kernel(np.where(big, 0.0, grid.ratio_minus_one))
    safe = np.where(big, log_ratio, 31.0)
    big_value = np.exp(grid.log_phi + safe + np.log(safe - 1.0)) + phi
    return np.where(big, big_value, small_value)


def kl_bounds(
    dists: CountDistributions,
    sigma: np.ndarray,
    steps: int,
    priors: np.ndarray,
    rows: np.ndarray,
    targets: np.ndarray | None = None,
) -> np.ndarray:
    """Posterior bounds for queries (row, prior): q >= p with KL(Bern(q)||Bern(p)) = T KL_row."""
    kl = mixture_kl(dists, sigma)
    return kl_posterior(steps * kl[rows], priors)

