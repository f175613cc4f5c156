"""Per-secret budgets from (prior p, target posterior r): Bernoulli KL, Gaussian gap, LP budgets.

- ``mu = KL(Bern(r) || Bern(p))`` is the KL budget of Hush Lemma 3.2 (Sec. 3.3).
- ``g = Phi^-1(1 - p) - Phi^-1(1 - r)`` is the sensitivity-to-noise ratio a single Gaussian
  mechanism may have: its blow-up function is B(p) = Phi(Phi^-1(p) + Delta/sigma) (Hayes et al.
  2023), so B(p) <= r iff Delta/sigma <= g.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from hush_hf.accounting.special import kl_kernel
from hush_hf.accounting.validation import validate_targets

LP_BUDGET_KINDS: tuple[str, ...] = ("kl", "tight", "rdp", "paper")


def bernoulli_kl(r: np.ndarray | float, p: np.ndarray | float) -> np.ndarray:
    """KL(Bern(r) || Bern(p)) = r log(r/p) + (1-r) log((1-r)/(1-p)), vectorised.

    Written as p h(u) + (1-p) h(v) with u = (r-p)/p, v = (p-r)/(1-p) and h(x) = (1+x)log1p(x) - x,
    a sum of two non-negative terms: no cancellation when r is close to p, exact at r in {0, 1}.
    """
    r = np.asarray(r, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    u = (r - p) / p
    v = (p - r) / (1.0 - p)
    return p * kl_kernel(u) + (1.0 - p) * kl_kernel(v)


def kl_posterior(kl_budget: np.ndarray, priors: np.ndarray, max_iterations: int = 100) -> np.ndarray:
    """The q >= p with KL(Bern(q) || Bern(p)) = D (q = 1 when D >= KL(Bern(1)||Bern(p)) = -log p).

    Hush Lemma 3.2: a posterior of p-prior secrets is at most this q when the divergence is <= D.
    As a function of t = log q, F = KL(q||p) - D is convex and increasing for q >= p, so Newton's
    method started right of the root stays right of it: every iterate is a valid upper answer and
    they decrease to the root. The start solves G(q) = D for G(q) = q log(q/p) - q + p <= KL(q||p)
    (Lambert W: q = p a / W(a / e), a = (D - p) / p), capped at 1 - 1e-10 (a root beyond that
    returns 1).
    A last check nudges any value that rounding left below the root back above it.
    """
    shape = np.broadcast(np.asarray(kl_budget), np.asarray(priors)).shape
    d, p = np.broadcast_arrays(np.asarray(kl_budget, dtype=np.float64), np.asarray(priors, dtype=np.float64))
    d, p = d.ravel(), p.ravel()
    out = np.ones(d.shape)
    trivial = d <= 0
    out[trivial] = p[trivial]
    start = 1.0 - 1e-10
    idx = np.flatnonzero(~trivial & (p < start) & (bernoulli_kl(start, p) > d))
    pi, di = p[idx], d[idx]
    a = (di - pi) / pi
    q = np.minimum(pi * a / np.real(special.lambertw(a / np.e)), start)
    q = np.where(np.isfinite(q) & (q > pi), q, start)
    moving = np.arange(idx.size)
    for _ in range(max_iterations):
        qm, pm = q[moving], pi[moving]
        value = bernoulli_kl(qm, pm) - di[moving]
        slope = qm * (np.log1p((qm - pm) / pm) - np.log1p((pm - qm) / (1.0 - pm)))
        change = value / slope
        q[moving] = np.maximum(qm * np.exp(-change), pm)
        moving = moving[np.abs(change) > 1e-14]
        if moving.size == 0:
            break
    for _ in range(8):  # rounding guard: KL(q||p) >= D must hold
        low = bernoulli_kl(q, pi) < di
        if not low.any():
            break
        q = np.where(low, np.minimum(q * (1.0 + 1e-13), 1.0), q)
    out[idx] = q
    return out.reshape(shape)


def gaussian_gap(priors: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """g = Phi^-1(1-p) - Phi^-1(1-r) = Phi^-1(r) - Phi^-1(p) (ndtri on p itself: exact at p=1e-10)."""
    return special.ndtri(np.asarray(targets, dtype=np.float64)) - special.ndtri(
        np.asarray(priors, dtype=np.float64)
    )


def lp_budget(priors: np.ndarray, targets: np.ndarray, kind: str) -> np.ndarray:
    """Per-secret LP budget, proportional to the allowed sum of sampling weights (docs/design.md#lp-budgets).

    ``kl``: sqrt(mu) (sigma_kl ~ sum(rho) sqrt(T / (2 mu))); ``tight``/``rdp``: g
    (sigma_tight ~ 1.02 sqrt(T) sum(rho) / g); ``paper``: mu (Hush Algorithm 2, line 2).
    """
    if kind not in LP_BUDGET_KINDS:
        raise ValueError(f"kind must be one of {LP_BUDGET_KINDS}, got {kind!r}")
    validate_targets(priors, targets)
    p = np.asarray(priors, dtype=np.float64)
    r = np.asarray(targets, dtype=np.float64)
    if kind == "kl":
        return np.sqrt(bernoulli_kl(r, p))
    if kind == "paper":
        return bernoulli_kl(r, p)
    return gaussian_gap(p, r)
