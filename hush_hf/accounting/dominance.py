"""Certifying many secrets with one computation: stochastic dominance of the count S.

Lemma (monotonicity under first-order stochastic dominance). Let S' >=_st S (P(S' >= k) >=
P(S >= k) for all k), P = E_S N(S, sigma^2), P' = E_S' N(S', sigma^2), Q = N(0, sigma^2). Then
for every T >= 1 and every gamma >= 0, H_gamma(P'^T || Q^T) >= H_gamma(P^T || Q^T).

Proof. dP/dQ(x) = E_S[exp((S x - S^2 / 2) / sigma^2)] is increasing in x (each term is, for
S >= 0), so the likelihood ratio of the products, prod_k dP/dQ(x_k), is coordinate-wise
increasing, and the optimal event U = {prod_k dP/dQ(x_k) > gamma} of
H_gamma(P^T||Q^T) = sup_E P^T(E) - gamma Q^T(E) is an upper set of R^T. On R, P' >=_st P:
P(X > t) = E_S[Phi_bar((t - S) / sigma)] is an expectation of a function increasing in S. Products
of stochastically larger laws give upper sets more mass (couple coordinate-wise: X'_k >= X_k, so
X in U implies X' in U). Hence H_gamma(P'^T||Q^T) >= P'^T(U) - gamma Q^T(U) >= P^T(U) - gamma Q^T(U)
= H_gamma(P^T||Q^T). []

Consequences used here. (i) The blow-up function B(p) = min_gamma [gamma p + H_gamma] is
monotone, so a bound computed for S' holds for S (``tight``). (ii) H_gamma for all gamma >= 0
determines every f-divergence: D_f(P||Q) = int_1^inf f''(g) H_g dg + int_0^1 f''(g) (H_g - 1 + g) dg
for convex f with f(1) = f'(1) = 0, so KL and E_Q[L^alpha] are monotone as well (``kl``, ``rdp``).
(iii) Adding noise is post-processing, so every bound is also monotone in sigma: a certificate at
sigma stays valid at any larger sigma.

Dominating laws used to certify a set of secrets at once:
- the envelope of a set of secrets, survival function = pointwise max of theirs (``counts.envelope``);
- min(Poisson(Lambda), N) with Lambda = -sum log(1 - rho_i) and N >= |D_j|
  (``counts.poisson_dominating_rate``), rounded up on a geometric grid so that few laws cover all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hush_hf.accounting.counts import (
    CountDistributions,
    truncated_poisson,
    truncation_points,
)


@dataclass(frozen=True)
class Cover:
    """Dominating laws (one row each) and, for every covered secret, the row that dominates it."""

    laws: CountDistributions
    row_of: np.ndarray  # aligned with the secrets passed in; -1 when not covered


def poisson_cover(rates: np.ndarray, sizes: np.ndarray, ratio: float) -> Cover:
    """Cover each secret by min(Poisson(Lambda_up), N_up), Lambda rounded up to powers of ``ratio``.

    N_up is the size |D_j| rounded up to a power of two. Secrets with infinite Lambda (some rho = 1)
    are not covered.
    """
    rates = np.asarray(rates, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.float64)
    finite = np.isfinite(rates) & (rates > 0)
    row_of = np.full(rates.size, -1, dtype=np.int64)
    if not finite.any():
        empty = CountDistributions(np.zeros((0, 1)), np.zeros(0), np.zeros(0), np.zeros(0))
        return Cover(empty, row_of)
    exponent = np.ceil(np.log(rates[finite]) / np.log(ratio) - 1e-12)
    rate_up = ratio**exponent
    rate_up = np.where(rate_up < rates[finite], rate_up * ratio, rate_up)  # guard rounding
    size_exponent = np.ceil(np.log2(np.maximum(sizes[finite], 1.0)))
    keys = (exponent - exponent.min()) * 64 + size_exponent  # size exponents are < 64
    unique, inverse = np.unique(keys, return_inverse=True)
    law_rate = np.zeros(unique.size)
    np.maximum.at(law_rate, inverse, rate_up)
    law_size = 2.0 ** (unique % 64)
    k_max = max(int(truncation_points(law_rate, law_size).max()), 1)
    row_of[np.flatnonzero(finite)] = inverse.ravel()
    return Cover(truncated_poisson(law_rate, law_size, k_max), row_of)


def envelope_cover(dists: CountDistributions, resolution: float) -> Cover:
    """Group rows whose laws are close and cover each group by its envelope.

    Rows are binned on (log E[S], log P(S >= 1)) with relative width ``resolution``; within a bin the
    envelope's mean exceeds each member's by about ``resolution`` of it. (The envelope's support is
    the largest member's; it only matters to ``rdp`` at high orders.) ``resolution = 0`` groups
    only rows whose survival functions agree to 1e-10 (relative): identical laws up to rounding.
    """
    survival = dists.survival()
    mean = survival[:, 1:].sum(axis=1)
    first = survival[:, 1]
    if resolution > 0:
        width = np.log1p(resolution)
        mean_bin = np.floor(np.log(np.maximum(mean, 1e-300)) / width)
        first_bin = np.floor(np.log(np.maximum(first, 1e-300)) / width)
        first_bin -= first_bin.min()
        keys = (mean_bin - mean_bin.min()) * (first_bin.max() + 1) + first_bin
        _, inverse = np.unique(keys, return_inverse=True)
    else:
        log_survival = np.log(np.maximum(survival[:, 1:], 1e-300))
        keys = np.concatenate([np.round(log_survival, 10), dists.support[:, None]], axis=1)
        _, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(inverse[order]) != 0])
    envelope_survival = np.maximum.reduceat(survival[order], starts, axis=0)
    envelope_survival[:, 0] = 1.0
    pmf = envelope_survival[:, :-1] - envelope_survival[:, 1:]
    laws = CountDistributions(
        pmf,
        envelope_survival[:, -1],
        np.maximum.reduceat(dists.tail_rate[order], starts),
        np.maximum.reduceat(dists.support[order], starts),
        np.maximum.reduceat(dists.tail_trials[order], starts),
    )
    return Cover(laws, inverse)
