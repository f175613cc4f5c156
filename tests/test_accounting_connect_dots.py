"""The one-step connect-the-dots PMF: every mass is an upper bound of the exact one (mpmath, 40 digits),
and close to it, including the jump of the privacy loss at log P(S=0) and laws without an atom at 0."""

import math

import mpmath
import numpy as np
import pytest

from hush_hf.accounting.connect_dots import _mixture, _thresholds, loss_range, one_step_pmf

mpmath.mp.dps = 40


def _exact_masses(pi: np.ndarray, sigma: float, k_lo: int, size: int, step: float):
    """Exact connect-the-dots masses on eps_k = k step (k = k_lo..k_lo+size-1) and the mass above, for
    the law P(S = s) = pi_s (s >= 1), P(S = 0) = 1 - sum_{s>=1} pi_s (how ``one_step_pmf`` reads pi)."""
    pi = [mpmath.mpf(float(v)) for v in pi]
    if pi[0] > 0:
        pi[0] = 1 - sum(pi[1:])
    c = [mpmath.mpf(s) / sigma for s in range(len(pi))]

    def ratio(y):
        return sum(w * mpmath.exp(cs * y - cs * cs / 2) for w, cs in zip(pi, c, strict=True) if w > 0)

    def threshold(eps):
        if pi[0] > 0 and eps <= mpmath.log(pi[0]):
            return -mpmath.inf
        target = mpmath.exp(eps)
        lo, hi = mpmath.mpf(-80), mpmath.mpf(80)
        for _ in range(200):  # bisection: L is increasing
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ratio(mid) < target else (lo, mid)
        return (lo + hi) / 2

    def p_survival(y):
        return sum(w * mpmath.ncdf(cs - y) for w, cs in zip(pi, c, strict=True) if w > 0)

    def p_cdf(y):
        return sum(w * mpmath.ncdf(y - cs) for w, cs in zip(pi, c, strict=True) if w > 0)

    def cell(upper, lower, k):  # difference of whichever pair is small: no digits lost near 1
        small_side = lower[k + 1] < upper[k]
        return lower[k + 1] - lower[k] if small_side else upper[k] - upper[k + 1]

    eps = [mpmath.mpf(k_lo + i) * mpmath.mpf(step) for i in range(size)]
    ys = [threshold(e) for e in eps]
    p_surv = [p_survival(y) for y in ys]
    q_surv = [mpmath.ncdf(-y) for y in ys]
    p_low = [p_cdf(y) for y in ys]
    q_low = [mpmath.ncdf(y) for y in ys]
    d = mpmath.mpf(step)
    masses = [mpmath.mpf(0)] * size
    if pi[0] == 0:  # loss below the lowest grid point is moved up to it
        masses[0] += p_low[0]
    for k in range(size - 1):
        cell_p, cell_q = cell(p_surv, p_low, k), cell(q_surv, q_low, k)
        gamma = mpmath.exp(eps[k])
        masses[k + 1] += (cell_p - gamma * cell_q) / (1 - mpmath.exp(-d))
        masses[k] += (gamma * mpmath.exp(d) * cell_q - cell_p) / mpmath.expm1(d)
    return np.array([float(m) for m in masses]), float(p_surv[-1])


@pytest.mark.parametrize(
    ("pi", "sigma", "step"),
    [
        (np.array([0.7, 0.25, 0.05]), 1.5, 0.05),
        (np.array([1 - 1e-4, 1e-4]), 0.5, 0.03),  # rarely sampled: the loss jumps at log(1 - 1e-4)
        (np.array([1 - 1e-7, 1e-7]), 2.0, 0.004),
        (np.array([0.0, 0.5, 0.5]), 2.0, 0.05),  # no atom at S = 0: no jump, a lower tail instead
    ],
)
def test_masses_dominate_the_exact_connect_the_dots_masses(pi, sigma, step):
    ours = one_step_pmf(pi, 0.0, sigma, step)
    exact, above = _exact_masses(pi, sigma, ours.k_lo, ours.masses.size, step)
    assert np.all(ours.masses >= exact)  # the guarantee: point by point upper bounds
    assert ours.infinity >= above
    scale = np.maximum(exact, 1e-300)
    assert np.max((ours.masses - exact) / scale) < 1e-6 or np.max(ours.masses - exact) < 1e-13
    total = ours.masses.sum() + ours.infinity  # the margins only add (THRESHOLD_MARGIN = 1e-11)
    assert 1.0 <= total <= 1.0 + 1e-10


def test_jump_cell_holds_almost_all_mass_when_rarely_sampled():
    rate = 1e-4
    ours = one_step_pmf(np.array([1 - rate, rate]), 0.0, 0.3, 1e-3)
    jump = math.log1p(-rate)
    assert ours.k_lo == math.floor(jump / 1e-3)  # the lowest grid point is the jump's cell
    # Under P the loss stays within 0.05 of the jump unless S = 1 or y > 3.5 (P(S=0 and y > 3.5) < 3e-4).
    assert ours.masses[ours.losses > jump + 0.05].sum() < rate + 3e-4
    assert ours.masses[0] > 0  # mass just above the jump is split onto its cell's lower end


def test_tail_above_count_truncation_goes_to_infinity():
    pi = np.array([0.9, 0.1])
    plain = one_step_pmf(pi, 0.0, 1.0, 0.01)
    with_tail = one_step_pmf(pi, 1e-6, 1.0, 0.01)
    assert with_tail.infinity == pytest.approx(plain.infinity * (1 - 1e-6) + 1e-6, rel=1e-12)
    np.testing.assert_allclose(with_tail.masses, plain.masses * (1 - 1e-6), rtol=1e-12)


@pytest.mark.parametrize("sigma", [8.4, 0.8, 0.3])
def test_thresholds_are_solved_to_rounding_for_many_components(sigma):
    # The law of the calibration bench (75 examples at rho = 0.004, 17 counts): Newton stops on its
    # error bound, not on a vanishing step; the result must still be the root to a few ulp (the
    # problem's own conditioning, ~sigma |t| ulp, is what is left: 24 ulp at sigma = 8.4).
    pmf = np.array([1.0])
    for _ in range(75):
        pmf = np.convolve(pmf, [0.996, 0.004])
    pi = pmf[:17] / pmf[:17].sum()
    span = loss_range(pi, sigma)
    eps = np.linspace(span.low, span.high, 31)[1:]
    ours = _thresholds(_mixture(pi, sigma), eps, (span.y_low, span.y_high))
    weights = [mpmath.mpf(float(w)) for w in pi]
    c = [mpmath.mpf(s) / mpmath.mpf(sigma) for s in range(pi.size)]
    for e, y in zip(eps, ours, strict=True):
        target = mpmath.exp(mpmath.mpf(float(e))) - weights[0]  # L(y) - pi_0 over s >= 1
        lo, hi = mpmath.mpf(-80), mpmath.mpf(80)
        for _ in range(150):
            mid = (lo + hi) / 2
            terms = zip(weights[1:], c[1:], strict=True)
            value = sum(w * mpmath.exp(cs * mid - cs * cs / 2) for w, cs in terms)
            lo, hi = (mid, hi) if value < target else (lo, mid)
        exact = float((lo + hi) / 2)
        assert abs(y - exact) <= 64 * np.finfo(float).eps * (1 + abs(exact))
