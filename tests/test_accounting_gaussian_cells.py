"""Masses and moments of the standard normal law on cells, against mpmath at 60-80 digits: every
computed value lies within its own error bound of the exact one, and the bounds are relative (a cell
of width 1e-9 keeps ~13 digits, where a difference of cdfs keeps ~7)."""

import math

import mpmath
import numpy as np
import pytest
from scipy import special

from hush_hf.accounting.gaussian_cells import interval_mass, narrow_moments, ndtr_error


def exact_mass(a: float, b: float) -> mpmath.mpf:
    if a >= 0:  # on the side where both operands are small, so that 80 digits suffice
        return mpmath.ncdf(-mpmath.mpf(a)) - mpmath.ncdf(-mpmath.mpf(b))
    return mpmath.ncdf(mpmath.mpf(b)) - mpmath.ncdf(mpmath.mpf(a))


def exact_moment(x: float, h: float, direction: float, j: int) -> mpmath.mpf:
    """int_0^h t^j phi(x + s t) dt = phi(x) h^{j+1} int_0^1 u^j e^{-s x h u - h^2 u^2 / 2} du
    (s = direction), a smooth integrand on [0, 1]."""
    x, h = mpmath.mpf(x), mpmath.mpf(h)

    def integrand(u):
        return u**j * mpmath.exp(-direction * x * h * u - h * h * u * u / 2)

    return mpmath.npdf(x) * h ** (j + 1) * mpmath.quad(integrand, [0, 0.5, 1], method="gauss-legendre")


def test_ndtr_error_bound_holds_across_the_range():
    mpmath.mp.dps = 40
    xs = np.concatenate([np.linspace(-37.5, 8.0, 1500), -np.geomspace(1e-8, 37, 300)])
    computed = special.ndtr(xs)
    for x, value, bound in zip(xs, computed, ndtr_error(xs), strict=True):
        exact = mpmath.ncdf(mpmath.mpf(x))
        assert abs(mpmath.mpf(value) - exact) <= bound * exact, x


def test_interval_masses_are_within_their_bounds():
    mpmath.mp.dps = 80
    rng = np.random.default_rng(1)
    a = rng.uniform(-38, 38, size=1500)
    b = a + 10 ** rng.uniform(-10, 1.5, size=a.size)
    a[rng.uniform(size=a.size) < 0.05] = -np.inf
    b[rng.uniform(size=b.size) < 0.05] = np.inf
    masses, errors = interval_mass(a, b)
    for lo, hi, mass, error in zip(a, b, masses, errors, strict=True):
        assert abs(mpmath.mpf(mass) - exact_mass(lo, hi)) <= error, (lo, hi)
    # a difference keeps the operands' absolute precision: ~1e-9 relative on a cell of width 1e-5
    m, e = interval_mass(np.array([0.3]), np.array([0.3 + 1e-5]))
    assert 1e-10 < e[0] / m[0] < 1e-8


@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_narrow_moments_are_within_their_bounds_and_relative(direction):
    mpmath.mp.dps = 50
    rng = np.random.default_rng(2 if direction > 0 else 3)
    x = rng.uniform(-38, 38, size=150)
    h = 10 ** rng.uniform(-9, -1.5, size=x.size)  # |x| h up to 1.2
    moments, errors = narrow_moments(x, h, direction, 7)
    checked = 0
    for i in range(x.size):
        if not np.all(errors[i] <= 1e-12 * moments[i] + 1e-300):  # left to the closed-form route
            continue
        checked += 1
        for j in range(8):
            exact = exact_moment(x[i], h[i], direction, j)
            assert abs(mpmath.mpf(moments[i, j]) - exact) <= errors[i, j], (x[i], h[i], j)
    assert checked > 100
    # a cell of width 1e-9 at x = 2: the mass to ~1e-15 relative (a difference of cdfs keeps ~1e-6)
    m, e = narrow_moments(np.array([2.0]), np.array([1e-9]), direction, 2)
    assert e[0, 0] / m[0, 0] < 1e-13
    assert m[0, 0] == pytest.approx(1e-9 * math.exp(-2.0) / math.sqrt(2 * math.pi), rel=1e-8)
