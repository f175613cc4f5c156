"""The tight accountant: dp_accounting agreement, the Gaussian closed form, grid accuracy, and a
Monte-Carlo check of the bound against the Neyman-Pearson test itself."""

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as plm
from scipy import special

import hush_hf.accounting.blowup as blowup
from hush_hf.accounting import SecretGroups, calibrate_noise, posterior_bounds
from hush_hf.accounting.blowup import (
    _hockey_stick_from_pmf,
    composed_hockey_stick,
    loss_grid_step,
)
from hush_hf.accounting.connect_dots import one_step_pmf
from hush_hf.accounting.noiseless import noiseless_bounds

PMF = np.array([0.7, 0.25, 0.05])  # S on {0, 1, 2}


def _one_step_dense(pi, tail, sigma, step):
    from dp_accounting.pld import pld_pmf

    one = one_step_pmf(pi, tail, sigma, step)
    return one, pld_pmf.DensePLDPmf(step, one.k_lo, one.masses, one.infinity, pessimistic_estimate=True)


@pytest.mark.parametrize("sigma", [1.5, 4.46, 60.0])
def test_one_step_hockey_stick_dominates_and_matches_dp_accounting(sigma):
    one, dense = _one_step_dense(PMF, 0.0, sigma, 1e-3)
    eps = one.losses
    inside = eps > math.log(PMF[0]) + 2 * 1e-3  # the library's inverse needs eps > log P(S=0)
    inside &= np.arange(eps.size) % 7 == 0  # a sample keeps the library's scalar bisection fast
    mechanism = plm.MixtureGaussianPrivacyLoss(
        sigma, [0.0, 1.0, 2.0], PMF, adjacency_type=plm.AdjacencyType.REMOVE  # P = the mixture
    )
    reference = mechanism.get_delta_for_epsilon(eps[inside])  # exact closed form
    ours = dense.get_delta_for_epsilon(eps[inside])
    assert np.all(ours >= reference)  # connect-the-dots is exact at grid points; ours only adds
    np.testing.assert_allclose(ours, reference, rtol=2e-8, atol=1e-15)  # the rounding allowances


def test_composed_curve_matches_dp_accounting_pld():
    sigma, steps = 1.5, 50
    step = loss_grid_step(PMF, sigma)
    library = pld_lib.from_mixture_gaussian_mechanism(
        sigma, [0.0, 1.0, 2.0], PMF, value_discretization_interval=step
    ).self_compose(steps)
    curve = composed_hockey_stick(PMF, 0.0, sigma, steps)
    idx = np.searchsorted(curve.losses, np.array([0.0, 1.0, 2.0, 4.0, 6.0]) - 1e-12)
    reference = library.get_delta_for_epsilon(curve.losses[idx])
    assert np.all(curve.deltas[idx] >= reference * (1 - 1e-12))  # ours only adds (rounding allowances)
    np.testing.assert_allclose(curve.deltas[idx], reference, rtol=1e-7)


def test_hockey_stick_read_from_pmf_matches_library_method():
    _, pmf = _one_step_dense(PMF, 1e-12, 2.0, 1e-3)
    composed = pmf.self_compose(30)
    lower, probs, infinity = composed._lower_loss, composed._probs, composed._infinity_mass
    curve = _hockey_stick_from_pmf(lower, probs, infinity, 1e-3)
    picks = np.linspace(0, curve.losses.size - 1, 25).astype(int)
    reference = composed.get_delta_for_epsilon(curve.losses[picks])
    assert np.all(curve.deltas[picks] >= reference * (1 - 1e-12))  # the same sums
    np.testing.assert_allclose(curve.deltas[picks], reference, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize(("sigma", "steps", "prior"), [(1.0, 1, 1e-3), (3.0, 20, 1e-6), (45.0, 2000, 1e-10)])
def test_gaussian_closed_form_single_example(sigma, steps, prior):
    # rho = 1: P^T vs Q^T is N(sqrt(T)/sigma, 1) vs N(0, 1): B(p) = Phi(Phi^-1(p) + sqrt(T)/sigma).
    exact = special.ndtr(special.ndtri(prior) + math.sqrt(steps) / sigma)
    groups = SecretGroups.from_lists([[1.0]])
    ours = posterior_bounds(groups, [prior], sigma, steps, "tight")[0]
    assert ours >= exact
    assert ours == pytest.approx(exact, rel=2e-3)


def test_blowup_search_equals_brute_force():
    curve = composed_hockey_stick(PMF, 1e-18, 2.0, 200)
    priors = np.geomspace(1e-14, 0.9, 200)
    fast = curve.blowup(priors)
    gamma = np.exp(curve.losses)
    brute = np.minimum((gamma[None, :] * priors[:, None] + curve.deltas[None, :]).min(axis=1), 1.0)
    np.testing.assert_allclose(fast, brute, rtol=1e-13)  # the same sums, added in another order
    one_by_one = np.concatenate([curve.blowup(priors[i : i + 3]) for i in range(0, priors.size, 3)])
    np.testing.assert_allclose(one_by_one, brute, rtol=1e-13)  # few priors: a bisection each
    assert np.all(np.diff(fast) >= 0) and np.all(fast >= priors)


@pytest.mark.parametrize("steps", [2000, 20000])
def test_finer_loss_grid_moves_sigma_little(steps, monkeypatch):
    groups = SecretGroups.from_lists([[0.004] * 75])
    coarse = calibrate_noise(groups, [1e-10], [5e-4], steps, "tight", rtol=1e-5).sigma
    monkeypatch.setattr(blowup, "LOSS_GRID_SCALE", blowup.LOSS_GRID_SCALE / 2)
    fine = calibrate_noise(groups, [1e-10], [5e-4], steps, "tight", rtol=1e-5).sigma
    assert fine <= coarse * (1 + 1e-5)  # a coarser grid is more pessimistic
    assert coarse / fine - 1 < 3e-5


def test_noiseless_bound_is_exact_and_caps_small_sigma():
    groups = SecretGroups.from_lists([[0.01, 0.02], [0.3]])
    priors = np.array([1e-3, 0.2])
    q0 = np.array([0.99 * 0.98, 0.7])
    steps = 5
    expected = 1 - q0**steps * (1 - priors)
    np.testing.assert_allclose(posterior_bounds(groups, priors, 0.0, steps, "tight"), expected, rtol=1e-10)
    np.testing.assert_allclose(noiseless_bounds(-np.log(q0), steps, priors), expected, rtol=1e-10)
    small = posterior_bounds(groups, priors, 0.05, steps, "tight")
    assert np.all(small <= expected * (1 + 1e-9)) and np.all(small >= 0.99 * expected)  # continuous at 0


def test_monte_carlo_neyman_pearson_test_stays_below_the_bound():
    """Importance sampling under P: level Q(Lambda > c) = E_P[exp(-Lambda) 1{Lambda > c}] and power
    P(Lambda > c) of the likelihood-ratio test; B(level) must dominate the power (and be close)."""
    rhos = np.array([0.3, 0.2, 0.4])
    pmf = np.array([1.0])
    for q in rhos:
        pmf = np.convolve(pmf, [1 - q, q])
    sigma, steps, n = 1.6, 10, 200_000
    rng = np.random.default_rng(20250101)
    counts = rng.choice(pmf.size, p=pmf, size=(n, steps))
    x = counts + sigma * rng.standard_normal((n, steps))
    ratio = np.zeros_like(x)
    for s, w in enumerate(pmf):  # dP/dQ(x) = sum_s pi_s exp((s x - s^2 / 2) / sigma^2)
        ratio += w * np.exp((s * x - s * s / 2) / sigma**2)
    log_ratio = np.log(ratio).sum(axis=1)
    order = np.argsort(-log_ratio)
    weights = np.exp(-log_ratio[order]) / n  # Q-mass of each P-sample
    cut = int(np.searchsorted(np.cumsum(weights), 1e-3))  # largest rejection region of level ~1e-3
    level = weights[:cut].sum()
    level_se = weights[:cut].std() * math.sqrt(cut) if cut else 0.0
    power = cut / n
    power_se = math.sqrt(power * (1 - power) / n)
    groups = SecretGroups.from_lists([rhos])
    upper = posterior_bounds(groups, [level + 4 * level_se], sigma, steps, "tight")[0]
    lower = posterior_bounds(groups, [max(level - 4 * level_se, 1e-12)], sigma, steps, "tight")[0]
    assert 0.05 < power < 0.9  # a regime where the test is informative
    assert power - 4 * power_se <= upper  # the bound holds
    assert lower <= power + 4 * power_se  # and is essentially attained by the Neyman-Pearson test


def test_tiny_noise_gives_the_trivial_bound_instead_of_crashing():
    # With sigma = 1e-3 all privacy-loss mass lies beyond the grid: the only valid bound is 1.
    from hush_hf.planning import plan_protection

    plan = plan_protection(
        [[i] for i in range(128)], np.full(128, 1e-6), np.full(128, 1e-3), expected_batch_size=16,
        steps=300, lp_c=1e12, accountant="tight", noise_multiplier=1e-3,
    )
    assert np.all(plan.secrets.bound == 1.0) and not plan.meets_targets


def test_astronomically_small_priors_calibrate_through_the_renyi_floor():
    # Long random keys: p ~ 1e-28..1e-30 with targets ~1e-20, far below the PLD's ~1e-15 floor.
    groups = SecretGroups.from_lists([[0.01] * 5, [0.004] * 75])
    priors, targets = [1.85e-28, 1e-30], [6.5e-20, 1e-20]
    tight = calibrate_noise(groups, priors, targets, 1000, "tight")
    rdp = calibrate_noise(groups, priors, targets, 1000, "rdp")
    assert np.all(tight.bounds <= targets) and np.all(tight.bounds >= priors)
    assert tight.sigma <= rdp.sigma * (1 + 2e-4)  # at least as tight as the Renyi bound it falls back to
    bounds = posterior_bounds(groups, priors, tight.sigma, 1000, "tight")
    assert np.all(bounds <= targets)


def test_loss_grid_stopped_at_the_relevant_cap_loosens_bounds_by_at_most_its_margin():
    # A rarely sampled secret at small sigma (the demo's plans): one-step losses reach ~160, the cap
    # for p = 1e-10 at T = 40 is ~52. Moving the mass above it to +infinity is pessimistic (>=) and
    # costs at most the factor 1 + e^-LOSS_CUT_MARGIN (relevant_loss_cap), on the same grid; both
    # carry their own FFT rounding allowance (~1e-12 absolute here), hence the 1e-7 either way.
    pmf = np.array([1.0])
    for _ in range(100):
        pmf = np.convolve(pmf, [0.9988, 0.0012])
    pi, sigma, steps, prior = pmf[:13] / pmf[:13].sum(), 0.685, 40, 1e-10
    step = 2.5e-3
    full = composed_hockey_stick(pi, 0.0, sigma, steps, step=step)
    capped = composed_hockey_stick(pi, 0.0, sigma, steps, step=step, smallest_prior=prior)
    assert capped.v.size < 0.5 * full.v.size  # the grid is much shorter
    priors = np.array([prior, 1e-8, 1e-6])
    ours, reference = capped.blowup(priors), full.blowup(priors)
    assert np.all(ours >= reference * (1 - 1e-7))
    assert np.all(ours <= reference * (1 + math.exp(-blowup.LOSS_CUT_MARGIN) + 1e-7))


def test_tilted_composition_agrees_where_the_plain_one_is_precise_and_wins_where_it_is_not():
    """Tilting commutes with convolution, so where the plain composition's rounding is negligible the
    tilted bound equals it; for a rarely sampled example at 1e6 steps (bound ~5e-7 for p = 1e-10) the
    plain one's rounding allowance is most of the bound, the tilted one's is not."""
    from hush_hf.accounting.blowup import ComposedHockeyStick, _one_step_and_curve
    from hush_hf.accounting.tilt import tilt_for, tilted_increments

    def both(pi, sigma, steps, prior):
        one, curve = _one_step_and_curve(pi, 0.0, sigma, steps, smallest_prior=prior)
        lam = tilt_for(one.losses, one.masses, steps, curve.optimal_loss(prior))
        lower, v, floor, extra = tilted_increments(one, steps, lam)
        tilted = ComposedHockeyStick(lower, one.step, v, floor, extra).blowup(np.array([prior]))[0]
        return curve.blowup(np.array([prior]))[0], tilted, lam

    plain, tilted, lam = both(PMF, 2.0, 200, 1e-6)
    assert lam > 0 and tilted == pytest.approx(plain, rel=1e-6)
    plain, tilted, lam = both(np.array([1 - 1e-6, 1e-6]), 0.3, 1_000_000, 1e-10)
    assert tilted < 0.7 * plain  # measured 5.37e-7 against 8.4e-7
