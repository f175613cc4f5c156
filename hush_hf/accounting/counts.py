"""Distributions of S, the number of a secret's examples in one batch, with rigorous tails.

For secret j, S_j = sum_{i in D_j} Bern(rho_i) (Poisson-binomial; Hush Sec. 4). The accountants
use the pmf on {0, ..., K} and bound what lies above K: every row carries
``tail_mass`` = P(S > K), a ``tail_rate`` lambda and ``tail_trials`` n for the Chernoff bound
P(S >= s) <= exp(-n KL(s/n || lambda/n)) (s > lambda; Hoeffding 1963, Thm 1, for any sum of n
independent Bernoullis with mean lambda), whose n -> inf limit exp(-lambda) (e lambda / s)^s
also holds for Poisson(lambda) (``tail_trials`` = inf), and ``support`` = max S (always finite
here: Renyi divergences of unbounded mixtures are infinite). The bound increases with lambda and
with n, so an envelope of several laws may take the largest of each.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from hush_hf.accounting.budgets import bernoulli_kl
from hush_hf.accounting.groups import SecretGroups

#: P(S > K) allowed to be moved to the worst case: far below any prior or target of interest.
TAIL_MASS_TARGET = 1e-20
_CHUNK_ROWS = 8192
#: Memberships per pass of ``poisson_dominating_rate``.
_CHUNK_ENTRIES = 1 << 18


def chernoff_survival(rate: np.ndarray, s: np.ndarray, trials: np.ndarray | float = np.inf) -> np.ndarray:
    """Upper bound on P(S >= s) for S a sum of ``trials`` Bernoullis (or Poisson) with mean ``rate``."""
    return np.exp(log_chernoff_survival(rate, s, trials))


def log_chernoff_survival(rate: np.ndarray, s: np.ndarray, trials: np.ndarray | float = np.inf) -> np.ndarray:
    """log of ``chernoff_survival``: -n KL(s/n || rate/n) (finite n) or s log(e rate / s) - rate,
    for s > rate; 0 for s <= rate; -inf for s > n."""
    rate, s, trials = np.broadcast_arrays(
        np.asarray(rate, dtype=np.float64),
        np.asarray(s, dtype=np.float64),
        np.asarray(trials, dtype=np.float64),
    )
    out = np.zeros(rate.shape)
    above = s > rate
    finite = above & np.isfinite(trials)
    poisson = above & ~np.isfinite(trials)
    with np.errstate(divide="ignore", invalid="ignore"):
        out[poisson] = -rate[poisson] + s[poisson] * (1.0 + np.log(rate[poisson]) - np.log(s[poisson]))
        n, r, k = trials[finite], rate[finite], s[finite]
        inside = k <= n
        value = np.full(n.shape, -np.inf)
        value[inside] = -n[inside] * bernoulli_kl(k[inside] / n[inside], r[inside] / n[inside])
        out[finite] = value
    return out


def truncation_points(
    rates: np.ndarray,
    support: np.ndarray,
    trials: np.ndarray | float = np.inf,
    target: float = TAIL_MASS_TARGET,
) -> np.ndarray:
    """Per row, the smallest K with Chernoff P(S > K) <= target, capped at the support."""
    rates = np.asarray(rates, dtype=np.float64)
    support = np.asarray(support, dtype=np.float64)
    trials = np.broadcast_to(np.asarray(trials, dtype=np.float64), rates.shape)
    k = np.minimum(np.ceil(rates) + 1, support)
    open_rows = (k < support) & (chernoff_survival(rates, k + 1, trials) > target)
    while open_rows.any():
        k = np.where(open_rows, k + 1, k)
        open_rows = (k < support) & (chernoff_survival(rates, k + 1, trials) > target)
    return k.astype(np.int64)


@dataclass(frozen=True)
class CountDistributions:
    """One distribution of S per row: exact pmf on 0..K plus a bounded tail above K.

    ``pmf[r, s] = P(S = s)`` for s <= K (rows sum to ``1 - tail_mass``), ``tail_mass[r] = P(S > K)``,
    ``tail_rate[r]``, ``tail_trials[r]``: Chernoff parameters valid for every s > K (trials default
    to inf, the Poisson form), ``support[r]``: max value of S (finite).
    """

    pmf: np.ndarray
    tail_mass: np.ndarray
    tail_rate: np.ndarray
    support: np.ndarray
    tail_trials: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.tail_trials is None:
            object.__setattr__(self, "tail_trials", np.full(self.pmf.shape[0], np.inf))

    @property
    def num_rows(self) -> int:
        return self.pmf.shape[0]

    @property
    def max_count(self) -> int:
        """K, the largest count with an exact pmf entry."""
        return self.pmf.shape[1] - 1

    def rows(self, index: np.ndarray) -> CountDistributions:
        index = np.asarray(index, dtype=np.int64)
        return CountDistributions(
            self.pmf[index], self.tail_mass[index], self.tail_rate[index], self.support[index],
            self.tail_trials[index],
        )

    def survival(self) -> np.ndarray:
        """G[r, k] = P(S >= k) for k = 0..K+1 (G[:, K+1] = tail_mass)."""
        tail = np.cumsum(self.pmf[:, ::-1], axis=1)[:, ::-1] + self.tail_mass[:, None]
        return np.concatenate([tail, self.tail_mass[:, None]], axis=1)

    def tail_log_bounds(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Counts s = K+1..max support and log G_s >= log P(S >= s) on them (rows x counts).

        G_s <= min(tail_mass, Chernoff(rate, s)), and G_s = 0 (log = -inf) above a row's support.
        In log space so that tiny probabilities times huge weights (Renyi) stay exact.
        """
        index = np.arange(self.num_rows) if rows is None else np.asarray(rows, dtype=np.int64)
        k = self.max_count
        top = int(self.support[index].max()) if index.size else k
        counts = np.arange(k + 1, max(top, k) + 1, dtype=np.float64)
        log_chernoff = log_chernoff_survival(
            self.tail_rate[index][:, None], counts[None, :], self.tail_trials[index][:, None]
        )
        with np.errstate(divide="ignore"):
            log_g = np.minimum(log_chernoff, np.log(self.tail_mass[index])[:, None])
        log_g = np.where(counts[None, :] <= self.support[index][:, None], log_g, -np.inf)
        return counts, log_g


def tail_moment_bound(dists: CountDistributions, weight) -> np.ndarray:
    """Upper bound on E[w(S) 1{S > K}] for non-decreasing w >= 0 (Abel summation).

    E[w(S) 1{S>K}] = w(K+1) G_{K+1} + sum_{s>=K+2} (w(s) - w(s-1)) G_s, each G_s bounded by
    ``tail_log_bounds``. ``weight`` maps a float array of counts to w.
    """
    out = np.zeros(dists.num_rows)
    for start in range(0, dists.num_rows, _CHUNK_ROWS):
        rows = np.arange(start, min(dists.num_rows, start + _CHUNK_ROWS))
        counts, log_g = dists.tail_log_bounds(rows)
        if counts.size:
            w = weight(counts)
            increments = np.concatenate([w[:1], np.diff(w)])
            with np.errstate(divide="ignore"):
                out[rows] = np.exp(log_g + np.log(increments)[None, :]).sum(axis=1)
    return out


def segment_sums(groups: SecretGroups, values: np.ndarray) -> np.ndarray:
    """Per secret, the sum of ``values`` (aligned with ``groups.rho``) over its entries."""
    return _segment_sums(groups.indptr, values)


def _segment_sums(indptr: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sums of ``values[indptr[j]:indptr[j+1]]`` for every j (0 for empty segments)."""
    out = np.zeros(indptr.size - 1)
    nonempty = np.diff(indptr) > 0
    if values.size:
        out[nonempty] = np.add.reduceat(values, indptr[:-1][nonempty])
    return out


def poisson_binomial(
    groups: SecretGroups, secrets: np.ndarray | None = None, means: np.ndarray | None = None
) -> CountDistributions:
    """Exact distributions of S_j = sum_{i in D_j} Bern(rho_i) for the given secrets (all by default).

    Dynamic programme over the examples, truncated at K chosen so that P(S > K) <= 1e-20 by
    Chernoff for every row (the mass leaving K is accumulated, not dropped). ``means`` (all
    secrets' E[S_j], optional) saves recomputing them.
    """
    secrets = np.arange(groups.num_secrets) if secrets is None else np.asarray(secrets, dtype=np.int64)
    sizes = groups.sizes[secrets]
    means = (segment_sums(groups, groups.rho) if means is None else np.asarray(means))[secrets]
    if secrets.size == 0:
        return CountDistributions(np.zeros((0, 1)), np.zeros(0), np.zeros(0), np.zeros(0))
    k_max = max(int(truncation_points(means, sizes, sizes).max()), 1)
    pmf = np.zeros((secrets.size, k_max + 1))
    tail = np.zeros(secrets.size)
    order = np.argsort(-sizes, kind="stable")
    for start in range(0, secrets.size, _CHUNK_ROWS):
        rows = order[start : start + _CHUNK_ROWS]
        chunk_pmf, chunk_tail = _dp_chunk(groups, secrets[rows], sizes[rows], k_max)
        pmf[rows] = chunk_pmf
        tail[rows] = chunk_tail
    sizes = sizes.astype(np.float64)
    return CountDistributions(pmf, tail, means.astype(np.float64), sizes, sizes)


def _dp_chunk(
    groups: SecretGroups, secrets: np.ndarray, sizes: np.ndarray, k_max: int
) -> tuple[np.ndarray, np.ndarray]:
    """pmf on 0..k_max and the mass above k_max, rows sorted by decreasing size.

    The table is held as (k_max + 1) x m, so that every update runs along the m secrets (contiguous),
    not along the ~16 counts: 3x faster, the same operations in the same order.
    """
    m = secrets.size
    n_max = int(sizes.max()) if m else 0
    starts = groups.indptr[secrets]
    pmf = np.zeros((k_max + 1, m))
    pmf[0] = 1.0
    tail = np.zeros(m)
    active = m
    for i in range(n_max):
        while active > 0 and sizes[active - 1] <= i:
            active -= 1
        q = groups.rho[starts[:active] + i]
        block = pmf[:, :active]
        tail[:active] += block[k_max] * q
        shifted = block[:-1] * q
        block *= 1.0 - q
        block[1:] += shifted
    return pmf.T, tail


def truncated_poisson(rates: np.ndarray, support: np.ndarray, k_max: int) -> CountDistributions:
    """min(Poisson(rate), support): dominates (FOSD) any S <= support with S <=_st Poisson(rate)."""
    rates = np.asarray(rates, dtype=np.float64)
    support = np.asarray(support, dtype=np.float64)
    s = np.arange(k_max + 1)
    pmf = stats.poisson.pmf(s[None, :], rates[:, None])
    # Mass at counts >= support is all at `support` (the minimum): fold it there.
    sf = stats.poisson.sf(s[None, :] - 1, rates[:, None])  # P(Pois >= s)
    at_cap = s[None, :] == support[:, None]
    pmf = np.where(s[None, :] > support[:, None], 0.0, np.where(at_cap, sf, pmf))
    tail = np.where(support > k_max, stats.poisson.sf(k_max, rates), 0.0)
    return CountDistributions(pmf, tail, rates, support)


def envelope(dists: CountDistributions) -> CountDistributions:
    """The FOSD envelope of all rows: survival G(k) = max over rows of P(S >= k), one row.

    It dominates every row stochastically, so it certifies each of them (see ``dominance``).
    """
    g = dists.survival().max(axis=0)
    g[0] = 1.0
    pmf = g[:-1] - g[1:]
    return CountDistributions(
        pmf[None, :],
        np.array([g[-1]]),
        np.array([dists.tail_rate.max()]),
        np.array([dists.support.max()]),
        np.array([dists.tail_trials.max()]),
    )


def poisson_dominating_rate(groups: SecretGroups) -> np.ndarray:
    """Lambda_j = -sum log(1 - rho_i): Bern(rho) <=_st Poisson(-log(1-rho)), summed over D_j.

    P(Poisson(-log(1-rho)) >= 1) = rho and Bern(rho) <= 1, so each Bernoulli is dominated;
    independent sums preserve FOSD. Infinite when some rho_i = 1. It is also -log P(S_j = 0), the
    rate of the noiseless bound (``noiseless``). Rounded up by max(1e-12, 2 (n + 2) eps) relative for
    n = |D_j| terms: each log1p is within an ulp or two, and a floating-point sum of n non-negative
    terms is within (n - 1) eps of the exact one, so the result is never below the exact sum.

    Computed over runs of whole secrets of ~_CHUNK_ENTRIES entries in one reused buffer: a fresh
    temporary as long as rho (60 MB for 7.5M memberships) costs more in page faults than the log1p.
    """
    out = np.zeros(groups.num_secrets)
    buffer = np.empty(min(_CHUNK_ENTRIES, groups.rho.size))
    first = 0
    with np.errstate(divide="ignore"):
        while first < groups.num_secrets:
            start = groups.indptr[first]
            fits = int(np.searchsorted(groups.indptr, start + _CHUNK_ENTRIES, side="right")) - 1
            last = max(fits, first + 1)
            stop = groups.indptr[last]
            if stop - start > buffer.size:  # one secret larger than the buffer
                buffer = np.empty(stop - start)
            values = buffer[: stop - start]
            np.negative(groups.rho[start:stop], out=values)
            np.log1p(values, out=values)
            out[first:last] = -_segment_sums(groups.indptr[first : last + 1] - start, values)
            first = last
    ulp = np.finfo(np.float64).eps
    return out * (1.0 + np.maximum(1e-12, 2.0 * (groups.sizes + 2) * ulp))
