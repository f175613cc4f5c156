"""Bad input to solve_example_weights: a ValueError naming the field and the value, before any work."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import hush_hf.planning.lp as lp_module
from hush_hf.planning.lp import LPSolverError, solve_example_weights


def good():
    membership = sp.csr_matrix(np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]))
    return membership, np.array([1.0, 1.5])


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    """Validation must come first: any presolve call during these tests is a failure."""
    def forbidden(*args, **kwargs):
        raise AssertionError("reduce_lp ran before the input was validated")
    monkeypatch.setattr(lp_module, "reduce_lp", forbidden)


@pytest.mark.parametrize(
    ("capacity", "pattern"),
    [
        (np.array([1.0]), r"capacity must have shape \(2,\).*got \(1,\)"),
        (np.array([[1.0, 1.0]]), r"capacity must have shape \(2,\).*got \(1, 2\)"),
        (np.array([1.0, 0.0]), r"capacity\[1\] = 0\.0"),
        (np.array([-2.0, 1.0]), r"capacity\[0\] = -2\.0"),
        (np.array([1.0, np.nan]), r"capacity\[1\] = nan"),
        (np.array([np.inf, 1.0]), r"capacity\[0\] = inf"),
        ("abc", r"capacity must be an array of numbers"),
    ],
)
def test_bad_capacity(capacity, pattern):
    membership, _ = good()
    with pytest.raises(ValueError, match=pattern):
        solve_example_weights(membership, capacity)


@pytest.mark.parametrize(
    ("value", "shown"),
    [(2.0, "2.0"), (0.5, "0.5"), (-1.0, "-1.0"), (np.nan, "nan"), (np.inf, "inf")],
)
def test_non_binary_membership_entry_is_named(value, shown):
    dense = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    dense[1, 2] = value
    with pytest.raises(ValueError, match=rf"membership\[1, 2\] = {shown}"):
        solve_example_weights(sp.csr_matrix(dense), np.ones(2))


def test_duplicate_coo_entries_sum_to_a_non_binary_value():
    membership = sp.coo_matrix((np.ones(3), ([0, 0, 1], [2, 2, 0])), shape=(2, 3))
    with pytest.raises(ValueError, match=r"membership\[0, 2\] = 2\.0"):
        solve_example_weights(membership, np.ones(2))


def test_example_index_out_of_range():
    bad = sp.csr_matrix((2, 3))
    bad.indptr = np.array([0, 1, 1])
    bad.indices = np.array([7])
    bad.data = np.array([1.0])
    with pytest.raises(ValueError, match=r"membership has example index 7 out of range \[0, 3\)"):
        solve_example_weights(bad, np.ones(2))


def test_secret_index_out_of_range_in_coo():
    bad = sp.coo_matrix((np.ones(1), ([0], [0])), shape=(2, 3))
    bad.row = np.array([5], dtype=np.int32)
    with pytest.raises(ValueError, match=r"membership has secret index 5 out of range \[0, 2\)"):
        solve_example_weights(bad, np.ones(2))


def test_membership_must_be_sparse():
    with pytest.raises(ValueError, match=r"membership must be a scipy.sparse matrix, got ndarray"):
        solve_example_weights(np.ones((2, 3)), np.ones(2))


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"gap_tol": 0.0}, r"gap_tol must be a number in \(0, 1\), got 0\.0"),
        ({"gap_tol": 1.5}, r"gap_tol .* got 1\.5"),
        ({"gap_tol": float("nan")}, r"gap_tol .* got nan"),
        ({"gap_tol": "0.01"}, r"gap_tol .* got '0\.01'"),
        ({"time_limit": 0}, r"time_limit must be None or a finite number > 0, got 0"),
        ({"time_limit": -1.0}, r"time_limit .* got -1\.0"),
        ({"time_limit": float("inf")}, r"time_limit .* got inf"),
        ({"drop_secretless": "yes"}, r"drop_secretless must be a bool, got 'yes'"),
        ({"progress": 1}, r"progress must be a bool, got 1"),
        ({"solver": "gurobi"}, r"solver must be 'highs'.*got 'gurobi'"),
        ({"solver": "highs:barrier"}, r"solver 'highs:barrier'"),
        ({"solver": "pulp:NOPE"}, r"solver 'pulp:NOPE' is unknown to PuLP"),
        ({"solver": None}, r"solver must be a string"),
    ],
)
def test_bad_options(kwargs, pattern):
    membership, capacity = good()
    with pytest.raises(ValueError, match=pattern):
        solve_example_weights(membership, capacity, **kwargs)


def test_unavailable_pulp_solver_is_an_lp_solver_error():
    import pulp

    unavailable = next((s for s in pulp.listSolvers() if s not in pulp.listSolvers(onlyAvailable=True)), None)
    assert unavailable is not None
    membership, capacity = good()
    with pytest.raises(LPSolverError, match=rf"solver 'pulp:{unavailable}'.*not available"):
        solve_example_weights(membership, capacity, solver=f"pulp:{unavailable}")
