"""The ``rdp`` accountant (Stock et al. 2022, Eq. 2-3) with the exact Renyi divergence of the mixture.

For any order alpha > 1, log(r / p) <= D_alpha (alpha - 1) / alpha + log(1 / p) / alpha, where
D_alpha = T D_alpha(P || Q) = T log E_Q[L^alpha] / (alpha - 1) composes additively. So
log r <= min_alpha [T log M(alpha) + (alpha - 1) log p] / alpha with M(alpha) = E_Q[L^alpha].

M(alpha) is a 1-D integral on the trapezoidal grid of ``mixture`` (its mass sits near
z = alpha c_s, which the grid covers), in log space when large and as 1 + E_Q[g(L - 1)] with
g(u) = (1+u)^alpha - 1 - alpha u >= 0 when close to 1 (``special.power_kernel``).

Counts above K (probability tau <= 1e-20 per step) enter in one of two valid ways, whichever gives
the smaller bound:
- by total variation: the run with S conditioned on S <= K differs from the real one by at most
  1 - (1 - tau)^T <= T tau in total variation, so posterior <= bound(conditioned law) + T tau;
- by Minkowski's inequality inside the moment: ||L||_alpha <= (1 - tau) ||L'||_alpha +
  sum_{s>K} pi_s exp((alpha - 1) s^2 / (2 sigma^2)), the sum bounded in log space with the
  Hoeffding/Chernoff tail of ``counts``.
The exact Renyi divergence of the whole mixture is dominated at moderate orders by counts near the
support: 75 examples at rho = 0.004 reach S = 75 with probability 1e-180, yet that term alone makes
log E_Q[L^2] ~ 792 at sigma = 1.86. Minkowski reproduces that (it is exact); the total-variation
route drops it at a cost of T tau ~ 1e-22, which is why it usually wins.

alpha is optimised per (distribution, prior): the best of a log-spaced grid of orders, refined by
golden-section search on log(alpha - 1) (the objective is unimodal: alpha * objective is convex);
a law shared by many priors gets a dense grid instead. Every alpha gives a valid bound, so a
coarse search only costs tightness. dp_accounting's
fractional-order RDP of this mechanism over-estimates by 3-80% here and is not used.
"""

from __future__ import annotations

import numpy as np

from hush_hf.accounting.counts import CountDistributions
from hush_hf.accounting.mixture import (
    MixtureGrid,
    conditional_pmf,
    evaluate_grid_rows,
    grid_size,
    largest_count,
)
from hush_hf.accounting.special import power_kernel

#: Relative allowance on log M: covers quadrature and rounding error (mpmath-tested below 1e-11).
QUADRATURE_ALLOWANCE = 1e-9
ALPHA_GRID_POINTS = 48
#: A law queried with more distinct priors than this gets DENSE_GRID_POINTS orders instead of
#: per-prior refinement.
DENSE_GRID_QUERIES = 16
DENSE_GRID_POINTS = 1024
MIN_ALPHA_MINUS_ONE = 1e-3
#: Orders go up to max(8, ALPHA_REACH / c_max) (c_max = K / sigma), capped at MAX_ALPHA.
ALPHA_REACH = 40.0
MAX_ALPHA = 1e6
GOLDEN_ITERATIONS = 40
MAX_GRID_POINTS = 60_000
_ULP = float(np.finfo(np.float64).eps)
_QUERY_BLOCK_CELLS = 4_000_000
_ROW_BLOCK_CELLS = 4_000_000


def alpha_ceiling(pi: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Largest order searched per row."""
    c_max = largest_count(pi) / sigma
    return np.clip(ALPHA_REACH / np.maximum(c_max, 1e-300), 8.0, MAX_ALPHA)


#: The total-variation route truncates S where T P(S > K) <= TV_SHARE * (smallest prior queried):
#: the added term is then at most 0.1% of any bound (a posterior bound is never below its prior).
TV_SHARE = 1e-3


def rdp_bounds(
    dists: CountDistributions,
    sigma: np.ndarray,
    steps: int,
    priors: np.ndarray,
    rows: np.ndarray,
    targets: np.ndarray | None = None,
) -> np.ndarray:
    """Posterior bounds for queries (row, prior) at each row's sigma (Stock et al. Eq. 3): the smaller
    of the Minkowski route on the law as given and the total-variation route on the law re-truncated
    where its tail costs at most TV_SHARE of the prior (module docstring)."""
    minkowski = _route_bounds(dists, sigma, steps, priors, rows, conditioned=False)
    truncated = retruncate(dists, steps, priors, rows)
    if truncated is None:
        return minkowski
    return np.minimum(minkowski, _route_bounds(truncated, sigma, steps, priors, rows, conditioned=True))


def retruncate(
    dists: CountDistributions, steps: int, priors: np.ndarray, rows: np.ndarray
) -> CountDistributions | None:
    """Per law, the pmf cut at the smallest K' >= 1 with T P(S > K') <= TV_SHARE * min prior (or kept
    at K), the mass above K' as ``tail_mass``; None when no law has any tail."""
    priors = np.asarray(priors, dtype=np.float64)
    smallest = np.full(dists.num_rows, np.inf)
    np.minimum.at(smallest, np.asarray(rows, dtype=np.int64), priors)
    survival = dists.survival()[:, 1:]  # column k: P(S > k), k = 0..K
    small = survival <= (TV_SHARE * smallest / steps)[:, None]
    cut = np.where(small.any(axis=1), small.argmax(axis=1), dists.max_count)
    cut = np.maximum(cut, 1) if dists.max_count >= 1 else cut
    tail = survival[np.arange(dists.num_rows), cut]
    if not (tail > 0).any():
        return None
    counts = np.arange(dists.max_count + 1)
    pmf = np.where(counts[None, :] <= cut[:, None], dists.pmf, 0.0)
    return CountDistributions(pmf, tail, dists.tail_rate, dists.support, dists.tail_trials)


def _route_bounds(
    dists: CountDistributions,
    sigma: np.ndarray,
    steps: int,
    priors: np.ndarray,
    rows: np.ndarray,
    conditioned: bool,
) -> np.ndarray:
    """Bounds by one route; ``conditioned``: the law given S <= K plus 1 - (1 - tau)^T, else Minkowski."""
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (dists.num_rows,)).copy()
    priors = np.asarray(priors, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.int64)
    out = np.ones(priors.size)
    pi = conditional_pmf(dists.pmf, dists.tail_mass)
    signal = (pi[:, 1:].sum(axis=1) > 0) | (dists.tail_mass > 0)
    quiet = ~signal[rows]
    out[quiet] = priors[quiet]
    live = np.flatnonzero(signal)
    if live.size == 0:
        return out
    top = alpha_ceiling(pi[live], sigma[live])
    points = grid_size(pi[live], sigma[live], top)
    fine = points <= MAX_GRID_POINTS
    order = np.argsort(points, kind="stable")
    start = 0
    while start < live.size:  # blocks of rows with similar grid sizes
        stop = start + 1
        while stop < live.size and int(points[order[stop]]) <= 2 * int(points[order[start]]) and (
            (stop - start + 1) * int(points[order[stop]]) * pi.shape[1] <= _ROW_BLOCK_CELLS
        ):
            stop += 1
        block = order[start:stop]
        block_rows = live[block]
        local_index = np.full(dists.num_rows, -1)
        local_index[block_rows] = np.arange(block_rows.size)
        queries = np.flatnonzero(local_index[rows] >= 0)
        if queries.size:
            local = local_index[rows[queries]]
            model = _BlockModel(
                dists.rows(block_rows),
                pi[block_rows],
                sigma[block_rows],
                top[block],
                points[block],
                fine[block],
            )
            out[queries] = model.bounds(steps, priors[queries], local, conditioned)
        start = stop
    return out


class _BlockModel:
    """log E_Q[L^alpha] for a block of laws, vectorised over (law, order) pairs."""

    def __init__(
        self,
        dists: CountDistributions,
        pi: np.ndarray,
        sigma: np.ndarray,
        top: np.ndarray,
        points: np.ndarray,
        fine: np.ndarray,
    ) -> None:
        self.pi, self.sigma, self.top, self.fine = pi, sigma, top, fine
        n = int(points[fine].max()) if fine.any() else 2
        # Each row's grid reaches its own alpha_top(row) c_max(row) + margin.
        self.grid = evaluate_grid_rows(pi, sigma, top, n) if fine.any() else None
        counts, log_g = dists.tail_log_bounds()
        keep = np.isfinite(log_g).any(axis=0)
        self.tail_counts, self.tail_log_g = counts[keep], log_g[:, keep]
        self.tail_mass = dists.tail_mass

    def log_moment(self, law: np.ndarray, alpha: np.ndarray, with_tail: bool = True) -> np.ndarray:
        """Upper bound on log E_Q[L^alpha] per (law, alpha) pair (one step), in memory-bounded blocks;
        ``with_tail=False``: of the law conditioned on S <= K."""
        width = max(1, self.tail_counts.size)
        per_block = max(1, _QUERY_BLOCK_CELLS // width)
        out = np.empty(alpha.size)
        for start in range(0, alpha.size, per_block):
            sl = slice(start, start + per_block)
            out[sl] = self._log_moment_block(law[sl], alpha[sl], with_tail)
        return out

    def _log_moment_block(self, law: np.ndarray, alpha: np.ndarray, with_tail: bool) -> np.ndarray:
        body = np.empty(alpha.size)
        fine = self.fine[law]
        if fine.any():
            body[fine] = _grid_log_moment(self.grid, law[fine], alpha[fine])
        if (~fine).any():
            body[~fine] = _convexity_log_moment(self.pi[law[~fine]], self.sigma[law[~fine]], alpha[~fine])
        body = body * (1.0 + QUADRATURE_ALLOWANCE)
        return self._with_tail(body, law, alpha) if with_tail else body

    def _with_tail(self, body: np.ndarray, law: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        """Combine the part given S <= K with the counts above K by Minkowski's inequality."""
        tau = self.tail_mass[law]
        if self.tail_counts.size == 0 or not (tau > 0).any():
            return body
        log_g = self.tail_log_g[law]
        # sum_{s>K} pi_s w_s <= sum_s (w_s - w_{s-1}) G_s with w_K := 0 (Abel summation).
        with np.errstate(over="ignore"):  # +inf at tiny sigma: the moment is infinite
            c = self.tail_counts[None, :] / self.sigma[law][:, None]
            log_w = 0.5 * (alpha[:, None] - 1.0) * c**2
        previous = np.concatenate([np.full((alpha.size, 1), -np.inf), log_w[:, :-1]], axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            # w_s - w_{s-1} = w_s (1 - w_{s-1} / w_s); +inf where w_s overflows (tiny sigma), not NaN
            log_dw = np.where(np.isinf(log_w), np.inf, log_w + np.log(-np.expm1(previous - log_w)))
            log_tail = _logsumexp(np.where(np.isneginf(log_g), -np.inf, log_dw + log_g))  # no inf - inf
            log_norm = np.logaddexp(np.log1p(-tau) + body / alpha, log_tail)
        return np.where(tau > 0, alpha * log_norm, body)

    def bounds(self, steps: int, priors: np.ndarray, law: np.ndarray, conditioned: bool) -> np.ndarray:
        """exp(min over alpha of [T log M(alpha) + (alpha - 1) log p] / alpha), capped at 1, with M of
        the law given S <= K plus 1 - (1 - tau)^T (``conditioned``), or with Minkowski's tail."""
        pairs, inverse = np.unique(np.stack([law.astype(np.float64), priors]), axis=1, return_inverse=True)
        law, priors = pairs[0].astype(np.int64), pairs[1]
        exponent = self._best_exponent(steps, priors, law, with_tail=not conditioned)
        # Rounded up: the exponent's terms T log M >= 0 and (alpha - 1) log p <= 0 are each at most
        # |exponent| + |log p| in size after dividing by alpha, so a few ulp of that bound its
        # rounding; exp adds an ulp. (At large sigma the bound is within ulps of the prior.)
        exponent = exponent + 8 * _ULP * (np.abs(exponent) + 2.0 * np.abs(np.log(priors)) + 1.0)
        result = np.exp(np.minimum(exponent, 0.0)) * (1.0 + 4 * _ULP)
        if conditioned:
            tau = self.tail_mass[law]
            result = result + (-np.expm1(steps * np.log1p(-tau))) * (1.0 + 1e-12)
        return np.minimum(result, 1.0)[inverse.ravel()]

    def _best_exponent(self, steps: int, priors: np.ndarray, law: np.ndarray, with_tail: bool) -> np.ndarray:
        """min over alpha of [T log M(alpha) + (alpha - 1) log p] / alpha per (law, prior) query.

        Orders: a log-spaced grid on each law's range, then golden-section refinement per query.
        Laws with many distinct priors use a dense grid instead (the refinement would cost one
        integral per prior and step).
        """
        log_p = np.log(priors)
        crowded = np.bincount(law, minlength=self.top.size) > DENSE_GRID_QUERIES
        grid = self._order_grid(ALPHA_GRID_POINTS)
        best, result = self._best_on_grid(grid, steps, law, log_p, with_tail)
        dense = crowded[law]
        if dense.any():
            dense_grid = self._order_grid(DENSE_GRID_POINTS, only=crowded)
            _, dense_result = self._best_on_grid(dense_grid, steps, law[dense], log_p[dense], with_tail)
            result[dense] = np.minimum(result[dense], dense_result)
        sparse = ~dense
        if sparse.any():
            t = np.log(grid[law[sparse]] - 1.0)
            idx = best[sparse]
            lo = t[np.arange(idx.size), np.maximum(idx - 1, 0)]
            hi = t[np.arange(idx.size), np.minimum(idx + 1, ALPHA_GRID_POINTS - 1)]
            law_s, log_p_s = law[sparse], log_p[sparse]

            def objective(tt: np.ndarray) -> np.ndarray:
                alpha = 1.0 + np.exp(tt)
                moment = self.log_moment(law_s, alpha, with_tail)
                return (steps * moment + (alpha - 1.0) * log_p_s) / alpha

            result[sparse] = np.minimum(result[sparse], _golden_minimum(objective, lo, hi))
        return result

    def _order_grid(self, points: int, only: np.ndarray | None = None) -> np.ndarray:
        """Per law, orders 1 + (alpha_top - 1) f with f log-spaced in [MIN_ALPHA_MINUS_ONE, 1]
        (NaN rows for laws not in ``only``)."""
        fractions = np.geomspace(MIN_ALPHA_MINUS_ONE, 1.0, points)
        grid = 1.0 + (self.top[:, None] - 1.0) * fractions[None, :]
        if only is not None:
            grid[~only] = np.nan
        return grid

    def _best_on_grid(
        self, grid: np.ndarray, steps: int, law: np.ndarray, log_p: np.ndarray, with_tail: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per query, the best grid index and value of [T log M(alpha) + (alpha - 1) log p] / alpha."""
        used = np.unique(law)
        points = grid.shape[1]
        lm = np.full(grid.shape, np.nan)
        orders = grid[used].ravel()
        lm[used] = self.log_moment(np.repeat(used, points), orders, with_tail).reshape(used.size, points)
        best = np.empty(law.size, dtype=np.int64)
        value = np.empty(law.size)
        per_block = max(1, _QUERY_BLOCK_CELLS // points)
        for start in range(0, law.size, per_block):
            sl = slice(start, start + per_block)
            a = grid[law[sl]]
            values = (steps * lm[law[sl]] + (a - 1.0) * log_p[sl, None]) / a
            best[sl] = np.argmin(values, axis=1)
            value[sl] = values[np.arange(best[sl].size), best[sl]]
        return best, value


def _logsumexp(x: np.ndarray) -> np.ndarray:
    """log sum exp along the last axis (-inf rows give -inf)."""
    peak = x.max(axis=-1)
    safe = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.exp(x - safe[..., None]).sum(axis=-1))


def _golden_minimum(func, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Vectorised golden-section search; returns the smallest value seen (each one is valid)."""
    ratio = (np.sqrt(5.0) - 1.0) / 2.0
    a, b = lo.copy(), hi.copy()
    x1 = b - ratio * (b - a)
    x2 = a + ratio * (b - a)
    f1, f2 = func(x1), func(x2)
    best = np.minimum(f1, f2)
    for _ in range(GOLDEN_ITERATIONS):
        left = f1 <= f2
        b = np.where(left, x2, b)
        a = np.where(left, a, x1)
        new_x = np.where(left, b - ratio * (b - a), a + ratio * (b - a))
        new_f = func(new_x)
        x2, f2, x1, f1 = (
            np.where(left, x1, new_x),
            np.where(left, f1, new_f),
            np.where(left, new_x, x2),
            np.where(left, new_f, f2),
        )
        best = np.minimum(best, new_f)
    return best


def _grid_log_moment(grid: MixtureGrid, law: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """log E_Q[L^alpha] by the trapezoidal rule for (law, alpha) pairs."""
    out = np.empty(alpha.size)
    per_block = max(1, _QUERY_BLOCK_CELLS // grid.z.shape[1])
    for start in range(0, alpha.size, per_block):
        sl = slice(start, start + per_block)
        rows, a = law[sl], alpha[sl]
        log_phi, log_ratio, u = grid.log_phi[rows], grid.log_ratio[rows], grid.ratio_minus_one[rows]
        log_step = np.log(grid.step[rows])
        log_space = _logsumexp(log_phi + a[:, None] * log_ratio) + log_step
        result = log_space.copy()
        near_one = log_space < 1e-3
        if near_one.any():
            k = np.flatnonzero(near_one)
            with np.errstate(over="ignore", invalid="ignore"):
                integral = grid.step[rows[k]] * (
                    np.exp(log_phi[k]) * power_kernel(u[k], a[k][:, None])
                ).sum(axis=1)
            ok = np.isfinite(integral) & (integral >= 0)
            result[k[ok]] = np.log1p(integral[ok])
        out[sl] = result
    return out


def _convexity_log_moment(pi: np.ndarray, sigma: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Minkowski over all components: log M <= alpha log sum_s pi_s exp((alpha-1) c_s^2 / 2)."""
    with np.errstate(over="ignore"):
        c2 = (np.arange(pi.shape[1])[None, :] / sigma[:, None]) ** 2  # +inf at tiny sigma
    with np.errstate(divide="ignore"):
        log_pi = np.log(pi)
    # absent counts contribute nothing (-inf), also where c^2 overflowed (-inf + inf would be NaN)
    with np.errstate(invalid="ignore"):
        terms = np.where(pi > 0, log_pi + 0.5 * (alpha[:, None] - 1.0) * c2, -np.inf)
    return alpha * _logsumexp(terms)
