"""Shared types of the example-weight LP: the error it raises and one block's raw solver answer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class LPSolverError(ValueError):
    """The LP solver failed, timed out, or its answer could not be certified to the requested gap."""


@dataclass(frozen=True)
class BlockAnswer:
    """A solver's unverified answer for one block: max 1^T w s.t. A w <= cap, 0 <= w <= ub.

    ``weights`` and ``duals`` (one per row, y >= 0 up to solver noise) are taken as suggestions only;
    the caller repairs and certifies them (``lp_certificate``). ``status`` is the solver's own status
    string; ``exact`` says whether the solver claims a vertex-optimal answer (simplex, CBC, ...).
    """

    weights: np.ndarray
    duals: np.ndarray
    status: str
    method: str
    exact: bool
    timed_out: bool
    seconds: float
