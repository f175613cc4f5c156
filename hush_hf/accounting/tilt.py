"""Exponentially tilted composition: hockey-stick values far above the bulk of the privacy loss, to a
precision relative to themselves.

The FFT composition's rounding is a fixed fraction of the composed PMF's norm, spread over its whole
window (``composition.rounding_error``); at the losses that set a tiny prior's bound (eps ~ 10-70)
the true masses are far smaller, so that floor, not the mechanism, decided the bound. Tilting by
e^{lambda l} commutes with convolution: the T-fold convolution of m_i e^{lambda l_i} is z_j
e^{lambda L_j}. Composed in the tilted measure (normalised), the rounding is relative to the tilted
masses, and untilting multiplies it by e^{-lambda L_j}: tiny exactly where the true masses are.
lambda is the Chernoff-optimal tilt for the loss eps* where the bound is attained (the tilted mean of
T steps is eps*), as for a saddle-point approximation; any lambda >= 0 gives a valid bound.

Every number is an upper bound: the tilted one-step masses are rounded up, the composition's rounding
error is bounded per entry and untilted with it, the mass the composition's window drops above it is
untilted and added, the window's lower side only holds losses below every eps read here, and the
one-step mass at +infinity composes to 1 - (1 - m_inf)^T as without the tilt.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import signal

from hush_hf.accounting import composition
from hush_hf.accounting.connect_dots import OneStepPmf

#: The tilt is at most this, and at most TILT_RANGE over the one-step loss range (so that every tilt
#: factor stays far inside the floating-point range); losses of 1e-3 need tilts in the 1e4-1e5.
MAX_TILT = 1e6
TILT_RANGE = 600.0
#: The Chernoff truncation of the tilted composition (tilted, normalised mass dropped above the window).
TILTED_TAIL = 1e-30
#: Longest composed window worth a tilted composition (the untilted one is at most ~T times the
#: one-step grid's width in steps of the loss scale; a tilt that lands far from it is not worth 64 MB).
MAX_WINDOW = 1 << 23
_POOLS = 2048
_CANDIDATES = 97


def tilt_for(losses: np.ndarray, masses: np.ndarray, steps: int, target: float) -> float:
    """The lambda >= 0 that minimises T log M(lambda) - lambda eps*, M(lambda) = sum_i m_i e^{lambda l_i}
    (the Chernoff exponent of the tilted composition's rounding, untilted at ``target`` = eps*; its
    minimum is where the tilted mean of T steps is eps*); 0 when no tilt helps.

    Only a good choice is needed (every lambda gives a valid bound): the masses are pooled into at most
    _POOLS cells at their mass-weighted mean loss, and _CANDIDATES log-spaced tilts compared at once,
    then as many between the best's neighbours.
    """
    keep = np.flatnonzero(masses > 0)
    if keep.size < 2:
        return 0.0
    loss, mass = losses[keep], masses[keep]
    if loss.size > _POOLS:
        starts = np.arange(0, loss.size, -(-loss.size // _POOLS))
        pooled = np.add.reduceat(mass, starts)
        loss, mass = np.add.reduceat(mass * loss, starts) / pooled, pooled
    top = min(MAX_TILT, TILT_RANGE / max(float(losses[keep[-1]] - losses[keep[0]]), 1e-300))
    log_mass = np.log(mass)

    def exponent(lams: np.ndarray) -> np.ndarray:  # T log M(lambda) - lambda eps*
        w = log_mass[None, :] + lams[:, None] * loss[None, :]
        peak = w.max(axis=1)
        log_m = peak + np.log(np.exp(w - peak[:, None]).sum(axis=1))
        return steps * log_m - lams * target

    lams = np.concatenate([[0.0], top * np.geomspace(1e-12, 1.0, _CANDIDATES)])
    values = exponent(lams)
    i = int(np.argmin(values))
    if i == 0:
        return 0.0
    finer = np.linspace(lams[i - 1], lams[min(i + 1, lams.size - 1)], _CANDIDATES // 4)
    return float(finer[int(np.argmin(exponent(finer)))])


def tilted_increments(
    one: OneStepPmf, steps: int, lam: float
) -> tuple[int, np.ndarray, float, np.ndarray] | None:
    """delta_T on the loss grid from the T-fold composition of the one-step PMF ``one`` tilted by
    ``lam`` (see the module docstring), as (lower, v, floor, extra) of a ``ComposedHockeyStick``: the
    untilted masses' increments, the mass at +infinity (and the untilted mass above the window) as
    the floor, and the untilted rounding bound summed above each grid point as ``extra``. None when
    the tilted composition's window would exceed MAX_WINDOW points."""
    k_lo, step, masses, infinity = one.k_lo, one.step, one.masses, one.infinity
    losses = (k_lo + np.arange(masses.size)) * step
    positive = masses > 0
    log_masses = np.log(np.where(positive, masses, 1.0))
    log_tilted = np.where(positive, log_masses + lam * losses, -np.inf)
    peak = float(log_tilted.max())
    tilted = np.exp(log_tilted - peak)
    total = float(tilted.sum())
    tilted /= total
    shift = peak + math.log(total)
    # each exponent log m_i + lam l_i - peak - log total is rounded against terms of at most this size,
    # an ulp of each; exp and the division add two more: rounded up by that, the masses are upper bounds
    size = float(np.max(np.abs(log_masses[positive]) + lam * np.abs(losses[positive]))) + abs(peak)
    tilted *= 1.0 + 4.0 * composition.ROUNDING_UNIT * (size + abs(math.log(total)) + 2.0)
    lower, upper = composition.truncation_bounds(tilted, steps, TILTED_TAIL)
    if upper - lower + 1 > MAX_WINDOW:  # the tilted law sits far from the untilted one: not worth it
        return None
    composed = composition.self_compose(tilted, 0.0, steps, TILTED_TAIL)
    lower = k_lo * steps + composed.lower
    big_l = (lower + np.arange(composed.probs.size)) * step
    # z_j = z~_j e^{T shift - lam L_j}: the untilt, rounded up by its own rounding
    log_untilt = steps * shift - lam * big_l
    untilt_error = 4.0 * composition.ROUNDING_UNIT * (np.abs(log_untilt) + steps * abs(shift) + 2.0)
    with np.errstate(over="ignore"):
        untilt = np.exp(log_untilt) * (1.0 + untilt_error)
    with np.errstate(invalid="ignore"):  # 0 * inf where the untilt overflows: those are no bound
        z = np.where(np.isfinite(untilt), np.maximum(composed.probs, 0.0) * untilt, np.inf)
    # above the window: tilted mass <= TILTED_TAIL, untilted by the factor at the window's top
    floor = composition.at_infinity(infinity, steps) + TILTED_TAIL * float(untilt[-1])
    # the composition's rounding e_j, untilted and summed over the entries above each point: at most
    # C sum_{j>k} u_j (per-entry bound C) and ||e||_2 sqrt(sum_{j>k} u_j^2) (Cauchy-Schwarz)
    with np.errstate(over="ignore", invalid="ignore"):
        above = np.concatenate([np.cumsum(untilt[::-1])[::-1][1:], [0.0]])
        above_sq = np.concatenate([np.cumsum((untilt * untilt)[::-1])[::-1][1:], [0.0]])
        extra = np.minimum(composed.entry_error * above, composed.l2_error * np.sqrt(above_sq))
    backwards = np.zeros(z.size)
    backwards[1:] = z[:0:-1]
    v = signal.lfilter([1.0], [1.0, -math.exp(-step)], backwards)[::-1]
    return lower, v, floor, np.where(np.isnan(extra), np.inf, extra)
