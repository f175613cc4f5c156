"""Budgets and input checks: Bernoulli KL, its inverse, the Gaussian gap, LP budgets, ValueErrors."""

import math

import mpmath as mp
import numpy as np
import pytest

from hush_hf.accounting import bernoulli_kl, lp_budget, validate_targets
from hush_hf.accounting.budgets import gaussian_gap, kl_posterior

mp.mp.dps = 50


def mp_bernoulli_kl(r: float, p: float) -> mp.mpf:
    r, p = mp.mpf(r), mp.mpf(p)
    first = r * mp.log(r / p) if r > 0 else mp.mpf(0)
    second = (1 - r) * mp.log((1 - r) / (1 - p)) if r < 1 else mp.mpf(0)
    return first + second


@pytest.mark.parametrize(
    ("r", "p"),
    [(5e-4, 1e-10), (0.3, 0.3 * (1 + 1e-9)), (0.3000001, 0.3), (1 - 1e-12, 0.5), (1.0, 0.25), (0.0, 0.4),
     (0.9, 0.1), (1e-3, 1e-3 * (1 - 1e-6))],
)
def test_bernoulli_kl_matches_mpmath(r, p):
    ref = mp_bernoulli_kl(r, p)
    ours = float(bernoulli_kl(r, p))
    assert ours == pytest.approx(float(ref), rel=1e-11, abs=1e-300)


def test_bernoulli_kl_reference_value_and_vectorised():
    assert float(bernoulli_kl(5e-4, 1e-10)) == pytest.approx(7.2126e-3, rel=1e-4)  # docs/design.md
    r = np.array([0.2, 0.5, 0.9])
    p = np.array([0.1, 0.1, 0.1])
    expected = [float(mp_bernoulli_kl(a, b)) for a, b in zip(r, p, strict=True)]
    np.testing.assert_allclose(bernoulli_kl(r, p), expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("d", "p"), [(7.2126e-3, 1e-10), (1e-3, 0.2), (1e-14, 0.3), (2.0, 0.01), (0.5, 1e-6)]
)
def test_kl_posterior_inverts_bernoulli_kl_from_above(d, p):
    q = float(kl_posterior(d, p))
    assert float(bernoulli_kl(q, p)) >= d  # never under-states the posterior
    lo, hi = mp.mpf(p), mp.mpf(1)
    for _ in range(200):  # bisection in high precision: KL(.||p) increases on [p, 1]
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if mp_bernoulli_kl(mid, p) >= d else (mid, hi)
    assert q == pytest.approx(float(hi), rel=1e-11)


def test_kl_posterior_edges():
    assert kl_posterior(0.0, 0.3) == 0.3
    assert kl_posterior(-math.log(1e-10) + 1.0, 1e-10) == 1.0  # more than KL(Bern(1)||Bern(p)): no bound
    out = kl_posterior(np.array([[1e-3], [2e-3]]), np.array([[0.1], [0.1]]))
    assert out.shape == (2, 1) and out[1, 0] > out[0, 0] > 0.1


def test_gaussian_gap_is_stable_for_tiny_priors():
    p, r = 1e-10, 5e-4
    ref = mp.sqrt(2) * (mp.erfinv(1 - 2 * mp.mpf(p)) - mp.erfinv(1 - 2 * mp.mpf(r)))
    assert float(gaussian_gap(p, r)) == pytest.approx(float(ref), rel=1e-12)


def test_lp_budget_kinds():
    p = np.array([1e-10, 1e-4, 0.01])
    r = np.array([5e-4, 1e-2, 0.3])
    mu = bernoulli_kl(r, p)
    np.testing.assert_allclose(lp_budget(p, r, "kl"), np.sqrt(mu), rtol=1e-15)
    np.testing.assert_allclose(lp_budget(p, r, "paper"), mu, rtol=1e-15)
    g = gaussian_gap(p, r)
    np.testing.assert_allclose(lp_budget(p, r, "tight"), g, rtol=1e-15)
    np.testing.assert_allclose(lp_budget(p, r, "rdp"), g, rtol=1e-15)
    assert lp_budget(p, r, "tight")[0] == pytest.approx(3.0708, rel=1e-4)
    with pytest.raises(ValueError, match="kind"):
        lp_budget(p, r, "dp")
    with pytest.raises(ValueError, match="targets"):
        lp_budget(p, p, "kl")


@pytest.mark.parametrize(
    ("priors", "targets", "field"),
    [
        ([0.0], [0.5], "priors"),
        ([1.0], [0.5], "priors"),
        ([-0.1], [0.5], "priors"),
        ([float("nan")], [0.5], "priors"),
        ([0.1], [float("inf")], "targets"),
        ([0.1], [0.1], "targets"),
        ([0.2], [0.1], "targets"),
        ([0.1], [1.0], "targets"),
        ([0.1, 0.2], [0.5], "targets"),
        ([], [], "priors"),
        ([[0.1]], [[0.2]], "priors"),
        (["a"], [0.2], "priors"),
    ],
)
def test_validate_targets_names_the_field(priors, targets, field):
    with pytest.raises(ValueError, match=field):
        validate_targets(priors, targets)


def test_validate_targets_reports_index_and_value():
    with pytest.raises(ValueError, match=r"targets\[2\] = 0\.05 must exceed priors\[2\] = 0\.1"):
        validate_targets([0.1, 0.1, 0.1], [0.2, 0.3, 0.05])
    validate_targets(np.array([1e-10, 0.5]), np.array([5e-4, 0.9]))  # valid: no exception
