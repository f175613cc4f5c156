"""Planning: LP example weights, sampling probabilities and the protection plan (Hush Sec. 4)."""

from hush_hf.planning.lp import LPSolverError, WeightSolution, solve_example_weights
from hush_hf.planning.memberships import membership_matrix
from hush_hf.planning.plan import (
    SAMPLING_PROB_COLUMN,
    WEIGHT_COLUMN,
    ProtectionPlan,
    SecretReport,
    plan_protection,
)
from hush_hf.planning.probabilities import sampling_probabilities

__all__ = [
    "LPSolverError",
    "ProtectionPlan",
    "SAMPLING_PROB_COLUMN",
    "SecretReport",
    "WEIGHT_COLUMN",
    "WeightSolution",
    "membership_matrix",
    "plan_protection",
    "sampling_probabilities",
    "solve_example_weights",
]
