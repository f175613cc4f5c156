"""One step's privacy loss as a pessimistic connect-the-dots PMF, from exact cell masses.

The pair is P = sum_s pi_s N(s, sigma^2) (the secret's examples contribute S ~ pi) against
Q = N(0, sigma^2). In standard units y = x / sigma, c_s = s / sigma, the privacy loss is
l(y) = log L(y), L(y) = pi_0 + sum_{s>=1} pi_s exp(c_s y - c_s^2 / 2): increasing in y, with
l(y) -> log pi_0 =: eps_0 as y -> -inf. So under P the loss has an atom-free law on (eps_0, inf)
whose cdf climbs steeply just above eps_0 when E[S] is small (the jump the issue about rarely sampled
secrets found: a quadrature across that cell under-estimates every hockey-stick value below it).

Connect-the-dots (Doroshenko et al. 2022, Alg. 1) on the grid eps_k = k d, restated per cell:
a loss value l in [eps_k, eps_{k+1}) is split into mass b(l) = (1 - e^{eps_k - l}) / (1 - e^{-d})
at eps_{k+1} and 1 - b(l) at eps_k. This preserves total mass and E[e^{-l}] and so reproduces the
hockey-stick divergence delta(eps) = E_P[(1 - e^{eps - l})_+] exactly at every grid point and
over-estimates it between them (delta is convex in e^eps). Integrated over a cell, with
A_k = P(l in cell_k) and B_k = Q(l in cell_k) = E_P[e^{-l} 1{cell_k}],

    b_k = (A_k - e^{eps_k} B_k) / (1 - e^{-d}),      a_k = (e^{eps_{k+1}} B_k - A_k) / (e^d - 1),

both integrals of non-negative functions (l in the cell). A_k and B_k come from the closed form:
the cell is the y-interval [y_k, y_{k+1}) with l(y_k) = eps_k, y_k = -inf for eps_k <= eps_0 (the
cell holding eps_0 is the whole left tail in y, handled exactly, no special case), and
P(y > y_k) = sum_s pi_s Phi_bar(y_k - c_s), Q(y > y_k) = Phi_bar(y_k).

Every mass returned is an upper bound of the exact connect-the-dots mass: A_k and B_k are differences
of survival functions or of cdfs, whichever pair is smaller (absolute error a few ulp of that
operand, times the number of components), and each a_k, b_k gets that error bound, propagated
through its formula, added before clamping at 0. A measure that dominates the exact one point by point
dominates it after any number of convolutions, so every composed hockey-stick value is an upper bound
(the ``tight`` accountant's guarantee rests on exactly this). The threshold y_k is solved to rounding;
what error remains shifts mass between neighbouring cells (first order, it cancels in the mass of a
grid point) and moves a hockey-stick value by at most density * tau^2; a relative margin
(THRESHOLD_MARGIN) covers it. The mass P(l > eps_top) goes to +infinity.
tests/test_accounting_connect_dots.py checks every mass against an mpmath evaluation at 50 digits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

#: One-step mass allowed beyond the top of the grid, sent to +infinity (pessimistic). Small enough
#: that T times it stays far below any target; the grid reaches it wherever exp() is finite.
ONE_STEP_TAIL = 1e-25
#: Largest loss on the grid: e^eps must stay finite in double precision.
MAX_LOSS = 700.0
#: Lowest loss when P(S=0) = 0 (no jump): mass below it is moved up to it (pessimistic).
LOWER_TAIL = 1e-30
_ULP = np.finfo(np.float64).eps
_NEWTON_TOLERANCE = 4 * _ULP
#: The unit of every rounding allowance added to a mass (tests set it to 0 to see the method in exact
#: arithmetic); the threshold solve uses _ULP.
MASS_ROUNDING_UNIT = _ULP
#: Relative margin on every mass for what the threshold solve leaves (a shift of y_k by a few ulp
#: moves a tail cell's mass by ~|y_k| ulp relative; measured below 1e-13 against mpmath).
THRESHOLD_MARGIN = 1e-11
_MAX_NEWTON = 200
#: Search for a tail point: it only has to satisfy its tail condition (the bracket end that does is
#: returned), so 32^-4 of the initial interval is ample.
_TAIL_PIECES = 32
_TAIL_ROUNDS = 4


@dataclass(frozen=True)
class OneStepPmf:
    """Masses on eps_k = (k_lo + i) d, i = 0..n-1, plus ``infinity`` at +inf (all upper bounds)."""

    k_lo: int
    step: float
    masses: np.ndarray
    infinity: float

    @property
    def losses(self) -> np.ndarray:
        return (self.k_lo + np.arange(self.masses.size)) * self.step


@dataclass(frozen=True)
class _Mixture:
    """The components s >= 1 of S with positive mass (log weights, c_s = s / sigma) and pi_0."""

    log_w: np.ndarray
    c: np.ndarray
    pi0: float
    rest: float  # P(S >= 1) = 1 - pi_0, summed from the components (no cancellation)

    @property
    def jump(self) -> float:
        """eps_0 = log pi_0 (-inf without an atom at S = 0)."""
        return math.log1p(-self.rest) if self.pi0 > 0 else -math.inf


def _mixture(pi: np.ndarray, sigma: float) -> _Mixture:
    counts = np.arange(pi.size, dtype=np.float64)
    positive = (pi > 0) & (counts > 0)
    weights = pi[positive]
    return _Mixture(np.log(weights), counts[positive] / sigma, float(pi[0]), float(weights.sum()))


def _row_dot(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """matrix @ vector in one thread: OpenBLAS threads these thin (n x K) products, and its threads
    spin on a loaded machine (twice the CPU time for the same wall time, measured)."""
    return np.einsum("ij,j->i", matrix, vector)


def _log_sum_and_slope(mix: _Mixture, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """m(y) = log sum_{s>=1} pi_s exp(c_s y - c_s^2 / 2) (convex, increasing) and its slope
    m'(y) = sum_s c_s pi_s e^(...) / sum_s pi_s e^(...)."""
    a = mix.log_w[None, :] + mix.c[None, :] * y[:, None] - 0.5 * mix.c[None, :] ** 2
    peak = a.max(axis=1)
    e = np.exp(a - peak[:, None])
    total = e.sum(axis=1)
    return peak + np.log(total), _row_dot(e, mix.c) / total


def _loss(mix: _Mixture, y: float) -> float:
    rest = float(_log_sum_and_slope(mix, np.array([y]))[0][0])
    return float(np.logaddexp(math.log(mix.pi0), rest)) if mix.pi0 > 0 else rest


def _threshold_targets(mix: _Mixture, eps: np.ndarray) -> np.ndarray:
    """t(eps) = log(e^eps - pi_0) = eps_0 + log(expm1(eps - eps_0)), stable just above the jump."""
    if mix.pi0 <= 0:
        return eps.copy()
    gap = eps - mix.jump
    return eps + np.log(-np.expm1(-gap))


def _thresholds(mix: _Mixture, eps: np.ndarray, y_range: tuple[float, float]) -> np.ndarray:
    """y_k with l(y_k) = eps_k (-inf where eps_k <= eps_0), by Newton from the right.

    m is convex and increasing: started right of the root, Newton's iterates decrease to it.
    """
    y = np.full(eps.size, -np.inf)
    active = eps > mix.jump
    if not active.any():
        return y
    t = _threshold_targets(mix, eps[active])
    # Start right of the root, so that m(y) - t stays in [0, log K] for every iterate (no overflow,
    # and the largest term e^(a_s - t) is at least 1/K): the nearer root of the tangents at the two
    # table points around t (a tangent of the convex m lies below m, so both roots lie right of the
    # root, and m there exceeds t by at most the right point's excess), or where that excess is above
    # log K or the table ends, the single-component inverse (every component is at most t there).
    # The start's error is ~ m'' h^2 / m' for table spacing h; Newton needs ~2 more iterations.
    shift = mix.log_w - 0.5 * mix.c**2  # a_s(y) = shift_s + c_s y
    coarse = np.linspace(y_range[0] - 1.0, y_range[1] + 1.0, min(4097, max(257, eps.size // 4 + 1)))
    table, slope = _log_sum_and_slope(mix, coarse)
    idx = np.clip(np.searchsorted(table, t, side="right"), 0, coarse.size - 1)
    excess = table[idx] - t
    current = coarse[idx] - np.maximum(excess, 0.0) / slope[idx]
    left = np.maximum(idx - 1, 0)
    below = table[left] < t
    from_left = coarse[left] + (t - table[left]) / slope[left]
    current[below] = np.minimum(current[below], from_left[below])
    single = np.flatnonzero((excess < 0) | (excess > math.log(mix.c.size)))
    if single.size:
        current[single] = np.min((t[single, None] - shift[None, :]) / mix.c[None, :], axis=1)
    moving = np.arange(t.size)
    rounding = 8 * _ULP * (1.0 + np.abs(t))
    # After a step from y (residual r = m(y) - t > 0), the error left is at most (r / c_min)^2
    # m''_max / m'(y): y - y* <= r / m'(y*) <= r / c_min, and Newton's error is at most
    # e^2 m''_max / m'(y) for convex m, with m'' a variance of the c_s, <= (c_max - c_min)^2 / 4.
    curvature = 0.25 * (mix.c.max() - mix.c.min()) ** 2 / mix.c.min() ** 2
    for _ in range(_MAX_NEWTON):
        ym = current[moving]
        e = np.multiply.outer(ym, mix.c)
        e += shift
        e -= t[moving, None]
        np.exp(e, out=e)  # e_s = exp(a_s(y) - t): m(y) - t = log sum_s e_s, no cancellation
        total, weighted = e.sum(axis=1), _row_dot(e, mix.c)
        residual = np.log(total)
        change = residual * total / weighted
        current[moving] = ym - change
        small_step = np.abs(change) <= _NEWTON_TOLERANCE * (1.0 + np.abs(ym))
        left_over = curvature * residual**2 * total / weighted  # the error bound above
        done = small_step | (np.abs(residual) <= rounding[moving])
        done |= (residual > 0) & (left_over <= _NEWTON_TOLERANCE * (1.0 + np.abs(current[moving])))
        moving = moving[~done]
        if moving.size == 0:
            break
    else:  # pragma: no cover - Newton on a convex increasing function from the right converges
        raise RuntimeError("privacy-loss threshold inversion did not converge")
    y[active] = current
    return y


def _tail_point(mix: _Mixture, mass: float, upper: bool) -> float:
    """y with P(Y > y) <= mass (upper) or P(Y < y) <= mass under P, from the closed form: the
    bracket is cut into _TAIL_PIECES at once, _TAIL_ROUNDS times (to ~1e-6 of its width), and the
    end that satisfies the tail condition is returned."""
    weights = np.exp(mix.log_w)
    tail = _p_survival if upper else _p_cdf  # P has no atoms: P(Y < y) = P(Y <= y)
    lo, hi = (0.0, float(mix.c.max()) + 40.0) if upper else (-40.0, float(mix.c.max()))
    for _ in range(_TAIL_ROUNDS):
        points = np.linspace(lo, hi, _TAIL_PIECES + 1)
        small = tail(mix, points, weights) <= mass  # upper: False..True; lower: True..False
        if upper:
            j = int(np.argmax(small)) if small.any() else _TAIL_PIECES
            lo, hi = float(points[max(j - 1, 0)]), float(points[j])
        else:
            j = _TAIL_PIECES - int(np.argmax(small[::-1])) if small.any() else 0
            lo, hi = float(points[j]), float(points[min(j + 1, _TAIL_PIECES)])
    return hi if upper else lo


def _p_cdf(mix: _Mixture, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """P(Y <= y) = pi_0 Phi(y) + sum_s pi_s Phi(y - c_s), a sum of positive terms."""
    return mix.pi0 * special.ndtr(y) + _row_dot(special.ndtr(y[:, None] - mix.c[None, :]), weights)


def _p_survival(mix: _Mixture, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """P(Y > y) = pi_0 Phi(-y) + sum_s pi_s Phi(c_s - y), a sum of positive terms."""
    return mix.pi0 * special.ndtr(-y) + _row_dot(special.ndtr(mix.c[None, :] - y[:, None]), weights)


#: Every this many thresholds, P's cdf is evaluated to locate where it passes 1/2.
_SPLIT_STRIDE = 64


def _p_cell_masses(mix: _Mixture, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """P-mass of each cell [y_k, y_{k+1}), its rounding-error bound (``_cell_masses``), P(Y <= y_0)
    and P(Y > y_last).

    ``_cell_masses`` takes cdf differences left of the first index m with P(Y <= y_m) >= 1/2 and
    survival differences right of it: so P's cdf is needed on [0, m] and its survival function on
    [m - 1, n), one sum of K + 1 ndtr per threshold instead of two. m is located on a subsample.
    """
    weights = np.exp(mix.log_w)
    n = y.size
    sample = np.unique(np.append(np.arange(0, n, _SPLIT_STRIDE), n - 1))
    past_half = np.flatnonzero(_p_cdf(mix, y[sample], weights) >= 0.5)
    if past_half.size == 0:
        split = n
    elif past_half[0] == 0:
        split = 0
    else:
        window = np.arange(sample[past_half[0] - 1] + 1, sample[past_half[0]] + 1)
        split = int(window[np.argmax(_p_cdf(mix, y[window], weights) >= 0.5)])
    cdf, surv = np.full(n, np.nan), np.full(n, np.nan)
    cdf[: split + 1] = _p_cdf(mix, y[: split + 1], weights)
    low = max(split - 1, 0)
    surv[low:] = _p_survival(mix, y[low:], weights)
    use_cdf = np.arange(n - 1) < split - 1
    if 1 <= split <= n - 1:
        use_cdf[split - 1] = cdf[split] <= surv[split - 1]
    masses, error = _cell_masses(surv, cdf, mix.c.size + 1, use_cdf)
    return masses, error, float(cdf[0]), float(surv[-1])


def _cell_masses(
    surv: np.ndarray, cdf: np.ndarray, terms: int, use_cdf: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Mass of each cell [y_k, y_{k+1}) and a bound on its rounding error.

    Both surv_k - surv_{k+1} and cdf_{k+1} - cdf_k are exact in real arithmetic; the one with the
    smaller operands is used (``use_cdf``, by default decided here). ndtr is accurate to a few ulp
    (relative) and a sum of ``terms`` positive terms adds ``terms`` ulp, so ``error`` =
    4 (terms + 4) ulp of the larger operand bounds the error of the difference with room to spare.
    """
    if use_cdf is None:
        use_cdf = cdf[1:] <= surv[:-1]
    difference = np.where(use_cdf, cdf[1:] - cdf[:-1], surv[:-1] - surv[1:])
    operand = np.where(use_cdf, cdf[1:], surv[:-1])
    error = 4.0 * (terms + 4) * MASS_ROUNDING_UNIT * operand
    return np.maximum(difference, 0.0), error


@dataclass(frozen=True)
class LossRange:
    """The losses the one-step grid must span (``low``, ``high``) and the y-range (``y_low``, ``y_high``)
    that brackets their thresholds: computed once per law (each end is a bisection)."""

    low: float
    high: float
    y_low: float
    y_high: float


def loss_range(pi: np.ndarray, sigma: float, cap: float = MAX_LOSS) -> LossRange:
    """The :class:`LossRange` for S ~ ``pi`` at ``sigma``: from the jump eps_0 (or the lower tail point
    when P(S=0) = 0) up to the loss at the upper tail point (P-mass ONE_STEP_TAIL above it), or up to
    ``cap`` (at most MAX_LOSS) if that is lower: the grid's top mass goes to +infinity either way."""
    mix = _mixture(pi, sigma)
    y_high = _tail_point(mix, ONE_STEP_TAIL, upper=True)
    high = _loss(mix, y_high)
    y_low, low = -40.0, mix.jump
    if mix.pi0 <= 0:
        y_low = _tail_point(mix, LOWER_TAIL, upper=False)
        low = max(_loss(mix, y_low), -MAX_LOSS)
    cap = min(cap, MAX_LOSS)
    if high > cap > low:  # the y-range ends where the loss reaches the cap
        y_high = float(_thresholds(mix, np.array([cap]), (y_low, y_high))[0])
    return LossRange(low, min(high, cap), y_low, y_high)


def one_step_pmf(
    pi: np.ndarray, tail_mass: float, sigma: float, step: float, span: LossRange | None = None
) -> OneStepPmf:
    """Pessimistic connect-the-dots PMF of one step for S ~ ``pi`` (given S <= K) on a grid of width
    ``step``; the mass ``tail_mass`` = P(S > K) goes to +infinity (H(P) <= (1 - tau) H(P') + tau).
    ``span``: the law's :class:`LossRange` when the caller already has it.
    """
    mix = _mixture(pi, sigma)
    if mix.rest <= 0:  # S = 0 surely: P = Q, all loss mass at 0
        return OneStepPmf(0, step, np.array([1.0 - tail_mass]), tail_mass)
    span = loss_range(pi, sigma) if span is None else span
    k_lo = math.floor(span.low / step)
    k_hi = max(math.ceil(span.high / step), k_lo + 1)
    eps = np.arange(k_lo, k_hi + 1) * step
    y = _thresholds(mix, eps, (span.y_low, span.y_high))
    terms = mix.c.size + 1
    cell_p, err_p, p_below, p_above = _p_cell_masses(mix, y)
    cell_q, err_q = _cell_masses(special.ndtr(-y), special.ndtr(y), 1)
    gamma = np.exp(eps[:-1])
    up, down = -math.expm1(-step), math.expm1(step)  # 1 - e^{-d}, e^d - 1
    # the products and the subtraction
    slack = 4 * MASS_ROUNDING_UNIT * (cell_p + gamma * math.exp(step) * cell_q)
    to_next = (cell_p - gamma * cell_q + err_p + gamma * err_q + slack) / up
    stay = (gamma * math.exp(step) * cell_q - cell_p + gamma * math.exp(step) * err_q + err_p + slack) / down
    masses = np.zeros(eps.size)
    masses[:-1] += np.maximum(stay, 0.0)
    masses[1:] += np.maximum(to_next, 0.0)
    masses *= 1.0 + THRESHOLD_MARGIN
    if mix.pi0 <= 0:  # loss below the lowest grid point is moved up to it
        masses[0] += p_below * (1.0 + 4 * terms * MASS_ROUNDING_UNIT)
    top = p_above * (1.0 + 4 * terms * MASS_ROUNDING_UNIT + THRESHOLD_MARGIN)
    keep = 1.0 - tail_mass
    return OneStepPmf(k_lo, step, keep * masses, min(1.0, keep * top + tail_mass))
