"""KL and Renyi divergences of the one-step mixture pair against independent mpmath integrals and
closed forms, and the kl/rdp posterior bounds built on them."""

import math

import mpmath as mp
import numpy as np
import pytest

from hush_hf.accounting import SecretGroups, bernoulli_kl
from hush_hf.accounting.counts import CountDistributions, poisson_binomial
from hush_hf.accounting.kl import kl_bounds, mixture_kl
from hush_hf.accounting.renyi import _BlockModel, alpha_ceiling, rdp_bounds

mp.mp.dps = 40
MIXTURE = np.array([0.6, 0.3, 0.08, 0.02])  # pmf of S on 0..3


def single(pmf) -> CountDistributions:
    pmf = np.asarray(pmf, dtype=np.float64)
    return CountDistributions(pmf[None, :], np.zeros(1), np.zeros(1), np.array([pmf.size - 1.0]))


def mp_ratio(pmf, sigma):
    """Likelihood ratio dP/dQ in standard units, in high precision."""
    weights = [mp.mpf(float(x)) for x in pmf]
    sig = mp.mpf(sigma)
    return lambda z: mp.fsum(w * mp.e ** (s / sig * z - (s / sig) ** 2 / 2) for s, w in enumerate(weights))


def mp_kl(pmf, sigma):
    """KL(P||Q) = E_Q[L log L - L + 1] by adaptive quadrature over the bumps of phi(z) L(z)."""
    ratio = mp_ratio(pmf, sigma)
    c_max = (len(pmf) - 1) / sigma

    def integrand(z):
        value = ratio(z)
        return mp.npdf(z) * (value * mp.log(value) - value + 1)

    return mp.quad(integrand, sorted({-14.0, -3.0, 0.0, 3.0, c_max + 14.0}))


def mp_log_moment(pmf, sigma, alpha):
    """log E_Q[L^alpha], integrand centred: E_Q[L^a - 1 - a (L - 1)] (no cancellation)."""
    ratio = mp_ratio(pmf, sigma)
    a = mp.mpf(alpha)
    c_max = (len(pmf) - 1) / sigma

    def integrand(z):
        value = ratio(z)
        return mp.npdf(z) * (value**a - 1 - a * (value - 1))

    peak = float(alpha * c_max)
    return mp.log1p(mp.quad(integrand, sorted({-14.0, -3.0, 0.0, 3.0, peak, peak + 14.0})))


@pytest.mark.parametrize("sigma", [0.5, 1.0, 4.46, 111.7, 1e4])
def test_mixture_kl_matches_mpmath(sigma):
    ours = mixture_kl(single(MIXTURE), np.array([sigma]))[0]
    ref = float(mp_kl(MIXTURE, sigma))
    assert ours >= ref  # the quadrature allowance errs upwards
    assert ours == pytest.approx(ref, rel=1e-8)


@pytest.mark.parametrize("sigma", [0.3, 2.0, 50.0])
def test_kl_closed_form_single_example(sigma):
    # rho = 1: P = N(1, sigma^2), KL = 1 / (2 sigma^2) per step.
    laws = poisson_binomial(SecretGroups.from_lists([[1.0]]))
    assert mixture_kl(laws, np.array([sigma]))[0] == pytest.approx(1 / (2 * sigma**2), rel=1e-8)


def test_kl_between_moment_bounds_and_monotone():
    rng = np.random.default_rng(0)
    groups = SecretGroups.from_lists([rng.uniform(0.001, 0.05, size=n) for n in (3, 20, 75)])
    laws = poisson_binomial(groups)
    s = np.arange(laws.pmf.shape[1])
    mean, second = laws.pmf @ s, laws.pmf @ s**2
    previous = np.full(3, np.inf)
    for sigma in (0.7, 2.0, 4.46, 30.0, 300.0):
        kl = mixture_kl(laws, np.full(3, sigma))
        assert np.all(mean**2 / (2 * sigma**2) <= kl)
        assert np.all(kl <= second / (2 * sigma**2))
        assert np.all(kl < previous)  # decreasing in sigma
        previous = kl
    silent = poisson_binomial(SecretGroups.from_lists([[0.0]]))
    assert kl_bounds(silent, np.array([3.0]), 10, np.array([0.2]), np.array([0]))[0] == 0.2


def test_kl_truncated_tail_is_accounted_from_above():
    # Same law with and without the truncation: the truncated one adds a rigorous tail term.
    rhos = np.full(100, 0.05)
    exact = poisson_binomial(SecretGroups.from_lists([rhos]))
    assert exact.tail_mass[0] > 0
    pmf = np.array([1.0])
    for q in rhos:
        pmf = np.convolve(pmf, [1 - q, q])
    whole = single(pmf)
    for sigma in (3.0, 10.0):
        truncated = mixture_kl(exact, np.array([sigma]))[0]
        reference = mixture_kl(whole, np.array([sigma]))[0]
        assert truncated >= reference * (1 - 1e-12)
        assert truncated == pytest.approx(reference, rel=1e-9)


def test_kl_bounds_follow_lemma_3_2():
    laws = poisson_binomial(SecretGroups.from_lists([[0.004] * 75]))
    kl = mixture_kl(laws, np.array([111.708]))[0]
    q = kl_bounds(laws, np.array([111.708]), 2000, np.array([1e-10]), np.array([0]))[0]
    assert bernoulli_kl(q, 1e-10) == pytest.approx(2000 * kl, rel=1e-10)
    assert q == pytest.approx(5e-4, rel=2e-4)


@pytest.mark.parametrize(("sigma", "alpha"), [(0.5, 1.5), (1.0, 3.0), (4.46, 1.001), (4.46, 20.0),
                                              (111.7, 300.0), (1e4, 1.5)])
def test_log_moment_matches_mpmath(sigma, alpha):
    laws = single(MIXTURE)
    sig = np.array([sigma])
    top = alpha_ceiling(laws.pmf, sig)
    assert alpha <= top[0]
    from hush_hf.accounting.mixture import grid_size

    model = _BlockModel(laws, laws.pmf, sig, top, grid_size(laws.pmf, sig, top), np.array([True]))
    ours = model.log_moment(np.array([0]), np.array([alpha]))[0]
    ref = float(mp_log_moment(MIXTURE, sigma, alpha))
    assert ours >= ref
    assert ours == pytest.approx(ref, rel=1e-8)


@pytest.mark.parametrize(("sigma", "steps", "prior"), [(1.0, 1, 1e-3), (4.0, 100, 1e-10), (20.0, 2000, 1e-6)])
def test_rdp_closed_form_single_example(sigma, steps, prior):
    # rho = 1: D_alpha = T alpha / (2 sigma^2); min over alpha of
    # (alpha - 1) T / (2 sigma^2) + log(1/p) / alpha is at alpha* = sqrt(2 sigma^2 log(1/p) / T).
    rate, log_inv_p = steps / (2 * sigma**2), -math.log(prior)
    alpha = max(math.sqrt(log_inv_p / rate), 1.0)
    expected = prior * math.exp((alpha - 1) * rate + log_inv_p / alpha)
    laws = poisson_binomial(SecretGroups.from_lists([[1.0]]))
    ours = rdp_bounds(laws, np.array([sigma]), steps, np.array([prior]), np.array([0]))[0]
    assert ours >= min(expected, 1.0) * (1 - 1e-9)
    assert ours == pytest.approx(min(expected, 1.0), rel=1e-7)


def test_renyi_closed_form_single_example():
    laws = poisson_binomial(SecretGroups.from_lists([[1.0]]))
    sig = np.array([2.0])
    top = alpha_ceiling(laws.pmf[:, :2], sig)
    from hush_hf.accounting.mixture import grid_size

    pmf = laws.pmf[:, :2]
    one = CountDistributions(pmf, np.zeros(1), np.zeros(1), np.ones(1))
    model = _BlockModel(one, pmf, sig, top, grid_size(pmf, sig, top), np.array([True]))
    alphas = np.array([1.01, 2.0, 7.5])
    expected = alphas * (alphas - 1) / 8  # log E_Q[L^alpha] = alpha (alpha - 1) / (2 sigma^2)
    np.testing.assert_allclose(model.log_moment(np.zeros(3, dtype=int), alphas), expected, rtol=1e-8)


def test_rdp_and_kl_bounds_are_monotone():
    groups = SecretGroups.from_lists([[0.01] * 30, [0.02] * 30])  # second dominates the first
    laws = poisson_binomial(groups)
    for bound in (rdp_bounds, kl_bounds):

        def at(sigma, steps, bound=bound):
            return bound(laws, np.full(2, sigma), steps, np.full(2, 1e-6), np.arange(2))

        b = at(3.0, 500)
        assert b[1] > b[0]  # larger sampling probabilities
        assert np.all(at(3.3, 500) < b)  # more noise
        assert np.all(at(3.0, 600) > b)  # more steps


def test_renyi_truncated_tail_is_accounted_from_above():
    from hush_hf.accounting.mixture import grid_size

    rhos = np.full(100, 0.05)
    truncated = poisson_binomial(SecretGroups.from_lists([rhos]))
    assert 0 < truncated.tail_mass[0] < 1e-19
    pmf = np.array([1.0])
    for q in rhos:
        pmf = np.convolve(pmf, [1 - q, q])
    whole = single(pmf)
    sig = np.array([4.0])
    alphas = np.array([1.5, 3.0, 6.0])

    def log_moments(law):
        pi = law.pmf / law.pmf.sum()
        top = alpha_ceiling(pi, sig)
        model = _BlockModel(law, pi, sig, top, grid_size(pi, sig, top), np.array([True]))
        return model.log_moment(np.zeros(3, dtype=int), alphas)

    cut, full = log_moments(truncated), log_moments(whole)
    assert np.all(cut >= full * (1 - 2e-9))  # Minkowski's bound on the tail errs upwards (both
    # carry the 1e-9 quadrature allowance)
    assert cut[0] == pytest.approx(full[0], rel=1e-9)
    np.testing.assert_allclose(cut[1:], full[1:], rtol=1e-4)  # the Hoeffding tail is tight


@pytest.mark.parametrize("accountant", ["kl", "rdp", "tight"])
def test_certain_examples_are_handled(accountant):
    from hush_hf.accounting import calibrate_noise, posterior_bounds

    groups = SecretGroups.from_lists([[1.0, 1.0, 0.3], [0.2] * 5])  # S >= 2 always for the first
    priors, targets = np.array([1e-6, 1e-3]), np.array([1e-3, 0.05])
    cal = calibrate_noise(groups, priors, targets, 50, accountant=accountant)
    assert np.all(posterior_bounds(groups, priors, cal.sigma, 50, accountant) <= targets)
    assert np.any(posterior_bounds(groups, priors, cal.sigma * 0.999, 50, accountant) > targets)
