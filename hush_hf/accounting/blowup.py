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

What is computed here rather than by ``from_mixture_gaussian_mechanism``: the one-step
hockey-stick values delta_1(k d) that its connect-the-dots step needs. The library inverts the
privacy loss with one scalar bisection per eps (0.3-0.8 s per PLD, and it always builds the ADD
direction as well); here the threshold y(eps) with L(y) = e^eps is found by vectorised Newton,
and delta_1 = sum_s pi_s Phi_bar(y - c_s) - (e^eps - pi_0) Phi_bar(y) (standard units), the same
formula the library evaluates (tested equal to 1e-15). The library then builds the pessimistic
PMF (``create_pmf_pessimistic_connect_dots_fixed_gap``) and composes it (``self_compose``).
delta_T and the minimum over eps are read from the composed PMF with non-negative sums only.

KL or exponential moments are never read off the PLD (unstable at this scale, Hush Sec. 5.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import pld_pmf
from scipy import signal, special

from hush_hf.accounting.counts import CountDistributions
from hush_hf.accounting.mixture import conditional_pmf

#: Width of the privacy-loss grid, relative to the one-step loss scale E[S] / sigma (the standard
#: deviation of the privacy loss when it is nearly Gaussian). Connect-the-dots is exact at the grid
#: points; its pessimism after composition grows like (d / scale)^2, so a fixed ratio keeps it
#: level across T and sigma: halving it moves a calibrated sigma by < 3e-5 (relative) at T = 2000
#: and 20000 (tests). At the reference point (E[S] / sigma = 0.067) d = 1e-3.
LOSS_GRID_SCALE = 0.015
MAX_LOSS_GRID_STEP = 5e-2
MAX_ONE_STEP_POINTS = 200_000
#: One-step mass beyond the loss grid, sent to +infinity (pessimistic): T times it is negligible.
ONE_STEP_TAIL = 1e-25
MAX_LOSS = 700.0  # exp() overflows beyond
#: Mass the library may truncate when composing; it is moved to +infinity (pessimistic).
COMPOSITION_TAIL_MASS = 1e-15
_NEWTON_TOLERANCE = 1e-12
_MAX_NEWTON = 200
_QUADRATURE_NODES = 4
_DELTA_ALLOWANCE = 1e-12  # relative, covers quadrature and rounding error in the deltas
_SEARCH_WINDOW = 16


def loss_grid_step(pi: np.ndarray, sigma: float) -> float:
    """Privacy-loss grid width for S ~ ``pi`` at noise ``sigma`` (see LOSS_GRID_SCALE)."""
    scale = float(pi @ np.arange(pi.size)) / sigma
    return min(LOSS_GRID_SCALE * scale, MAX_LOSS_GRID_STEP)


@dataclass(frozen=True)
class ComposedHockeyStick:
    """delta_T(eps_k) >= H_{exp(eps_k)}(P^T || Q^T) on the loss grid eps_k (both ascending)."""

    losses: np.ndarray
    deltas: np.ndarray

    def blowup(self, priors: np.ndarray) -> np.ndarray:
        """min_k [exp(eps_k) p + delta_T(eps_k)], capped at 1, for every prior p.

        gamma -> gamma p + H_gamma is convex in gamma, so the best grid index is where the slope
        -(delta_{k+1} - delta_k) / (gamma_{k+1} - gamma_k) falls below p (a binary search); the
        neighbours are checked too. Any index gives a valid bound.
        """
        priors = np.asarray(priors, dtype=np.float64)
        gamma = np.exp(self.losses)
        if gamma.size == 0:  # all mass beyond the loss grid (tiny sigma): only the trivial bound holds
            return np.ones_like(priors)
        if gamma.size < 2:
            return np.minimum(gamma[0] * priors + self.deltas[0], 1.0)
        slope = -np.diff(self.deltas) / np.diff(gamma)
        # Non-increasing in exact arithmetic; rounding noise in the far tails is smoothed upwards.
        slope = np.maximum.accumulate(slope[::-1])[::-1]
        k = np.searchsorted(-slope, -priors, side="left")
        window = np.arange(-_SEARCH_WINDOW, _SEARCH_WINDOW + 1)
        candidates = np.clip(k[:, None] + window[None, :], 0, gamma.size - 1)
        values = gamma[candidates] * priors[:, None] + self.deltas[candidates]
        return np.minimum(values.min(axis=1), 1.0)


def one_step_deltas(
    pi: np.ndarray, tail_mass: float, sigma: float, step: float
) -> tuple[int, np.ndarray, float]:
    """delta_1(k step) for k = k_lo..k_hi: the hockey-stick divergence of one step, pessimistic tail.

    ``pi`` is the pmf of S given S <= K; the mass ``tail_mass`` above K is treated as an infinite
    privacy loss: H(P) <= (1 - tau) H(P') + tau for P = (1 - tau) P' + tau P_tail (convexity).
    The grid spans the losses of all but ONE_STEP_TAIL of P's mass on each side (loss above the
    top goes to +infinity, below the bottom is rounded up to it). ``step`` is enlarged if the grid
    would exceed MAX_ONE_STEP_POINTS. Returns (k_lo, deltas, step).

    Connect-the-dots turns deltas into probabilities by second differences divided by ~step, so
    deltas need a small *relative* error. They are summed from the top:
    delta(eps_i) = delta(eps_top) + sum_{j >= i} int_{eps_j}^{eps_j+1} e^eps Q(L > eps) d eps
    (d delta / d eps = -e^eps Q(L > eps)), each integral by Gauss-Legendre (positive terms, no
    cancellation; relative quadrature error < (step / (2 scale))^8 ~ 1e-17), and
    delta(eps_top) <= P(L > eps_top) (an upper bound).
    """
    counts = np.arange(pi.size, dtype=np.float64)
    pi0 = float(pi[0])
    pos = (pi > 0) & (counts > 0)
    weights, c = pi[pos], counts[pos] / sigma
    log_w = np.log(weights)
    y_hi, y_lo = _tail_point(weights, c, pi0, upper=True), _tail_point(weights, c, pi0, upper=False)
    eps_hi = min(_loss(log_w, c, pi0, y_hi), MAX_LOSS)
    eps_lo = max(_loss(log_w, c, pi0, y_lo), -MAX_LOSS)
    step = max(step, (eps_hi - eps_lo) / MAX_ONE_STEP_POINTS)
    k_lo = math.floor(eps_lo / step) - 1
    k_hi = math.ceil(eps_hi / step) + 1
    eps = np.arange(k_lo, k_hi + 1) * step
    nodes, node_weights = np.polynomial.legendre.leggauss(_QUADRATURE_NODES)
    points = (eps[:-1, None] + 0.5 * step * (1.0 + nodes[None, :])).ravel()
    y = _threshold(log_w, c, pi0, np.append(points, eps[-1]), (y_lo, y_hi))
    survival_q = np.where(np.isfinite(y), special.ndtr(-y), 1.0)  # Q(L > eps) = Q(Y > y(eps))
    integrand = (np.exp(points) * survival_q[:-1]).reshape(-1, nodes.size)
    pieces = 0.5 * step * integrand @ node_weights
    y_top = y[-1]
    top = float(pi0 * special.ndtr(-y_top) + (weights * special.ndtr(c - y_top)).sum())  # P(L > top)
    deltas = top + np.concatenate([np.cumsum(pieces[::-1])[::-1], [0.0]])
    deltas = np.minimum(deltas * (1.0 + _DELTA_ALLOWANCE), 1.0)
    return k_lo, (1.0 - tail_mass) * deltas + tail_mass, step


def _threshold(
    log_w: np.ndarray, c: np.ndarray, pi0: float, eps: np.ndarray, y_range: tuple[float, float]
) -> np.ndarray:
    """y(eps) with L(y) = e^eps in standard units (-inf where eps <= log pi0: every y qualifies).

    Newton starts from an interpolation of m on a coarse grid over ``y_range``.
    """
    y = np.full(eps.size, -np.inf)
    active = eps > math.log(pi0) if pi0 > 0 else np.ones(eps.size, dtype=bool)
    e = eps[active]
    # Solve log sum_{s>=1} pi_s exp(c_s y - c_s^2/2) = log(e^eps - pi0) =: t; convex, increasing.
    t = e + np.log1p(-pi0 * np.exp(-e)) if pi0 > 0 else e
    coarse = np.linspace(y_range[0] - 1.0, y_range[1] + 1.0, 2049)
    start = np.interp(t, _log_sum(log_w, c, coarse), coarse)
    y[active] = _newton_threshold(log_w, c, t, start)
    return y


def _loss(log_w: np.ndarray, c: np.ndarray, pi0: float, y: float) -> float:
    """The privacy loss log L(y) (standard units)."""
    rest = float(_log_sum(log_w, c, y)[0])
    return float(np.logaddexp(math.log(pi0), rest)) if pi0 > 0 else rest


def _tail_point(weights: np.ndarray, c: np.ndarray, pi0: float, upper: bool) -> float:
    """y with P(Y > y) <= ONE_STEP_TAIL (upper) or P(Y < y) <= ONE_STEP_TAIL, by bisection."""
    def mass(y: float) -> float:
        if upper:
            return float(pi0 * special.ndtr(-y) + (weights * special.ndtr(c - y)).sum())
        return float(pi0 * special.ndtr(y) + (weights * special.ndtr(y - c)).sum())

    lo, hi = (0.0, float(c.max()) + 40.0) if upper else (-40.0, float(c.max()))
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        small = mass(mid) <= ONE_STEP_TAIL
        if upper:
            hi, lo = (mid, lo) if small else (hi, mid)
        else:
            lo, hi = (mid, hi) if small else (lo, mid)
    return hi if upper else lo


def _log_sum(log_w: np.ndarray, c: np.ndarray, y: np.ndarray | float) -> np.ndarray:
    y = np.atleast_1d(np.asarray(y, dtype=np.float64))
    a = log_w[None, :] + c[None, :] * y[:, None] - 0.5 * c[None, :] ** 2
    peak = a.max(axis=1)
    return peak + np.log(np.exp(a - peak[:, None]).sum(axis=1))


def _newton_threshold(
    log_w: np.ndarray, c: np.ndarray, target: np.ndarray, start: np.ndarray | None = None
) -> np.ndarray:
    """y with m(y) = target, m(y) = log sum_s w_s exp(c_s y - c_s^2 / 2), by Newton's method.

    m is convex and increasing: from any start the first step lands right of the root and the
    iterates then decrease monotonically to it (the default start, the largest single-term
    inverse, is already right of it). Stops when the step is negligible or m(y) equals the target
    to rounding (an error dy in y changes a hockey-stick value only by O(dy^2)).
    """
    y = np.min((target[:, None] - log_w[None, :] + 0.5 * c[None, :] ** 2) / c[None, :], axis=1)
    if start is not None:
        y = np.minimum(start, y)
    moving = np.arange(y.size)
    rounding = 8 * np.finfo(float).eps * (1.0 + np.abs(target))
    for _ in range(_MAX_NEWTON):
        ym, cm = y[moving], c[None, :]
        a = log_w[None, :] + cm * ym[:, None] - 0.5 * cm**2
        peak = a.max(axis=1)
        e = np.exp(a - peak[:, None])
        total = e.sum(axis=1)
        residual = peak + np.log(total) - target[moving]
        change = residual / ((e * cm).sum(axis=1) / total)
        y[moving] = ym - change
        small_step = np.abs(change) <= _NEWTON_TOLERANCE * (1.0 + np.abs(ym))
        done = small_step | (np.abs(residual) <= rounding[moving])
        moving = moving[~done]
        if moving.size == 0:
            return y
    raise RuntimeError("threshold inversion did not converge")  # pragma: no cover


def composed_hockey_stick(
    pi: np.ndarray, tail_mass: float, sigma: float, steps: int, step: float | None = None
) -> ComposedHockeyStick:
    """delta_T on the loss grid for one distribution of S (``pi`` = pmf given S <= K)."""
    step = loss_grid_step(pi, sigma) if step is None else step
    k_lo, deltas, step = one_step_deltas(pi, tail_mass, sigma, step)
    k_hi = k_lo + deltas.size - 1
    one_step = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(step, k_lo, k_hi, deltas)
    dense = one_step.to_dense_pmf()
    composed = dense.self_compose(steps, COMPOSITION_TAIL_MASS) if steps > 1 else dense
    lower, probs, infinity_mass = _dense_arrays(composed)
    return _hockey_stick_from_pmf(lower, probs, infinity_mass, step, steps)


def _dense_arrays(pmf: pld_pmf.PLDPmf) -> tuple[int, np.ndarray, float]:
    """(lowest loss index, probabilities, mass at +inf) of a dense dp_accounting PMF.

    dp_accounting exposes these only as attributes; its own ``get_delta_for_epsilon`` is a Python
    loop (0.1 s per call at 5e4 points). tests/test_accounting_tight.py checks the values read
    here against ``get_delta_for_epsilon``.
    """
    dense = pmf.to_dense_pmf()
    return int(dense._lower_loss), np.asarray(dense._probs, dtype=np.float64), float(dense._infinity_mass)


def _hockey_stick_from_pmf(
    lower: int, probs: np.ndarray, infinity_mass: float, step: float, steps: int
) -> ComposedHockeyStick:
    """delta(l_k) = inf + sum_{i>k} p_i (1 - e^{-(i-k) step}) on the PMF's own grid, stably.

    delta_k - delta_{k+1} = (1 - e^{-step}) V_k with V_k = p_{k+1} + e^{-step} V_{k+1}: sums of
    non-negative terms only. FFT rounding in the composition can leave entries of order 1e-18 of
    either sign: negative ones are set to 0 (adds mass: pessimistic) and an allowance bounding the
    L1 rounding error of the FFT power (sqrt(n) (T + 10 log2 n) eps ||p||_2, x10) is added.
    """
    probs = np.clip(probs, 0.0, None)
    n = probs.size
    fft_allowance = 10.0 * math.sqrt(n) * (steps + 10.0 * math.log2(n + 1)) * np.finfo(float).eps
    fft_allowance *= float(np.sqrt(np.sum(probs**2)))
    decay = math.exp(-step)
    next_probs = np.append(probs[1:], 0.0)
    v = signal.lfilter([1.0], [1.0, -decay], next_probs[::-1])[::-1]
    increments = -math.expm1(-step) * v
    deltas = np.cumsum(increments[::-1])[::-1] + infinity_mass + fft_allowance
    losses = (lower + np.arange(n)) * step
    keep = np.abs(losses) < 700.0
    return ComposedHockeyStick(losses[keep], deltas[keep])


def noiseless_bounds(rates: np.ndarray, steps: int, priors: np.ndarray) -> np.ndarray:
    """The exact blow-up function at sigma = 0: B(p) = 1 - P(S=0)^T (1 - p).

    Without noise the run reveals (S_1, ..., S_T) and Q is the point mass at 0: the best test of
    level p rejects whenever some S_t > 0 and otherwise with probability p. With P(S=0) >=
    exp(-rate), rate = -sum log(1 - rho_i) (rounded up), this is an upper bound; it holds at
    every sigma >= 0 because noise is post-processing.
    """
    rates = np.asarray(rates, dtype=np.float64)
    keep = np.exp(-steps * rates)
    return np.minimum(-np.expm1(-steps * rates) + keep * np.asarray(priors, dtype=np.float64), 1.0)


def tight_bounds(
    dists: CountDistributions, sigma: np.ndarray, steps: int, priors: np.ndarray, rows: np.ndarray
) -> np.ndarray:
    """Posterior bounds for queries (row, prior) at each row's sigma."""
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (dists.num_rows,))
    priors = np.asarray(priors, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty(priors.size)
    pi = conditional_pmf(dists.pmf, dists.tail_mass)
    order = np.argsort(rows, kind="stable")
    bounds = np.searchsorted(rows[order], np.arange(dists.num_rows + 1))
    for r in range(dists.num_rows):
        queries = order[bounds[r] : bounds[r + 1]]
        if queries.size == 0:
            continue
        if pi[r, 1:].sum() <= 0 and dists.tail_mass[r] <= 0:
            out[queries] = priors[queries]
            continue
        curve = composed_hockey_stick(pi[r], float(dists.tail_mass[r]), float(sigma[r]), steps)
        # The noiseless bound is valid at every sigma and is the tighter one as sigma -> 0.
        rate = -math.log(max(float(dists.pmf[r, 0]), 1e-300)) * (1.0 + 1e-12)
        noiseless = noiseless_bounds(rate, steps, priors[queries])
        out[queries] = np.minimum(curve.blowup(priors[queries]), noiseless)
    return out
