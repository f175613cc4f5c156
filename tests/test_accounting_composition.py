"""Our FFT self-composition equals dp_accounting's DensePLDPmf.self_compose (same truncation, same
+infinity mass), and keeps a dominating one-step PMF dominating."""

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
    assert one.k_lo * steps + ours.lower == library._lower_loss
    assert ours.probs.size == library._probs.size
    np.testing.assert_allclose(ours.probs, library._probs, rtol=0, atol=1e-14)
    assert ours.infinity == pytest.approx(library._infinity_mass, rel=1e-12)


def test_truncation_keeps_all_but_the_tail():
    masses = np.array([0.5, 0.3, 0.2])
    lower, upper = truncation_bounds(masses, 40, 1e-12)
    exact = np.array([1.0])
    for _ in range(40):
        exact = np.convolve(exact, masses)
    outside = exact[:lower].sum() + exact[upper + 1 :].sum()
    assert outside <= 1e-12
    assert 0 <= lower < upper < 80  # the upper tail is cut
