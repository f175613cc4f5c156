"""Input checks shared by the accountants: every bad input is a ``ValueError`` naming the field.

Messages name fields and indices only; secret strings never reach this package.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def as_probability_array(values: object, field: str) -> np.ndarray:
    """``values`` as a non-empty finite 1-D float array, else ``ValueError`` naming ``field``."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{field} must be an array of numbers") from err
    if arr.ndim != 1:
        raise ValueError(f"{field} must be 1-D (one value per secret), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{field} is empty: at least one secret is needed")
    bad = ~np.isfinite(arr)
    if bad.any():
        k = _first_bad(bad)
        raise ValueError(f"{field}[{k}] = {float(arr[k])!r} is not finite")
    return arr


def validate_targets(priors: object, targets: object) -> None:
    """Check priors p and targets r: same shape, non-empty, finite, 0 < p < r < 1."""
    p = as_probability_array(priors, "priors")
    r = as_probability_array(targets, "targets")
    if p.shape != r.shape:
        raise ValueError(f"priors has {p.size} entries but targets has {r.size}")
    bad = (p <= 0) | (p >= 1)
    if bad.any():
        k = _first_bad(bad)
        raise ValueError(f"priors[{k}] = {float(p[k])!r} is outside (0, 1)")
    bad = r >= 1
    if bad.any():
        k = _first_bad(bad)
        raise ValueError(f"targets[{k}] = {float(r[k])!r} must be < 1")
    bad = r <= p
    if bad.any():
        k = _first_bad(bad)
        raise ValueError(f"targets[{k}] = {float(r[k])!r} must exceed priors[{k}] = {float(p[k])!r}")


def validate_priors(priors: object) -> np.ndarray:
    """Priors alone (for ``posterior_bounds``): finite, in (0, 1), non-empty."""
    p = as_probability_array(priors, "priors")
    bad = (p <= 0) | (p >= 1)
    if bad.any():
        k = _first_bad(bad)
        raise ValueError(f"priors[{k}] = {float(p[k])!r} is outside (0, 1)")
    return p


def validate_steps(steps: object) -> int:
    """T, the number of training steps: an integer >= 1 (an integer-valued float is accepted)."""
    if isinstance(steps, bool) or not isinstance(steps, numbers.Real):
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    value = float(steps)
    if not math.isfinite(value) or value != math.floor(value) or value < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    return int(value)


def validate_sigma(sigma: object) -> float:
    """The noise multiplier: a finite real >= 0."""
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or not math.isfinite(float(sigma)):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r}")
    if float(sigma) < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma!r}")
    return float(sigma)


def validate_rtol(rtol: object) -> float:
    """Relative precision of the calibrated sigma: 0 < rtol <= 1e-3."""
    if isinstance(rtol, bool) or not isinstance(rtol, numbers.Real) or not math.isfinite(float(rtol)):
        raise ValueError(f"rtol must be a number in (0, 1e-3], got {rtol!r}")
    if not 0 < float(rtol) <= 1e-3:
        raise ValueError(f"rtol must be in (0, 1e-3], got {rtol!r}")
    return float(rtol)


def validate_num_secrets(num_secrets: int, priors: np.ndarray) -> None:
    """The groups and the priors/targets must describe the same secrets."""
    if priors.size != num_secrets:
        raise ValueError(f"groups has {num_secrets} secrets but priors has {priors.size} entries")
