"""The standard normal law on intervals: masses and moments, each with an error bound relative to itself.

The one-step privacy-loss PMF (``connect_dots``) is built from integrals of phi over grid cells. As
differences of Phi they carry an error of a few ulp of Phi itself: a large relative error on a narrow
cell, which the connect-the-dots formulas then divide by the loss grid step d (1e-7 and below at large
sigma). That put extra mass on every cell, so bounds grew with sigma and calibrated sigmas 17x too
large (issue 22). Here:

- ``interval_mass``: Phi(b) - Phi(a) on the tail side (both >= 0: survival functions; both <= 0:
  cdfs; across 0: erf(b / sqrt 2) - erf(a / sqrt 2), two terms of one sign): exact in real arithmetic,
  with a bound on the rounding of each operand (``ndtr_error``).
- ``narrow_moments``: I_j = int_0^h t^j phi(x + s t) dt (s = +-1) for j = 0..J from the Taylor series
  of exp(z t - t^2 / 2) = sum_n He_n(z) t^n / n! (z = -s x), summed to N terms, with a Cauchy bound on
  the terms left out and a bound on the rounding: relative accuracy ~1e-14 however narrow the cell.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

ULP = float(np.finfo(np.float64).eps)
#: Absolute error allowed on every value: below ~1e-290 products and exponentials go subnormal and
#: lose relative precision; 1e-300 per mass is far below anything a bound can resolve.
SUBNORMAL = 1e-300
#: Most terms of the Taylor series in ``narrow_moments``, and the relative size of what it leaves out.
MAX_SERIES_TERMS = 32
SERIES_TAIL = 1e-15
#: Radii tried for the Cauchy bound on the series' tail: h / theta.
_THETAS = (0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def ndtr_error(x: np.ndarray) -> np.ndarray:
    """Bound on |ndtr(x) - Phi(x)| / Phi(x), in units of the value: (8 + x^2) ulp for x < 0 (scipy's
    ndtr rounds x / sqrt 2 first, and erfc's relative error grows like 2 z^2 ulp with its argument;
    measured against mpmath at 40 digits: 10 ulp at -3, 70 at -10, 270 at -20, 990 at -37, tests), 8 ulp
    for x >= 0 (measured < 1)."""
    x = np.asarray(x, dtype=np.float64)
    return (8.0 + np.where(x < 0, x * x, 0.0)) * ULP


def phi_error(x: np.ndarray) -> np.ndarray:
    """Bound on the relative error of exp(-x^2 / 2) / sqrt(2 pi) in floating point: (2 + x^2) ulp
    (x^2 is rounded, and exp turns an absolute error of its argument into a relative one)."""
    x = np.asarray(x, dtype=np.float64)
    return (2.0 + x * x) * ULP


def log_phi(x: np.ndarray) -> np.ndarray:
    return -0.5 * np.asarray(x, dtype=np.float64) ** 2 - _LOG_SQRT_2PI


def interval_mass(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Phi(b) - Phi(a) for a <= b (a may be -inf, b +inf) and a bound on its absolute error.

    The operands are taken on the side where both are small: survival functions right of 0, cdfs left
    of it, and across 0 the two halves (erf(b / sqrt 2) >= 0 and -erf(a / sqrt 2) >= 0, erf accurate
    to ~1 ulp there: measured 1.3). The error is the operands' (``ndtr_error``) plus the subtraction's
    ulp, doubled.
    """
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    out = np.empty(a.shape)
    err = np.empty(a.shape)
    right = a >= 0
    left = ~right & (b <= 0)
    across = ~right & ~left
    sa, sb = special.ndtr(-a[right]), special.ndtr(-b[right])
    out[right] = sa - sb
    err[right] = _operand_error(-a[right], sa) + _operand_error(-b[right], sb)
    ca, cb = special.ndtr(a[left]), special.ndtr(b[left])
    out[left] = cb - ca
    err[left] = _operand_error(a[left], ca) + _operand_error(b[left], cb)
    ea, eb = special.erf(a[across] / math.sqrt(2.0)), special.erf(b[across] / math.sqrt(2.0))
    out[across] = 0.5 * (eb - ea)
    err[across] = 8.0 * ULP * out[across]
    out = np.maximum(out, 0.0)
    return out, 2.0 * (err + ULP * out) + SUBNORMAL


def _operand_error(x: np.ndarray, value: np.ndarray) -> np.ndarray:
    """ndtr_error(x) * ndtr(x), and 0 at x = -inf (an infinite end contributes an exact 0)."""
    return np.where(value > 0, ndtr_error(np.where(np.isfinite(x), x, 0.0)) * value, 0.0)


def narrow_moments(
    x: np.ndarray, h: np.ndarray, direction: float | np.ndarray, orders: int
) -> tuple[np.ndarray, np.ndarray]:
    """I_j = int_0^h t^j phi(x + direction * t) dt for j = 0..orders (cells x (orders + 1)), and a bound
    on the absolute error of each (inf where the series cannot reach a useful accuracy).

    phi(x + s t) = phi(x) e^{z t - t^2 / 2} with z = -s x, so I_j = phi(x) h^{j+1} S_j with
    S_j = sum_n G_n / (n + j + 1), G_n = He_n(z) h^n / n! (G_{n+1} = (z h G_n - h^2 G_{n-1}) / (n + 1)).
    Tail: |He_n(z) / n!| <= M(r) / r^n for M(r) = max_{|w| = r} |e^{z w - w^2 / 2}| <= e^{|z| r + r^2 / 2}
    (Cauchy), so the terms from N on sum to at most M(r) (h / r)^N / ((N + j + 1)(1 - h / r)), r = h /
    theta; S_j >= e^{-|z| h - h^2 / 2} / (j + 1). Rounding: the recurrence and the sum are dominated by
    the majorant e^{|z| h + h^2 / 2} (coefficients of e^{|z| t + t^2 / 2}), ~2N ulp of it.
    """
    x = np.asarray(x, dtype=np.float64)
    h = np.asarray(h, dtype=np.float64)
    zh, hh = -direction * x * h, h * h
    spread = np.abs(zh) + 0.5 * hh  # |z| h + h^2 / 2
    widest = float(np.max(np.abs(zh), initial=0.0)), float(np.max(hh, initial=0.0))
    count, theta = _series_length(*widest, orders)
    terms = np.empty((count, x.size))  # G_n, one row per n (contiguous recurrence)
    terms[0] = 1.0
    terms[1] = zh
    scratch = np.empty(x.size)
    for n in range(1, count - 1):
        np.multiply(zh, terms[n], out=terms[n + 1])
        np.multiply(hh, terms[n - 1], out=scratch)
        terms[n + 1] -= scratch
        terms[n + 1] *= 1.0 / (n + 1)
    n = np.arange(count)[None, :]
    j = np.arange(orders + 1)[:, None]
    # S_j, orders x cells; einsum, not BLAS: OpenBLAS's threads made this 2x slower (T = 40 bench)
    moments = np.einsum("jn,nc->jc", 1.0 / (n + j + 1.0), terms)
    with np.errstate(over="ignore"):
        tail = np.exp(np.abs(zh) / theta + 0.5 * hh / theta**2) * theta**count / (1.0 - theta)
        # relative to S_j >= e^{-spread} / (j + 1), for the largest j
        growth = np.exp(spread)
        relative = (orders + 1) * (tail * growth + 4.0 * count * ULP * growth * growth)
    relative += phi_error(x) + (orders + 2) * ULP
    scale = np.exp(log_phi(x)) * h
    for row in moments:  # times phi(x) h^{j+1}, by running products
        row *= scale
        scale = scale * h
    relative = np.where(np.isfinite(relative) & np.isfinite(moments[0]), relative, np.inf)
    # the error in the (orders x cells) layout the moments were summed in: contiguous rows, and the
    # same products as relative[:, None] * |moments.T| (both come back transposed, cells x orders)
    error = np.abs(moments)
    error *= relative
    error += SUBNORMAL
    return moments.T, error.T


def _series_length(zh: float, hh: float, orders: int) -> tuple[int, float]:
    """Fewest terms (at least 4, at most MAX_SERIES_TERMS) whose Cauchy tail bound, relative, is below
    SERIES_TAIL for the widest cell (|z| h, h^2 the largest of the call), and the radius ratio theta
    that achieves it; cells it does not reach get a larger error bound and the closed-form route."""
    best, best_theta = MAX_SERIES_TERMS + 1, _THETAS[0]
    spread = zh + 0.5 * hh
    for theta in _THETAS:
        log_prefactor = zh / theta + 0.5 * hh / theta**2 + spread + math.log((orders + 1) / (1.0 - theta))
        need = max(math.ceil((log_prefactor - math.log(SERIES_TAIL)) / -math.log(theta)), 4)
        if need < best:
            best, best_theta = need, theta
    return min(best, MAX_SERIES_TERMS), best_theta
