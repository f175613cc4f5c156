"""The three accountants behind one interface, keyed by name (``ACCOUNTANTS``).

Each maps (laws of S, one sigma per law, steps T, queries (law index, prior), their targets or None)
to rigorous upper bounds on the posterior, and offers a cheap sigma estimate used only to decide what
to evaluate first (never to certify anything).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hush_hf.accounting.blowup import tight_bounds
from hush_hf.accounting.budgets import bernoulli_kl, gaussian_gap
from hush_hf.accounting.counts import CountDistributions
from hush_hf.accounting.kl import kl_bounds
from hush_hf.accounting.renyi import rdp_bounds

BoundFn = Callable[
    [CountDistributions, np.ndarray, int, np.ndarray, np.ndarray, np.ndarray | None], np.ndarray
]


@dataclass(frozen=True)
class Accountant:
    """``bounds(laws, sigma_per_law, steps, priors, law_of_query, targets)``; ``estimate_sigma`` ranks
    only. ``targets`` (or None) is what each bound will be compared with: an accountant may skip work
    that cannot change whether a bound meets it."""

    name: str
    bounds: BoundFn
    sigma_factor: float  # sigma_j ~ factor * sqrt(T) * E[S_j] / gap_j (DESIGN Sec. 3)
    gap: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def estimate_sigma(
        self, mean: np.ndarray, priors: np.ndarray, targets: np.ndarray, steps: int
    ) -> np.ndarray:
        """Linear-in-E[S] estimate of each secret's own sigma_j (for ranking)."""
        return self.sigma_factor * np.sqrt(steps) * mean / self.gap(priors, targets)


def _sqrt_two_mu(priors: np.ndarray, targets: np.ndarray) -> np.ndarray:
    return np.sqrt(2.0 * bernoulli_kl(targets, priors))


ACCOUNTANT_IMPLEMENTATIONS: dict[str, Accountant] = {
    "tight": Accountant("tight", tight_bounds, 1.02, gaussian_gap),
    "rdp": Accountant("rdp", rdp_bounds, 1.085, gaussian_gap),
    "kl": Accountant("kl", kl_bounds, 1.0, _sqrt_two_mu),
}
