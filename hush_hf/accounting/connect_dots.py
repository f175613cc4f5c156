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

both integrals of non-negative functions (l in the cell). The cell is the y-interval [y_k, y_{k+1})
with l(y_k) = eps_k, y_k = -inf for eps_k <= eps_0 (the cell holding eps_0 is the whole left tail in
y, handled exactly, no special case).

Every mass returned is an upper bound of the exact connect-the-dots mass, with an allowance relative
to the mass itself. The numerators are never formed as the difference A_k - e^{eps_k} B_k (whose
rounding, a few ulp of the cdf, divided by 1 - e^{-d} put extra mass on every cell: issue 22), but as
integrals of phi(y) (L(y) - L(y_k)) and phi(y) (L(y_{k+1}) - L(y)) over the cell, from the moments of
phi on the cell (``gaussian_cells``), each with an error bound (``one_step_pmf``). A measure that
dominates the exact one point by point dominates it after any number of convolutions, so every
composed hockey-stick value is an upper bound (the ``tight`` accountant's guarantee rests on exactly
this). The threshold y_k is solved to rounding, and what the solve leaves, r_k = L(y_k) - e^{eps_k},
is computed and carried (first order); the loss values it puts on the wrong side of a grid point move
a hockey-stick value by at most (|r_k| / (e^{eps_k} d))^2 relative, which MAX_THRESHOLD_ERROR_RATIO
keeps below 1e-12 and a relative margin (THRESHOLD_MARGIN) covers. The mass below the lowest grid
point (at most LOWER_TAIL) is moved up to it, the mass P(l > eps_top) goes to +infinity.
tests/test_accounting_connect_dots.py checks every mass against an mpmath evaluation at 50 digits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from hush_hf.accounting.gaussian_cells import interval_mass, narrow_moments

#: One-step mass allowed beyond the top of the grid, sent to +infinity (pessimistic). Small enough
#: that T times it stays far below any target; the grid reaches it wherever exp() is finite.
ONE_STEP_TAIL = 1e-25
#: Largest loss on the grid: e^eps must stay finite in double precision.
MAX_LOSS = 700.0
#: P-mass below the lowest grid loss, moved up to it (pessimistic).
LOWER_TAIL = 1e-30
_ULP = np.finfo(np.float64).eps
_NEWTON_TOLERANCE = 4 * _ULP
#: The unit of every rounding allowance added to a mass (tests set it to 0 to see the method in exact
#: arithmetic); the threshold solve uses _ULP.
MASS_ROUNDING_UNIT = _ULP
#: Relative margin on every mass for the loss values the threshold solve leaves on the wrong side of
#: a grid point: second order, (|r_k| / (e^eps_k d))^2 <= MAX_THRESHOLD_ERROR_RATIO^2 = 1e-12 of the
#: neighbouring masses (a proportional inflation: T = 1e6 steps compound it to 1 + 1e-5).
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
    """The mixture of ``pi`` read as P(S = s) = pi_s for s >= 1 and P(S = 0) = 1 - sum_{s>=1} pi_s (no
    atom when pi_0 = 0): the signal's mass is what the pmf gives accurately (relative rounding), and
    pi_0 only ever enters through it, so the model is one exact law whatever pi_0 rounded to."""
    counts = np.arange(pi.size, dtype=np.float64)
    positive = (pi > 0) & (counts > 0)
    weights = pi[positive]
    rest = float(weights.sum())
    pi0 = max(0.0, 1.0 - rest) if pi[0] > 0 else 0.0
    return _Mixture(np.log(weights), counts[positive] / sigma, pi0, rest)


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
    return float(np.logaddexp(mix.jump, rest)) if mix.pi0 > 0 else rest


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


#: What the threshold solve leaves, |l(y_k) - eps_k| (known from the residual r_k, ``_ThresholdTerms``),
#: may be at most this fraction of the grid step: the loss values it puts on the wrong side of a grid
#: point then move a hockey-stick value by a relative (ratio)^2 <= 1e-12, inside THRESHOLD_MARGIN.
MAX_THRESHOLD_ERROR_RATIO = 1e-6
#: Largest c_max = K / sigma tried at all: beyond it rounding of c y - c^2 / 2 (~c^2 ulp) exceeds
#: MAX_THRESHOLD_ERROR_RATIO of any grid step (8 eps c^2 / 2 > 1e-6 * 0.05 at c ~ 5300).
MAX_SEPARATION = 4096.0
#: Only thresholds with |eps_k| below this may be refined in the u form (``_refine``).
SMALL_LOSS = 1.0


class UnresolvedLoss(ValueError):
    """The one-step loss grid cannot be built soundly at this sigma: the components are so far
    apart (c = s / sigma in the thousands) that rounding in c y - c^2 / 2 exceeds what the grid's
    margin covers. The noiseless bound (``noiseless``) is then the answer, and nearly exact."""


def _check_separation(mix: _Mixture, sigma: float) -> None:
    if mix.c.size and float(mix.c.max()) > MAX_SEPARATION:
        raise UnresolvedLoss(f"sigma={sigma!r}: components {float(mix.c.max()):.3g} sigma apart")


@dataclass(frozen=True)
class LossRange:
    """The losses the one-step grid must span (``low``, ``high``) and the y-range (``y_low``, ``y_high``)
    that brackets their thresholds: computed once per law (each end is a bisection)."""

    low: float
    high: float
    y_low: float
    y_high: float


def loss_range(pi: np.ndarray, sigma: float, cap: float = MAX_LOSS) -> LossRange:
    """The :class:`LossRange` for S ~ ``pi`` at ``sigma``: from the loss at the lower tail point
    (P-mass LOWER_TAIL below it, moved up to the grid's lowest point) up to the loss at the upper tail
    point (P-mass ONE_STEP_TAIL above it), or up to ``cap`` (at most MAX_LOSS) if that is lower: the
    grid's top mass goes to +infinity either way.

    The range starts at the jump eps_0 = log P(S=0) only where P holds mass there (rarely sampled
    secrets at small sigma). It used to start there always: at large sigma the loss never comes near
    eps_0 (10 examples at rho = 0.5, sigma = 5.6e5: losses within +-4e-4 of 0, eps_0 = -6.9), and the
    2^15-point cap then made the grid step 2e-4 against a loss scale of 1e-5 (issue 22, case 1).
    """
    mix = _mixture(pi, sigma)
    _check_separation(mix, sigma)
    y_high = _tail_point(mix, ONE_STEP_TAIL, upper=True)
    high = _loss(mix, y_high)
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
    ``span``: the law's :class:`LossRange` when the caller already has it. Raises ``UnresolvedLoss``
    where the thresholds cannot be solved to MAX_THRESHOLD_ERROR_RATIO of ``step`` (tiny sigma).

    Per cell k (between thresholds y_k < y_{k+1}, h = y_{k+1} - y_k) the two connect-the-dots
    numerators are integrals of non-negative functions,

        A_k - e^{eps_k} B_k = beta_k + r_k B_k,          e^{eps_{k+1}} B_k - A_k = alpha_k - r_{k+1} B_k,

    beta_k = int_cell phi(y) (L(y) - L(y_k)) dy = sum_s w_s(y_k) int_0^h phi(y_k + t) expm1(c_s t) dt,
    alpha_k = int_cell phi(y) (L(y_{k+1}) - L(y)) dy = sum_s w_s(y_{k+1}) int_0^h phi(y_{k+1} - t)
    (-expm1(-c_s t)) dt (w_s(y) = pi_s e^{c_s y - c_s^2 / 2}; the atom pi_0 cancels exactly) and
    r_k = L(y_k) - e^{eps_k} what the threshold solve left (``_ThresholdTerms``). They are computed
    as such, never as the difference A_k - e^{eps_k} B_k, whose rounding (a few ulp of the cdf) was
    divided by 1 - e^{-d} ~ d: ``_cell_numerators``. Every number carries an error bound proportional
    to itself, so the allowances scale the PMF by ~(1 + 1e-12) rather than adding mass where there is
    none; the loss values outside a cell's [eps_k, eps_{k+1}] (what r_k leaves) move mass by the
    second-order amount THRESHOLD_MARGIN covers.
    """
    mix = _mixture(pi, sigma)
    if mix.rest <= 0:  # S = 0 surely: P = Q, all loss mass at 0
        return OneStepPmf(0, step, np.array([1.0 - tail_mass]), tail_mass)
    span = loss_range(pi, sigma) if span is None else span
    if span.low >= span.high:  # every loss is above the cap: all the mass goes to +infinity
        return OneStepPmf(math.floor(span.high / step), step, np.zeros(1), 1.0)
    k_lo = math.floor(span.low / step)
    k_hi = max(math.ceil(span.high / step), k_lo + 1)
    eps = np.arange(k_lo, k_hi + 1) * step
    _check_separation(mix, sigma)
    y = _thresholds(mix, eps, (span.y_low, span.y_high))
    y, terms = _ThresholdTerms.at(mix, eps, y, step)
    left = (np.abs(terms.r) + terms.r_error) * np.exp(-eps)  # >= |1 - e^{l(y_k) - eps_k}|
    if np.max(left[np.isfinite(y)], initial=0.0) > MAX_THRESHOLD_ERROR_RATIO * step:
        raise UnresolvedLoss(f"sigma={sigma!r}: thresholds not resolved to the grid step {step:.3g}")
    beta, alpha, q_mass, err_beta, err_alpha, err_q = _cell_numerators(mix, y, terms)
    unit = MASS_ROUNDING_UNIT / _ULP  # 0 in tests that look at the method in exact arithmetic
    r_lo, r_hi = terms.r[:-1], terms.r[1:]
    to_next = beta + r_lo * q_mass
    stay = alpha - r_hi * q_mass
    to_next_err = err_beta + np.abs(r_lo) * err_q + terms.r_error[:-1] * q_mass
    stay_err = err_alpha + np.abs(r_hi) * err_q + terms.r_error[1:] * q_mass
    to_next_err += 4 * _ULP * (np.abs(beta) + np.abs(r_lo * q_mass))
    stay_err += 4 * _ULP * (np.abs(alpha) + np.abs(r_hi * q_mass))
    up, down = -math.expm1(-step), math.expm1(step)  # 1 - e^{-d}, e^d - 1 (relative ulp each)
    masses = np.zeros(eps.size)
    masses[:-1] += np.maximum((stay + unit * stay_err) / down * (1.0 + 4 * MASS_ROUNDING_UNIT), 0.0)
    masses[1:] += np.maximum((to_next + unit * to_next_err) / up * (1.0 + 4 * MASS_ROUNDING_UNIT), 0.0)
    masses *= 1.0 + THRESHOLD_MARGIN
    below, below_err = _p_tail(mix, y[0], upper=False)  # 0 when y_0 = -inf (the jump's cell)
    masses[0] += below + unit * below_err  # loss below the lowest grid point is moved up to it
    above, above_err = _p_tail(mix, y[-1], upper=True)
    top = (above + unit * above_err) * (1.0 + THRESHOLD_MARGIN)
    keep = 1.0 - tail_mass
    return OneStepPmf(k_lo, step, keep * masses, min(1.0, keep * top + tail_mass))


def _refine(mix: _Mixture, eps: np.ndarray, y: np.ndarray) -> np.ndarray:
    """One Newton step on u(y) = L(y) - 1 = expm1(eps_k).

    ``_thresholds`` solves log sum_s pi_s e^{a_s} = t_k, whose rounding (a few ulp of |log pi_s| and
    |t_k| ~ 1-50) is large next to the grid step when the losses are tiny (large sigma: d ~ 1e-9). In u
    = sum_s pi_s expm1(a_s) (+ pi_0 + rest - 1 = 0) every term keeps its relative precision, so one
    step from within rounding of the root leaves |u(y) - expm1(eps)| at ulps of |u|. L is convex and
    increasing: the step lands right of the root, as ``_thresholds`` leaves it.
    """
    a = np.multiply.outer(y, mix.c) - 0.5 * mix.c**2
    weights = np.exp(mix.log_w)
    u = _row_dot(np.expm1(a), weights) + _offset(mix)
    slope = _row_dot(np.exp(a) * mix.c, weights)
    return y - (u - np.expm1(eps)) / slope


def _offset(mix: _Mixture) -> float:
    """pi_0 + rest - 1 as the model reads it: 0 with an atom at S = 0 (pi_0 := 1 - rest), rest - 1
    (exact in floating point, ~1e-16) without one."""
    return 0.0 if mix.pi0 > 0 else mix.rest - 1.0


#: Thresholds whose residual bound (log form) exceeds this fraction of the grid step are refined and
#: their residual recomputed in the u form (``_ThresholdTerms``).
REFINE_RATIO = 1e-10


@dataclass(frozen=True)
class _ThresholdTerms:
    """At each threshold y_k: w_s(y_k) = pi_s e^{a_s}, a_s = c_s y_k - c_s^2 / 2 (0 at y_k = -inf), a
    bound on their relative error, and r_k = L(y_k) - e^{eps_k} with a bound on its error.

    r_k = e^{t_k} expm1(rho_k), rho_k = log sum_s e^{log pi_s + a_s - t_k} the residual of the
    equation ``_thresholds`` solved; its terms are ~|t_k| and |log pi_s| in size, an ulp each. Where
    that bound is above REFINE_RATIO of the grid step (tiny losses, large sigma), y_k gets one Newton
    step on u = L - 1 (``_refine``) and r_k = u(y_k) - expm1(eps_k) is computed from
    u = sum_s pi_s expm1(a_s), each term to its own precision; the smaller error bound is kept. At
    y_k = -inf, L = pi_0 and r_k = pi_0 - e^{eps_k} = pi_0 (-expm1(eps_k - eps_0)) >= 0.
    """

    w: np.ndarray  # thresholds x components
    w_error: np.ndarray  # relative, per threshold
    r: np.ndarray
    r_error: np.ndarray

    @classmethod
    def at(
        cls, mix: _Mixture, eps: np.ndarray, y: np.ndarray, step: float
    ) -> tuple[np.ndarray, _ThresholdTerms]:
        """The (possibly refined) thresholds and their terms."""
        n = y.size
        terms = cls(np.zeros((n, mix.c.size)), np.zeros(n), np.zeros(n), np.zeros(n))
        solved = np.isfinite(y)
        if (~solved).any():  # eps_k <= eps_0: y_k = -inf and L(y_k) = pi_0
            terms.r[~solved] = math.exp(mix.jump) * -np.expm1(eps[~solved] - mix.jump)
            terms.r_error[~solved] = 4 * _ULP * terms.r[~solved]
        if not solved.any():
            return y, terms
        k = np.flatnonzero(solved)
        terms._fill(mix, eps, y, k, u_form=False)
        loose = k[(terms.r_error[k] * np.exp(-eps[k]) > REFINE_RATIO * step) & (np.abs(eps[k]) < SMALL_LOSS)]
        if loose.size:
            y = y.copy()
            y[loose] = _refine(mix, eps[loose], y[loose])
            terms._fill(mix, eps, y, loose, u_form=True)
        return y, terms

    def _fill(self, mix: _Mixture, eps: np.ndarray, y: np.ndarray, k: np.ndarray, u_form: bool) -> None:
        ys, e_k = y[k], eps[k]
        t = _threshold_targets(mix, e_k)
        shift = mix.log_w - 0.5 * mix.c**2
        e = np.exp(np.multiply.outer(ys, mix.c) + (shift - t[:, None]))
        # log form: every exponent c_s y + shift_s - t is rounded against terms of at most this size;
        # the residual log sum_s e_s errs by an ulp or two of it, plus the sum's rounding
        magnitude = float(np.max(np.abs(shift))) + float(mix.c.max()) * np.abs(ys) + np.abs(t)
        log_error = 4 * _ULP * magnitude + (mix.c.size + 4) * _ULP
        rho = np.log(e.sum(axis=1))
        scale = np.exp(t)
        self.w[k] = e * scale[:, None]
        self.w_error[k] = log_error + 2 * _ULP
        r = scale * np.expm1(rho)
        r_error = np.exp(t + np.abs(rho)) * np.expm1(log_error)
        if u_form:
            weights = np.exp(mix.log_w)
            a = np.multiply.outer(ys, mix.c) - 0.5 * mix.c**2
            size = np.abs(np.multiply.outer(ys, mix.c)) + 0.5 * mix.c**2  # what a_s is rounded against
            em1 = np.expm1(a)
            u = _row_dot(em1, weights) + _offset(mix)
            target = np.expm1(e_k)
            # expm1(a) moves by e^a times a's rounding (2 ulp of its size); then the sum and the target
            u_error = _row_dot(np.exp(a) * size, weights) * 2.5 * _ULP
            u_error += (mix.c.size + 4) * _ULP * (_row_dot(np.abs(em1), weights) + np.abs(target))
            better = u_error < r_error
            r = np.where(better, u - target, r)
            r_error = np.where(better, u_error, r_error)
        self.r[k], self.r_error[k] = r, r_error


#: A cell takes the series route (``gaussian_cells.narrow_moments``) when its moments come out to this
#: relative accuracy and c_max h <= SERIES_MAX_CH; the closed-form route otherwise.
SERIES_ACCURACY = 1e-11
SERIES_MAX_CH = 0.5
#: Cells with c_max h and h (|y| + h) below this (the bulk) share a short series (``_cell_numerators``).
EASY_CELL = 0.02
_MAX_ORDER = 30
#: The expm1 series of the integrands is cut where its remainder (added to the error) is below this,
#: relative.
_TRUNCATION = 1e-14


def _series_order(x: float) -> int:
    """Smallest J with x^J e^x / (J + 1)! <= _TRUNCATION (x = max c_s h over the series cells)."""
    order, term = 1, x * math.exp(x) / 2.0
    while term > _TRUNCATION and order < _MAX_ORDER:
        order += 1
        term *= x / (order + 1)
    return order


def _cell_numerators(mix: _Mixture, y: np.ndarray, terms: _ThresholdTerms):
    """Per cell (between consecutive thresholds): beta_k, alpha_k, B_k = Q(cell) and absolute error
    bounds of each (see ``one_step_pmf``). Three routes:

    - the jump's cell (y_k = -inf < y_{k+1}): beta = sum_s pi_s Phi(y_{k+1} - c_s), alpha =
      sum_s (w_s(y_{k+1}) Phi(y_{k+1}) - pi_s Phi(y_{k+1} - c_s)), B = Phi(y_{k+1}) (closed forms);
    - narrow cells: beta = sum_j I_j P_j(y_k) / j!, alpha = sum_j (-1)^{j+1} I'_j P_j(y_{k+1}) / j! with
      P_j(y) = sum_s w_s(y) c_s^j and I_j, I'_j the moments of phi from either end
      (``narrow_moments``): all terms of beta positive, alpha's alternate and decrease (c h <= 2);
    - other cells: B and each component's mass M_s = Phi(y_{k+1} - c_s) - Phi(y_k - c_s) on the tail
      side (``interval_mass``), beta = sum_s (pi_s M_s - w_s(y_k) B), alpha = sum_s (w_s(y_{k+1}) B -
      pi_s M_s), whose cancellation is at most ~1 / (c_s h) (these cells are wide).
    Cells between two thresholds at -inf are empty.
    """
    lo, hi = y[:-1], y[1:]
    cells = lo.size
    beta, alpha, q_mass = np.zeros(cells), np.zeros(cells), np.zeros(cells)
    err_b, err_a, err_q = np.zeros(cells), np.zeros(cells), np.zeros(cells)
    weights = np.exp(mix.log_w)
    jump = np.isneginf(lo) & np.isfinite(hi)
    finite = np.isfinite(lo)
    width = np.where(finite, hi - lo, np.inf)
    c_max = float(mix.c.max())
    if jump.any():
        k = np.flatnonzero(jump)
        q, eq = interval_mass(np.full(k.size, -np.inf), hi[k])
        m, em = interval_mass(np.full((k.size, mix.c.size), -np.inf), hi[k, None] - mix.c[None, :])
        w_top = terms.w[k + 1]
        beta[k] = _row_dot(m, weights)
        err_b[k] = _row_dot(em, weights) + (mix.c.size + 2) * _ULP * beta[k]
        alpha[k] = (w_top * q[:, None] - weights * m).sum(axis=1)
        size = (w_top * q[:, None]).sum(axis=1) + _row_dot(m, weights)
        err_a[k] = (w_top * eq[:, None]).sum(axis=1) + _row_dot(em, weights)
        err_a[k] += (terms.w_error[k + 1] + (mix.c.size + 4) * _ULP) * size
        q_mass[k], err_q[k] = q, eq
    candidate = finite & (c_max * width <= SERIES_MAX_CH)
    spread = width * (np.maximum(np.abs(lo), np.abs(hi)) + width)
    candidate &= spread <= 2.0
    series = np.zeros(cells, dtype=bool)
    # Narrow cells need few terms: the bulk is done with the orders and terms its widest cell needs,
    # the few wider ones (near the grid's ends) separately.
    easy = candidate & (c_max * width <= EASY_CELL) & (spread <= EASY_CELL)
    for group in (easy, candidate & ~easy):
        if group.any():
            k = np.flatnonzero(group)
            values = _series_numerators(mix, terms, lo[k], hi[k], width[k], k)
            series[k] = values[0]  # the others are overwritten by the closed-form route below
            beta[k], alpha[k], q_mass[k], err_b[k], err_a[k], err_q[k] = values[1:]
    rest = finite & ~series
    if rest.any():
        k = np.flatnonzero(rest)
        q, eq = interval_mass(lo[k], hi[k])
        m, em = interval_mass(lo[k, None] - mix.c[None, :], hi[k, None] - mix.c[None, :])
        w_lo, w_hi = terms.w[k], terms.w[k + 1]
        p_part = _row_dot(m, weights)
        beta[k] = p_part - w_lo.sum(axis=1) * q
        alpha[k] = w_hi.sum(axis=1) * q - p_part
        common = _row_dot(em, weights) + (mix.c.size + 4) * _ULP * p_part
        err_b[k] = common + w_lo.sum(axis=1) * (eq + (terms.w_error[k] + 4 * _ULP) * q)
        err_a[k] = common + w_hi.sum(axis=1) * (eq + (terms.w_error[k + 1] + 4 * _ULP) * q)
        q_mass[k], err_q[k] = q, eq
    return beta, alpha, q_mass, err_b, err_a, err_q


def _series_numerators(
    mix: _Mixture, terms: _ThresholdTerms, lo: np.ndarray, hi: np.ndarray, width: np.ndarray, k: np.ndarray
) -> tuple[np.ndarray, ...]:
    """The series route of ``_cell_numerators`` for cells k (between thresholds lo = y_k and hi =
    y_{k+1}): whether each is accurate enough, then beta, alpha, B and their error bounds."""
    c_max = float(mix.c.max())
    order = _series_order(c_max * float(width.max()))
    # both ends in one call: the forward moments from y_k, the backward ones from y_{k+1}
    directions = np.concatenate([np.ones(k.size), -np.ones(k.size)])
    both, err_both = narrow_moments(np.concatenate([lo, hi]), np.tile(width, 2), directions, order)
    forward, backward = both[: k.size], both[k.size :]
    err_forward, err_backward = err_both[: k.size], err_both[k.size :]
    good = np.all(err_forward <= SERIES_ACCURACY * forward, axis=1)
    good &= np.all(err_backward <= SERIES_ACCURACY * backward, axis=1)
    j = np.arange(1, order + 1)
    inverse_factorial = np.exp(-special.gammaln(j + 1.0))
    coefficients = mix.c[:, None] ** j[None, :] * inverse_factorial  # c_s^j / j!
    p_lo = np.einsum("ns,sj->nj", terms.w[k], coefficients)  # P_j(y_k) / j!
    p_hi = np.einsum("ns,sj->nj", terms.w[k + 1], coefficients)
    signed = backward[:, 1:] * np.where(j % 2 == 1, 1.0, -1.0)
    beta = _row_sums(forward[:, 1:], p_lo)
    alpha = _row_sums(signed, p_hi)
    x = c_max * width
    cut = x**order * np.exp(x) * inverse_factorial[-1] / (order + 1)  # x^J e^x / (J + 1)!
    rounding = (order + mix.c.size + 4) * _ULP
    err_b = _row_sums(err_forward[:, 1:], p_lo) + (rounding + terms.w_error[k]) * beta
    err_b += forward[:, 1] * p_lo[:, 0] * cut
    size = _row_sums(backward[:, 1:], p_hi)  # sum of the |terms| of alpha
    err_a = _row_sums(err_backward[:, 1:], p_hi) + (rounding + terms.w_error[k + 1]) * size
    err_a += backward[:, 1] * p_hi[:, 0] * cut
    return good, beta, alpha, forward[:, 0], err_b, err_a, err_forward[:, 0]


def _row_sums(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_j a_ij b_ij per row, without a temporary."""
    return np.einsum("ij,ij->i", a, b)


def _p_tail(mix: _Mixture, y: float, upper: bool) -> tuple[float, float]:
    """P(Y > y) (upper) or P(Y < y) and an error bound: sums of positive ``interval_mass`` terms."""
    if not np.isfinite(y):
        return (1.0, 0.0) if (upper and y < 0) else (0.0, 0.0)
    shifts = np.concatenate([[0.0], mix.c])
    weights = np.concatenate([[mix.pi0], np.exp(mix.log_w)])
    ends = y - shifts
    if upper:
        mass, error = interval_mass(ends, np.full(ends.size, np.inf))
    else:
        mass, error = interval_mass(np.full(ends.size, -np.inf), ends)
    value = float(np.dot(mass, weights))
    return value, float(np.dot(error, weights)) + (ends.size + 2) * _ULP * value
