"""Every accountant is a valid bound at every sigma (issue 18, Sec. 3).

Independent references, written here with mpmath and scipy only (no project code):

- the sigma -> 0 limit. Without noise the run reveals the counts S_1..S_T and Q is the point mass at
  0; the best level-p test rejects whenever some S_t > 0, else with probability p, so the exact
  bound is B_0(p) = 1 - (1 - rho)^{nT} (1 - p) for n examples sampled at rho: below 1 when the
  examples are rarely sampled. Noise is post-processing, so B_0 bounds the posterior at every sigma.
- a lower bound at every sigma: the level-p test "reject when sum_t x_t > b sigma sqrt(T)" (Q:
  N(0, T sigma^2), b = Phi^-1(1 - p)) has power E[Phi_bar(b - N / (sigma sqrt(T)))] with
  N = sum_t S_t ~ Bin(nT, rho). No valid bound may lie below it; as sigma -> 0 it tends to B_0.

The property: for p from 1e-30 to 0.3 and sigma from 1e-300 to 1e6, each accountant returns a
number with max(p, lower) <= bound <= B_0, non-increasing in sigma, equal to B_0 once sigma is tiny.
"""

from __future__ import annotations

import dataclasses
import math

import mpmath
import numpy as np
import pytest
from scipy import special, stats

from hush_hf.accounting import ACCOUNTANTS, SecretGroups, calibrate_noise, posterior_bounds

mpmath.mp.dps = 40

PRIORS = np.array([1e-30, 1e-12, 1e-3, 0.3])
SIGMAS = np.array([1e-300, 1e-100, 1e-10, 1e-4, 0.05, 0.5, 3.0, 50.0, 1e3, 1e6])
#: (examples, rho, T): rarely sampled (B_0 ~ 1e-5 and 3e-2), often sampled (B_0 = 1), always sampled.
LAWS = [(1, 1e-6, 10), (3, 1e-4, 100), (5, 0.01, 1000), (1, 1.0, 50)]
#: Each value is a valid bound, and the exact bound is non-increasing in sigma; the computed ones are
#: to within their distance from it: tight's loss grid, tilt and Renyi fallback change with sigma
#: (measured up to 4e-4 relative, at bounds within 1e-4 of a 1e-20 prior), kl's and rdp's orders
#: and quadrature to rounding.
MONOTONE_SLACK = {"tight": 1e-3, "rdp": 1e-9, "kl": 1e-9}


def noiseless_limit(n: int, rho: float, steps: int, prior: float) -> float:
    """B_0 = 1 - (1 - rho)^{nT} (1 - p), at 40 digits."""
    keep = (1 - mpmath.mpf(rho)) ** (n * steps)
    return float(1 - keep * (1 - mpmath.mpf(prior)))


def sum_test_power(n: int, rho: float, steps: int, sigma: float, prior: float) -> float:
    """Power of the level-p test on sum_t x_t (module docstring), rounded down."""
    b = -special.ndtri(prior) * (1 + 1e-12) + 1e-12  # a hair above: level <= p
    trials = n * steps
    if rho == 1.0:
        counts, weights = np.array([float(trials)]), np.array([1.0])
    else:
        lo, hi = stats.binom.ppf(1e-30, trials, rho), stats.binom.isf(1e-30, trials, rho)
        counts = np.arange(max(0.0, lo - 1), min(trials, hi + 1) + 1)
        weights = stats.binom.pmf(counts, trials, rho)  # dropping the rest only lowers the power
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        shift = np.where(counts > 0, counts / (sigma * math.sqrt(steps)), 0.0)
    return float(np.sum(weights * special.ndtr(shift - b))) * (1 - 1e-12)


def check_law(accountant: str, n: int, rho: float, steps: int, sigmas: np.ndarray, priors: np.ndarray):
    groups = SecretGroups.from_lists([[rho] * n] * priors.size)
    bounds = np.array([posterior_bounds(groups, priors, float(s), steps, accountant) for s in sigmas])
    assert np.all(np.isfinite(bounds))
    for i, prior in enumerate(priors):
        column = bounds[:, i]
        limit = noiseless_limit(n, rho, steps, prior)
        lower = np.array([sum_test_power(n, rho, steps, s, prior) for s in sigmas])
        assert np.all(column >= prior) and np.all(column <= 1.0)
        assert np.all(column <= limit * (1 + 2e-12)), (prior, column, limit)  # the noiseless bound holds
        assert np.all(column >= lower * (1 - 1e-9)), (prior, column, lower)  # never below a valid test
        later, earlier = column[1:], column[:-1]
        assert np.all(later <= earlier * (1 + MONOTONE_SLACK[accountant])), (prior, column)
        tiny = sigmas <= 1e-10  # components >= 1e10 standard deviations apart: the noiseless run
        np.testing.assert_allclose(column[tiny], limit, rtol=2e-12)  # rate rounded up by 1e-12
        np.testing.assert_allclose(lower[tiny], limit, rtol=1e-9)  # the reference agrees


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
@pytest.mark.parametrize(("n", "rho", "steps"), LAWS)
def test_bounds_are_valid_monotone_and_tend_to_the_noiseless_limit(accountant, n, rho, steps):
    check_law(accountant, n, rho, steps, SIGMAS, PRIORS)


@pytest.mark.slow
@pytest.mark.parametrize("accountant", ACCOUNTANTS)
@pytest.mark.parametrize(("n", "rho", "steps"), [*LAWS, (10, 0.5, 2000), (20, 1e-7, 1000), (75, 0.004, 2000)])
def test_full_grid_of_priors_and_sigmas(accountant, n, rho, steps):
    sigmas = np.unique(np.concatenate([np.geomspace(1e-300, 1e6, 61), np.geomspace(1e-3, 1e3, 31)]))
    priors = np.array([1e-30, 1e-20, 1e-12, 1e-10, 1e-6, 1e-3, 0.1, 0.3])
    check_law(accountant, n, rho, steps, sigmas, priors)


def test_tiny_sigma_no_longer_certifies_with_kl():
    # sigma = 1e-10: the KL grid size overflowed int64, KL came out 0 and the bound equalled the prior.
    laws = [(75, 0.004), (1, 0.3), (10, 1e-3), (1, 1e-7)]
    groups = SecretGroups.from_lists([[rho] * n for n, rho in laws])
    priors = np.array([1e-10, 1e-3, 0.1, 1e-10])
    expected = [noiseless_limit(n, rho, 2000, p) for (n, rho), p in zip(laws, priors, strict=True)]
    assert expected[0] == 1.0 and 0.9999999 < expected[2] < 1.0 and expected[3] < 2.1e-4
    for accountant in ACCOUNTANTS:
        for sigma in (1e-10, 1e-20, 1e-100, 1e-300):
            bounds = posterior_bounds(groups, priors, sigma, 2000, accountant)
            np.testing.assert_allclose(bounds, expected, rtol=2e-12)


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
@pytest.mark.parametrize(
    ("rates", "prior", "target", "steps"),
    [
        ([0.01] * 5, 1e-30, 1e-29, 100),
        ([0.3], 0.3, 0.31, 1000),
        ([1e-5] * 3, 1e-12, 2e-12, 100),
        ([1e-4], 1e-3, 1e-2, 10),  # B_0 = 1.9e-3 <= 1e-2: no noise needed
    ],
)
def test_calibration_never_returns_a_sigma_whose_bound_misses(accountant, rates, prior, target, steps):
    groups = SecretGroups.from_lists([rates])
    try:
        cal = calibrate_noise(groups, [prior], [target], steps, accountant)
    except ValueError as err:  # a refusal is one line naming the target
        assert "targets[0]" in str(err) and "\n" not in str(err)
        return
    n, rho = len(rates), rates[0]
    assert cal.bounds[0] <= target
    assert posterior_bounds(groups, [prior], cal.sigma, steps, accountant)[0] <= target
    assert sum_test_power(n, rho, steps, max(cal.sigma, 1e-300), prior) <= target  # the reference agrees
    if noiseless_limit(n, rho, steps, prior) <= target:
        assert cal.sigma == 0.0


def test_a_bound_that_cannot_be_computed_is_a_refusal_not_a_certificate(monkeypatch):
    from hush_hf.accounting import accountants

    groups = SecretGroups.from_lists([[0.01] * 5])
    broken = dataclasses.replace(accountants.REGISTRY["tight"], bounds=lambda *args: np.array([np.nan]))
    monkeypatch.setitem(accountants.REGISTRY, "tight", broken)
    with pytest.raises(RuntimeError, match=r"computed the bound nan for prior 0\.001 at sigma=2\.0"):
        posterior_bounds(groups, [1e-3], 2.0, 100, "tight")
    with pytest.raises(RuntimeError, match="computed the bound nan"):
        calibrate_noise(groups, [1e-3], [1e-2], 100, "tight")


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_plans_and_verification_at_tiny_noise_refuse_to_certify(accountant):
    from hush_hf.planning import plan_protection
    from hush_hf.planning.verification import recompute_bounds

    secret_ids = [[i] for i in range(64)]  # one example each
    priors, targets = np.full(64, 1e-6), np.full(64, 1e-3)
    for sigma in (1e-10, 1e-300):
        plan = plan_protection(
            secret_ids,
            priors,
            targets,
            expected_batch_size=8.0,
            steps=50,
            lp_c=1e12,
            accountant=accountant,
            noise_multiplier=sigma,
        )
        expected = [noiseless_limit(1, float(r), 50, 1e-6) for r in plan.sampling_probs]  # rho = 1/8
        np.testing.assert_allclose(plan.secrets.bound, expected, rtol=2e-12)
        assert not plan.meets_targets
        verification = recompute_bounds(plan, sigma)
        assert not verification.meets_targets and verification.over_target.size == 64
        assert "64 of 64 secrets exceed their targets" in verification.describe()
