"""The ``tight`` accountant: the blow-up function of Hayes, Balle & Mahloujifar (2023).

For the reconstruction game of Hush Definition 3.1, the success probability of any attacker
against a secret with prior p is at most B_{P,Q}(p) = max{P(E) : Q(E) <= p} (Hayes et al.,
Thm 2), with (P, Q) a dominating pair of the training run: here the T-fold product of
P = sum_s Pr[S=s] N(s, sigma^2) against Q = N(0, sigma^2) (Hush Sec. 4). For every eps,

    B_{P,Q}(p) <= e^eps p + H_{e^eps}(P || Q),      H_gamma(P||Q) = sup_E P(E) - gamma Q(E),

because P(E) - e^eps Q(E) <= H for every event E and Q(E) <= p. So min_eps [e^eps p + delta_T(eps)]
is a valid bound for any delta_T(eps) >= H_{e^eps}(P^T || Q^T), and it is tight when delta_T is
exact. delta_T comes from a PESSIMISTIC privacy loss distribution (dp_accounting): its
connect-the-dots discretisation (Doroshenko et al. 2022) over-estimates the hockey-stick
divergence at every eps, and the T-fold composition of dominating PLDs dominates the composition
(the PLD of a product pair is the convolution of the PLDs; truncated tails go to +infinity).
P is the mixture, so this is dp_accounting's REMOVE direction (mu_upper = the mixture,
mu_lower = the Gaussian); the reference Q is independent of the secret.

What is computed here rather than by ``from_mixture_gaussian_mechanism``: the one-step PMF. The
library inverts the privacy loss with one scalar bisection per eps (0.3-0.8 s per PLD) and derives
connect-the-dots masses from second differences of hockey-stick values, which loses the digits that
rarely sampled secrets need. ``connect_dots.one_step_pmf`` builds the same masses from exact cell
masses of P and Q, each an upper bound by construction (the jump of the loss at log P(S=0)
included); the library composes them (``self_compose``). delta_T and the minimum over eps are read
from the composed PMF with non-negative sums only.

KL or exponential moments are never read off the PLD (unstable at this scale, Hush Sec. 5.1).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np
from scipy import signal

from hush_hf.accounting.composition import self_compose
from hush_hf.accounting.connect_dots import (
    MAX_LOSS,
    LossRange,
    OneStepPmf,
    UnresolvedLoss,
    loss_range,
    one_step_pmf,
)
from hush_hf.accounting.counts import CountDistributions
from hush_hf.accounting.mixture import conditional_pmf
from hush_hf.accounting.renyi import rdp_bounds
from hush_hf.accounting.threads import map_in_threads
from hush_hf.accounting.tilt import tilt_for, tilted_increments

#: Width of the privacy-loss grid, relative to the one-step loss scale E[S] / sigma (the standard
#: deviation of the privacy loss when it is nearly Gaussian). Connect-the-dots is exact at the grid
#: points; its pessimism after composition grows like (d / scale)^2, so a fixed ratio keeps it
#: level across T and sigma: halving it moves a calibrated sigma by < 3e-5 (relative) at T = 2000
#: and 20000 (tests). At the reference point (E[S] / sigma = 0.067) d = 1e-3.
LOSS_GRID_SCALE = 0.015
MAX_LOSS_GRID_STEP = 5e-2
#: Cost cap: the grid is widened until the one-step loss range fits in this many points. Where that
#: binds (rarely sampled secrets: E[S] << 1, loss range ~ c^2) the bound stays rigorous, only less tight.
MAX_ONE_STEP_POINTS = 1 << 15
#: Bounds may grow by the factor 1 + e^-LOSS_CUT_MARGIN where the loss grid stops (``relevant_loss_cap``).
LOSS_CUT_MARGIN = 25.0
#: Mass the library may truncate when composing; it is moved to +infinity (pessimistic).
COMPOSITION_TAIL_MASS = 1e-15
_SEARCH_WINDOW = 16
#: Up to this many distinct priors per law, each gets its own bisection (``ComposedHockeyStick.blowup``).
_SCALAR_SEARCHES = 32
#: Priors below this also get the Renyi bound; bounds of which the rounding allowance and the truncated
#: mass cost more than FLOOR_SHARE are composed again, tilted (see ``tight_bounds``).
PLD_FLOOR_PRIOR = 1e-12
FLOOR_SHARE = 1e-3
#: The one-step loss scale E[S] / sigma is never evaluated below this: at a larger sigma the bound at
#: sigma = E[S] / MIN_LOSS_SCALE is returned, valid because N(s, sigma'^2) is N(s, sigma^2) plus
#: independent noise for sigma' > sigma (post-processing), so the blow-up function only falls with
#: sigma. Below it the loss grid's indices outgrow int64 (sigma >= 1e40 raised OverflowError) and
#: the grid no longer resolves the loss (sigma = 1e20 returned the noiseless bound).
MIN_LOSS_SCALE = 1e-12


def loss_grid_step(pi: np.ndarray, sigma: float, span: LossRange | None = None) -> float:
    """Privacy-loss grid width for S ~ ``pi`` at noise ``sigma`` (see LOSS_GRID_SCALE); ``span``: the
    law's loss range when the caller already has it."""
    scale = float(pi @ np.arange(pi.size)) / sigma
    span = loss_range(pi, sigma) if span is None else span
    return max(min(LOSS_GRID_SCALE * scale, MAX_LOSS_GRID_STEP), (span.high - span.low) / MAX_ONE_STEP_POINTS)


@dataclass(frozen=True)
class ComposedHockeyStick:
    """delta_T(eps_k) >= H_{exp(eps_k)}(P^T || Q^T) on the loss grid eps_k = (lower + k) d, k < n.

    Stored as its increments: delta_k = floor + (1 - e^{-d}) sum_{i >= k} v_i (+ extra_k), with
    v_k = sum_{i > k} p_i e^{-(i - k - 1) d} >= 0 (``_hockey_stick_from_pmf``), ``floor`` the mass
    at +infinity plus the FFT rounding allowance, and ``extra`` (optional, non-increasing in k) an
    allowance that depends on the loss (the tilted composition's, ``tilt``). ``losses``/``deltas``
    list the usable grid (|eps| < 700, where e^eps is finite); ``blowup`` reads only the few deltas
    it needs.
    """

    lower: int
    step: float
    v: np.ndarray
    floor: float
    extra: np.ndarray | None = None

    @property
    def _usable(self) -> tuple[int, int]:
        """Index range [a, b) of the grid with |eps_k| < MAX_LOSS (eps_k is non-decreasing in k)."""
        grid = range(self.v.size)

        def loss(k: int) -> float:
            return (self.lower + k) * self.step

        a = bisect.bisect_right(grid, -MAX_LOSS, key=loss)
        return a, max(a, bisect.bisect_left(grid, MAX_LOSS, key=loss))

    @property
    def losses(self) -> np.ndarray:
        a, b = self._usable
        return (self.lower + np.arange(a, b)) * self.step

    @property
    def deltas(self) -> np.ndarray:
        a, b = self._usable
        return self._all_deltas()[a:b]

    def _all_deltas(self) -> np.ndarray:
        """delta_k for every k of the grid (suffix sums of v)."""
        deltas = self.floor + -math.expm1(-self.step) * np.cumsum(self.v[::-1])[::-1]
        return deltas if self.extra is None else deltas + self.extra

    def blowup(self, priors: np.ndarray) -> np.ndarray:
        """min_k [exp(eps_k) p + delta_T(eps_k)], capped at 1, for every prior p.

        f_k = e^{eps_k} p + delta_k has f_{k+1} - f_k = e^{eps_k} (e^d - 1) (p - s_k) with
        s_k = v_k e^{-eps_{k+1}} = sum_{i > k} p_i e^{-eps_i}, non-increasing in k: f is smallest at
        the first k with s_k <= p, and the neighbours are checked too, against rounding. With
        ``extra``, s_k gains (extra_k - extra_{k+1}) e^{-eps_k} / (e^d - 1), also non-increasing where
        extra's drops fall faster than e^{eps} grows (the tilted rounding: like e^{-lam L}, lam > 1).
        Any index gives a valid bound. A few distinct priors: a bisection on s each (~log2 n scalar
        reads); many: s and delta on the whole grid, then one binary search per prior.
        """
        priors = np.asarray(priors, dtype=np.float64)
        a, b = self._usable
        if b == a:  # all mass beyond the loss grid (tiny sigma): only the trivial bound holds
            return np.ones_like(priors)
        unique, inverse = np.unique(priors, return_inverse=True)
        search = self._few_priors if unique.size <= _SCALAR_SEARCHES else self._many_priors
        return np.minimum(search(unique, a, b), 1.0)[inverse.ravel()]

    def optimal_loss(self, prior: float) -> float:
        """eps_k at the first k with s_k <= p: where min_k [e^{eps_k} p + delta_k] is attained."""
        a, b = self._usable
        if b - a < 2:
            return 0.0
        return (self.lower + self._first_index(prior, a, b)) * self.step

    def _slope(self, k: int) -> float:
        """s_k = v_k e^{-eps_{k+1}}, plus (extra_k - extra_{k+1}) e^{-eps_k} / (e^d - 1) with ``extra``."""
        s_k = float(self.v[k]) * math.exp(-(self.lower + k + 1) * self.step)
        if self.extra is None:
            return s_k
        drop = float(self.extra[k]) - float(self.extra[k + 1])
        if not math.isfinite(drop):
            return math.inf
        return s_k + drop * math.exp(-(self.lower + k) * self.step) / math.expm1(self.step)

    def _drop(self, k: np.ndarray) -> np.ndarray | float:
        """The ``extra`` part of ``_slope`` on an index array (0 without it)."""
        if self.extra is None:
            return 0.0
        with np.errstate(invalid="ignore", over="ignore"):
            drop = (self.extra[k] - self.extra[k + 1]) * np.exp(-(self.lower + k) * self.step)
            return np.nan_to_num(drop / math.expm1(self.step), nan=np.inf)

    def _first_index(self, prior: float, a: int, b: int) -> int:
        """The first k in [a, b - 1) with slope_k <= p, else b - 1 (a bisection: slope decreases)."""
        return bisect.bisect_left(range(a, b - 1), -prior, key=lambda k: -self._slope(k)) + a

    def _few_priors(self, priors: np.ndarray, a: int, b: int) -> np.ndarray:
        v, lower, step = self.v, self.lower, self.step
        best = np.empty(priors.size)
        for i, p in enumerate(priors):
            k = self._first_index(float(p), a, b)
            first, last = max(a, k - _SEARCH_WINDOW), min(b - 1, k + _SEARCH_WINDOW)
            # delta at the window: v summed past it, plus the window's own suffix sums
            suffix = np.cumsum(v[first : last + 1][::-1])[::-1] + float(np.sum(v[last + 1 :]))
            deltas = self.floor + -math.expm1(-step) * suffix
            if self.extra is not None:
                deltas = deltas + self.extra[first : last + 1]
            gamma = np.exp((lower + np.arange(first, last + 1)) * step)
            best[i] = float(np.min(gamma * p + deltas))
        return best

    def _many_priors(self, priors: np.ndarray, a: int, b: int) -> np.ndarray:
        k = np.arange(a, b - 1)
        slope = self.v[k] * np.exp(-(self.lower + k + 1) * self.step) + self._drop(k)
        slope = np.maximum.accumulate(slope[::-1])[::-1]  # non-increasing; rounding smoothed upwards
        first = a + np.searchsorted(-slope, -priors, side="left")
        window = np.arange(-_SEARCH_WINDOW, _SEARCH_WINDOW + 1)
        candidates = np.clip(first[:, None] + window[None, :], a, b - 1)
        gamma = np.exp((self.lower + candidates) * self.step)
        return (gamma * priors[:, None] + self._all_deltas()[candidates]).min(axis=1)


def composed_hockey_stick(
    pi: np.ndarray,
    tail_mass: float,
    sigma: float,
    steps: int,
    step: float | None = None,
    smallest_prior: float | None = None,
) -> ComposedHockeyStick:
    """delta_T on the loss grid for one distribution of S (``pi`` = pmf given S <= K).

    The one-step PMF dominates the exact connect-the-dots PMF point by point (``connect_dots``), so
    its T-fold convolution (``composition``: FFT self-composition, truncated tails sent to +inf)
    over-estimates every hockey-stick value of the T-fold product pair. ``smallest_prior``: the grid
    stops at the loss ``relevant_loss_cap`` for it, the one-step mass above goes to +infinity.

    Raises ``connect_dots.UnresolvedLoss`` at sigma too small for the grid (c_max = K / sigma in the
    thousands); no PMF is built there.
    """
    return _one_step_and_curve(pi, tail_mass, sigma, steps, step, smallest_prior)[1]


def _one_step_and_curve(
    pi: np.ndarray,
    tail_mass: float,
    sigma: float,
    steps: int,
    step: float | None = None,
    smallest_prior: float | None = None,
) -> tuple[OneStepPmf, ComposedHockeyStick]:
    cap = MAX_LOSS if smallest_prior is None else relevant_loss_cap(steps, smallest_prior)
    span = loss_range(pi, sigma, cap)
    step = loss_grid_step(pi, sigma, span) if step is None else step
    one = one_step_pmf(pi, tail_mass, sigma, step, span)
    composed = self_compose(one.masses, one.infinity, steps, COMPOSITION_TAIL_MASS)
    lower = one.k_lo * steps + composed.lower
    curve = _hockey_stick_from_pmf(lower, composed.probs, composed.infinity, step)
    # delta_k sums the entries above k: their rounding is bounded by tail_error(entries above k)
    above = np.arange(composed.probs.size - 1, -1, -1)
    return one, ComposedHockeyStick(curve.lower, step, curve.v, curve.floor, composed.tail_error(above))


def relevant_loss_cap(steps: int, prior: float) -> float:
    """l_cut = log(T / p) + LOSS_CUT_MARGIN: one-step losses above it may go to +infinity.

    Moving the one-step mass at l >= l_cut to +infinity is pessimistic (valid), and it raises
    delta_T(eps) by at most T e^{eps - l_cut} E[e^{-l}]^{T-1} = T e^{eps - l_cut} (a path with such a
    step already counted 1 - e^{eps - L}; connect-the-dots keeps E[e^{-l}] = 1), so every bound
    e^eps p + delta_T(eps) grows by at most the factor 1 + T e^{-l_cut} / p = 1 + e^{-margin}. Rarely
    sampled counts at small sigma have one-step losses in the hundreds; the grid no longer spans
    them (it was capped at MAX_ONE_STEP_POINTS points, which coarsened it instead).
    """
    return math.log(steps) - math.log(prior) + LOSS_CUT_MARGIN


def _hockey_stick_from_pmf(lower: int, probs: np.ndarray, floor: float, step: float) -> ComposedHockeyStick:
    """delta(l_k) = floor + sum_{i>k} p_i (1 - e^{-(i-k) step}) on the PMF's own grid, stably.

    delta_k - delta_{k+1} = (1 - e^{-step}) V_k with V_k = p_{k+1} + e^{-step} V_{k+1}: sums of
    non-negative terms only. ``floor``: the mass at +infinity; the bound on the FFT composition's
    rounding error (``composition.rounding_error``), which covers the entries of order 1e-18 of either
    sign it leaves, is added by the caller; negative entries are set to 0 (adds mass: pessimistic).
    """
    n = probs.size
    if n == 0:
        return ComposedHockeyStick(lower, step, np.zeros(0), floor)
    backwards = np.zeros(n)  # 0, p_{n-1}, ..., p_1 clipped at 0: v_k runs from the top down
    np.maximum(probs[:0:-1], 0.0, out=backwards[1:])
    v = signal.lfilter([1.0], [1.0, -math.exp(-step)], backwards)[::-1]
    return ComposedHockeyStick(lower, step, v, floor)


def dominating_pmf(pi: np.ndarray, support: np.ndarray) -> np.ndarray:
    """``pi`` with every P(S = s), s >= 1, rounded up by 4 (n + K + 4) ulp (n = the support, K + 1 =
    the pmf's width): a law the exact one is stochastically dominated by (``dominance``).

    The pmf's entries carry the rounding of how they were computed (the Poisson-binomial DP: n
    products and sums of non-negative numbers each, <= 2n ulp relative; the division by P(S <= K));
    the one-step PMF reads P(S = 0) as 1 - sum_{s>=1} pi_s (``connect_dots._mixture``), so raising
    each pi_s (s >= 1) by more than its rounding raises every P(S >= k) above the exact value. Its
    allowances are relative, ~1e-14: they would not cover a perturbation of the law itself.
    """
    eta = 4.0 * (np.asarray(support, dtype=np.float64) + pi.shape[1] + 4.0) * np.finfo(np.float64).eps
    out = pi.copy()
    out[:, 1:] *= (1.0 + eta)[:, None]
    return out


def tight_bounds(
    dists: CountDistributions,
    sigma: np.ndarray,
    steps: int,
    priors: np.ndarray,
    rows: np.ndarray,
    targets: np.ndarray | None = None,
    *,
    workers: int = 1,
) -> np.ndarray:
    """Posterior bounds for queries (row, prior) at each row's sigma.

    The PLD cannot resolve what lies below its floor: the truncated composition mass (1e-15), the
    one-step mass at +infinity and the FFT rounding allowance add to every delta_T. Where that floor
    is more than FLOOR_SHARE of a bound, the law is composed again tilted towards the loss where the
    bound is attained (``tilt``: rounding relative to the masses there) and the smaller of the two
    valid bounds kept; with ``targets``, only for laws where that could decide whether a bound meets
    its target (one exceeds it by less than the floor). Below priors of PLD_FLOOR_PRIOR the Renyi
    bound (``renyi``, log space throughout) is evaluated too, so that astronomically small priors
    (long random keys) calibrate at least as well as with ``rdp``. ``workers``: laws evaluated on
    that many threads (``threads``: the same bounds, bitwise, as one).
    """
    priors = np.asarray(priors, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty(priors.size)
    pi = dominating_pmf(conditional_pmf(dists.pmf, dists.tail_mass), dists.support)
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (dists.num_rows,))
    rdp_sigma = sigma
    sigma = np.minimum(sigma, (pi @ np.arange(pi.shape[1])) / MIN_LOSS_SCALE)  # see MIN_LOSS_SCALE
    order = np.argsort(rows, kind="stable")
    bounds = np.searchsorted(rows[order], np.arange(dists.num_rows + 1))
    tasks = [(r, order[bounds[r] : bounds[r + 1]]) for r in range(dists.num_rows)]
    tasks = [(r, queries) for r, queries in tasks if queries.size]

    def law_bounds(task: tuple[int, np.ndarray]) -> np.ndarray:
        r, queries = task
        return _law_bounds(
            pi[r], float(dists.tail_mass[r]), float(sigma[r]), steps, priors[queries],
            None if targets is None else targets[queries],
        )

    for (_, queries), values in zip(tasks, map_in_threads(law_bounds, tasks, workers), strict=True):
        out[queries] = values
    tiny = np.flatnonzero(priors < PLD_FLOOR_PRIOR)
    if tiny.size:
        out[tiny] = np.minimum(out[tiny], rdp_bounds(dists, rdp_sigma, steps, priors[tiny], rows[tiny]))
    return out


def _law_bounds(
    pi: np.ndarray, tail_mass: float, sigma: float, steps: int, priors: np.ndarray, targets: np.ndarray | None
) -> np.ndarray:
    """``tight_bounds`` for one law (pmf ``pi`` given S <= K, P(S > K) = ``tail_mass``) and its
    queries' priors (and targets), without the Renyi bound of tiny priors."""
    if pi[1:].sum() <= 0 and tail_mass <= 0:
        return priors.copy()
    try:
        one, curve = _one_step_and_curve(pi, tail_mass, sigma, steps, smallest_prior=float(priors.min()))
    except UnresolvedLoss:  # tiny sigma: the trivial bound here, the noiseless one by the caller
        return np.ones(priors.size)
    out = curve.blowup(priors)
    # What the rounding allowance and the truncated mass cost: the same curve without them (not a
    # bound, a yardstick); the tilted composition has neither at the losses that matter.
    bare = ComposedHockeyStick(curve.lower, curve.step, curve.v, 0.0)
    cost = out - bare.blowup(priors)
    # relative to the leakage, not to the bound: with r = 1.001 p a cost of 1e-3 of the bound is
    # the whole margin (issue 29: 1.33x the exact sigma at T = 1e2)
    costly = cost > FLOOR_SHARE * (out - priors)
    if targets is not None:  # exactly where a tilted bound may meet a target this one misses
        costly = out > targets
        if costly.any():
            costly[costly] = refinement_floor(curve, priors[costly]) <= targets[costly]
    if costly.any():  # compose again, tilted towards the loss where the costliest bound is attained
        low = float(priors[costly].min())
        lam = tilt_for(one.losses, one.masses, steps, bare.optimal_loss(low))
        increments = tilted_increments(one, steps, lam) if lam > 0 else None
        if increments is not None:
            lower, v, tilted_floor, extra = increments
            tilted = ComposedHockeyStick(lower, one.step, v, tilted_floor, extra)
            out = np.minimum(out, tilted.blowup(priors))
    return out


def refinement_floor(curve: ComposedHockeyStick, priors: np.ndarray) -> np.ndarray:
    """A lower bound on every bound a refinement of ``curve`` (the tilted composition of the same
    one-step PMF) can give: min_k [e^{eps_k} p + delta_k - extra_k - COMPOSITION_TAIL_MASS] over the
    whole grid with ``curve``'s deltas.

    The exact T-fold composition's delta_k is at least the FFT's (clipped at 0, without the mass at
    +infinity) minus its rounding bound ``extra_k`` and the mass the FFT wrapped into the window
    (<= COMPOSITION_TAIL_MASS); any refinement over-estimates the exact composition. Off the grid
    e^eps p + delta grows (below it: towards 1; above it: e^eps p alone). Used only to skip a
    refinement that cannot meet a target (issue 29: skipping by the FFT bound alone calibrated 1.49x
    the exact sigma at T = 1e6)."""
    a, b = curve._usable
    if b == a:
        return np.zeros_like(priors)
    deltas = -math.expm1(-curve.step) * np.cumsum(curve.v[::-1])[::-1]
    if curve.extra is not None:
        deltas = deltas - curve.extra
    deltas = deltas[a:b] - COMPOSITION_TAIL_MASS
    gamma = np.exp((curve.lower + np.arange(a, b)) * curve.step)
    unique, inverse = np.unique(priors, return_inverse=True)
    return np.array([float(np.min(gamma * p + deltas)) for p in unique])[inverse.ravel()]
