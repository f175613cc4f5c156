"""The sigma = 0 limit of every accountant: the exact blow-up function of the noiseless run.

Without noise the run reveals the counts (S_1, ..., S_T) and Q is the point mass at 0, so the best
test of level p rejects whenever some S_t > 0 and otherwise with probability p (Hayes et al. 2023,
Thm 2, blow-up B(p) = max{P(E) : Q(E) <= p} over randomised tests):

    B_0(p) = 1 - P(S = 0)^T (1 - p),      P(S = 0) = prod_{i in D_j} (1 - rho_i).

It is < 1 whenever P(the secret's examples are ever sampled) = 1 - P(S=0)^T < 1. Noise is
post-processing (Hush Sec. 4: the released mechanism is the noiseless one followed by adding
N(0, sigma^2)), so B_0(p) bounds the posterior at EVERY sigma >= 0, and the exact bound tends to it as
sigma -> 0 (two Gaussians c = 1/sigma apart become separable). Every accountant's bound is therefore
reported as min(its own bound, B_0): valid at each sigma, and its sigma -> 0 limit is B_0 itself.
"""

from __future__ import annotations

import numpy as np

_ULP = float(np.finfo(np.float64).eps)
#: Relative round-up of B_0: exp, expm1, one product and one sum, a few ulp each.
_ROUND_UP = 16 * _ULP


def noiseless_bounds(rates: np.ndarray, steps: int, priors: np.ndarray) -> np.ndarray:
    """B_0(p) = 1 - exp(-T rate) (1 - p), rounded up, for rate >= -log P(S=0) (``rates`` from
    ``counts.poisson_dominating_rate``: -sum log(1 - rho_i), rounded up): an upper bound on B_0,
    since B_0 increases with the rate. Written as (1 - e^{-T rate}) + e^{-T rate} p, two
    non-negative terms, so a bound just above a tiny prior keeps its digits."""
    rates = np.asarray(rates, dtype=np.float64)
    priors = np.asarray(priors, dtype=np.float64)
    exponent = -float(steps) * rates
    value = -np.expm1(exponent) + np.exp(exponent) * priors
    return np.minimum(value * (1.0 + _ROUND_UP), 1.0)
