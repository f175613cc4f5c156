"""From LP weights to per-example Poisson sampling probabilities (Hush Alg. 2, line 3)."""

from __future__ import annotations

import numpy as np


def sampling_probabilities(weights: np.ndarray, expected_batch_size: float) -> np.ndarray:
    """rho_i = B * w_i / sum_i' w_i', so that E[batch size] = sum_i rho_i = B.

    Needs sum(w) >= B: with w_i <= 1 this makes every rho_i <= 1. Otherwise the retained data
    cannot fill a batch of B in expectation, and the plan is refused rather than clamped.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if not (np.isfinite(expected_batch_size) and expected_batch_size > 0):
        raise ValueError(f"expected_batch_size must be a positive number, got {expected_batch_size!r}")
    bad = ~np.isfinite(weights) | (weights < 0) | (weights > 1)
    if np.any(bad):
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(f"weights must lie in [0, 1]; example {k} has weight {float(weights[k])!r}")
    total = float(weights.sum())
    if total < expected_batch_size:
        raise ValueError(
            f"expected_batch_size={expected_batch_size} exceeds the sum of example weights {total:.6g} "
            "(the data the LP retains); lower expected_batch_size, or raise lp_c to retain more data"
        )
    rho = weights * (expected_batch_size / total)
    # w_i <= 1 and sum(w) >= B give rho_i <= 1 up to rounding; a rounding excess is removed, not hidden.
    return np.minimum(rho, 1.0)
