"""Our FFT self-composition equals dp_accounting's DensePLDPmf.self_compose (same values and +infinity
mass; our blockwise Chernoff window contains the library's), and keeps a dominating one-step PMF
dominating."""

import numpy as np
import pytest
from dp_accounting.pld import pld_pmf

from hush_hf.accounting.composition import self_compose, truncation_bounds
from hush_hf.accounting.connect_dots import one_step_pmf


@pytest.mark.parametrize(("pi", "sigma", "step", "steps"), [
    (np.array([0.7, 0.25, 0.05]), 1.5, 1e-3, 50),
    (np.array([1 - 1e-4, 1e-4]), 0.5, 2e-3, 2000),
    (np.array([0.0, 0.5, 0.5]), 2.0, 5e-3, 7),
])
def test_self_composition_matches_dp_accounting(pi, sigma, step, steps):
    one = one_step_pmf(pi, 1e-15, sigma, step)
    library = pld_pmf.DensePLDPmf(step, one.k_lo, one.masses, one.infinity, True).self_compose(steps, 1e-15)
    ours = self_compose(one.masses, one.infinity, steps, 1e-15)
    start = library._lower_loss - one.k_lo * steps - ours.lower  # the library's window inside ours
    assert start >= 0 and start + library._probs.size <= ours.probs.size
    assert ours.probs.size <= library._probs.size + 2 * steps * -(-one.masses.size // 512)
    np.testing.assert_allclose(ours.probs[start : start + library._probs.size], library._probs, atol=1e-14)
    outside = np.delete(ours.probs, np.arange(start, start + library._probs.size))
    # What the library truncates (at most its tail) plus FFT rounding, within our rounding bound.
    assert np.clip(outside, 0, None).sum() <= 1e-15 + ours.error
    assert ours.infinity == pytest.approx(library._infinity_mass, rel=1e-12)


@pytest.mark.parametrize(("size", "steps", "seed"), [(40, 9, 0), (300, 6, 1), (5, 200, 2)])
def test_rounding_error_bound_covers_the_fft_error(size, steps, seed):
    """Against direct convolution (sums of non-negative products: relative error <= T n eps per
    entry): the window's L1 distance to it is within ``error`` plus what lies outside the window
    (which the FFT wraps into it) plus the direct sums' own rounding."""
    rng = np.random.default_rng(seed)
    masses = rng.exponential(size=size) * np.exp(-rng.uniform(0, 40, size=size))  # 17 decades
    masses /= masses.sum()
    ours = self_compose(masses, 0.0, steps, 1e-12)
    exact = np.array([1.0])
    for _ in range(steps):
        exact = np.convolve(exact, masses)
    window = exact[ours.lower : ours.lower + ours.probs.size]
    outside = exact.sum() - window.sum()
    direct_rounding = steps * size * np.finfo(float).eps * exact.sum()
    distance = np.abs(ours.probs - window).sum()
    assert 0 < ours.error < 1e-11
    assert distance <= ours.error + outside + direct_rounding


def test_truncation_keeps_all_but_the_tail():
    masses = np.array([0.5, 0.3, 0.2])
    lower, upper = truncation_bounds(masses, 40, 1e-12)
    exact = np.array([1.0])
    for _ in range(40):
        exact = np.convolve(exact, masses)
    outside = exact[:lower].sum() + exact[upper + 1 :].sum()
    assert outside <= 1e-12
    assert 0 <= lower < upper < 80  # the upper tail is cut


def test_blockwise_truncation_keeps_all_but_the_tail():
    """n > 512 grid points: M(lam) is over-estimated per block; the window still holds all but the
    tail of an exact (brute-force) convolution, and is at most T block widths wider per side."""
    rng = np.random.default_rng(3)
    masses = rng.exponential(size=3000) * np.exp(-np.linspace(0, 30, 3000))
    masses /= masses.sum()
    steps, tail = 4, 1e-10
    lower, upper = truncation_bounds(masses, steps, tail)
    exact = np.array([1.0])
    for _ in range(steps):
        exact = np.convolve(exact, masses)
    assert exact[:lower].sum() + exact[upper + 1 :].sum() <= tail
    assert upper < exact.size - 1  # the bound cuts the upper tail
