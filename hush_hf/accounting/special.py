"""Stable kernels of f-divergences around the likelihood ratio 1 (u = L - 1 close to 0).

Both kernels are >= 0 and vanish to second order at u = 0, so direct formulas lose all digits
when |u| is small (per-step divergences are ~1e-6 here); a Taylor series takes over there.
"""

from __future__ import annotations

import numpy as np

_SERIES_TERMS = 10  # |u| < 1e-2: the first omitted term is < 1e-22 relative to u^2 / 2


def kl_kernel(u: np.ndarray) -> np.ndarray:
    """h(u) = (1 + u) log1p(u) - u >= 0 for u >= -1 (KL integrand: KL(P||Q) = E_Q[h(dP/dQ - 1)]).

    Series for |u| < 1e-2: h(u) = sum_{k>=2} (-1)^k u^k / (k (k - 1)).
    """
    u = np.asarray(u, dtype=np.float64)
    small = np.abs(u) < 1e-2
    out = np.empty_like(u)
    us = u[small]
    acc = np.zeros_like(us)
    power = us * us
    for k in range(2, 2 + _SERIES_TERMS):
        acc += (1.0 if k % 2 == 0 else -1.0) * power / (k * (k - 1))
        power = power * us
    out[small] = acc
    ub = u[~small]
    with np.errstate(divide="ignore", invalid="ignore"):
        # (1 + u) log1p(u) written with xlogy-like care at u = -1, where it is 0.
        big = np.where(ub > -1.0, (1.0 + ub) * np.log1p(np.maximum(ub, -1.0 + 1e-300)), 0.0) - ub
    out[~small] = big
    return out


def power_kernel(u: np.ndarray, alpha: np.ndarray | float) -> np.ndarray:
    """g(u) = (1 + u)^alpha - 1 - alpha u >= 0 for alpha > 1 (Renyi integrand, centred).

    E_Q[(dP/dQ)^alpha] = 1 + E_Q[g(dP/dQ - 1)] since E_Q[dP/dQ - 1] = 0.
    Series when |alpha u| < 1e-2: g = sum_{k>=2} binom(alpha, k) u^k.
    """
    u, alpha = np.broadcast_arrays(np.asarray(u, dtype=np.float64), np.asarray(alpha, dtype=np.float64))
    small = np.abs(alpha * u) < 1e-2
    out = np.empty(u.shape)
    us, a = u[small], alpha[small]
    acc = np.zeros_like(us)
    coef = a * (a - 1.0) / 2.0
    power = us * us
    for k in range(2, 2 + _SERIES_TERMS):
        acc += coef * power
        coef = coef * (a - k) / (k + 1)
        power = power * us
    out[small] = acc
    ub, a = u[~small], alpha[~small]
    with np.errstate(over="ignore"):
        out[~small] = np.expm1(a * np.log1p(ub)) - a * ub
    return out
