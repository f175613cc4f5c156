"""The checks that trust no solver: exact feasibility, repair, the weak-duality bound, and presolve."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linprog

from hush_hf.planning.lp_certificate import dual_upper_bound, infeasible_rows, relative_gap, repair_feasible
from hush_hf.planning.lp_presolve import implied_upper_bounds, reduce_lp
from hush_hf.planning.lp_types import LPSolverError


def random_lp(seed: int, num_secrets: int = 20, num_examples: int = 60):
    rng = np.random.default_rng(seed)
    membership = sp.csr_matrix((rng.random((num_secrets, num_examples)) < 0.1).astype(np.float64))
    capacity = rng.uniform(0.2, 4.0, size=num_secrets)
    upper = implied_upper_bounds(membership, capacity, drop_secretless=False)
    return membership, capacity, upper


def linprog_optimum(membership, capacity, upper):
    result = linprog(-np.ones(membership.shape[1]), A_ub=membership, b_ub=capacity,
                     bounds=np.column_stack([np.zeros_like(upper), upper]), method="highs")
    assert result.status == 0
    return -result.fun, -result.ineqlin.marginals


def exact_bound(membership, capacity, upper, y) -> Fraction:
    """cap^T y + sum_i u_i max(0, 1 - (A^T y)_i) in exact rational arithmetic."""
    y = [Fraction(max(v, 0.0)) for v in y]
    column = [Fraction(0)] * membership.shape[1]
    coo = membership.tocoo()
    for j, i in zip(coo.row, coo.col, strict=True):
        column[i] += y[j]
    return sum(Fraction(c) * v for c, v in zip(capacity, y, strict=True)) + sum(
        Fraction(u) * max(Fraction(0), 1 - s) for u, s in zip(upper, column, strict=True))


@pytest.mark.parametrize("seed", range(5))
def test_any_nonnegative_dual_bounds_the_optimum(seed):
    membership, capacity, upper = random_lp(seed)
    optimum, _ = linprog_optimum(membership, capacity, upper)
    rng = np.random.default_rng(100 + seed)
    for scale in (0.0, 0.1, 1.0, 10.0):
        y = rng.exponential(scale, size=capacity.size) if scale else np.zeros(capacity.size)
        assert dual_upper_bound(membership, capacity, upper, y) >= optimum * (1 - 1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_optimal_dual_gives_the_optimum(seed):
    membership, capacity, upper = random_lp(seed)
    optimum, y = linprog_optimum(membership, capacity, upper)
    assert dual_upper_bound(membership, capacity, upper, y) == pytest.approx(optimum, rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_bound_rounds_against_us(seed):
    membership, capacity, upper = random_lp(seed)
    y = np.random.default_rng(seed).uniform(-0.2, 0.7, size=capacity.size)  # negatives are clipped
    exact = exact_bound(membership, capacity, upper, y)
    bound = dual_upper_bound(membership, capacity, upper, y)
    assert Fraction(bound) >= exact
    assert bound == pytest.approx(float(exact), rel=1e-12)


def test_bound_rejects_non_finite_duals():
    membership, capacity, upper = random_lp(0)
    y = np.zeros(capacity.size)
    y[3] = np.nan
    with pytest.raises(LPSolverError, match="non-finite"):
        dual_upper_bound(membership, capacity, upper, y)


def test_exact_row_check_catches_what_float_sums_miss():
    # Ten copies of fl(0.1) sum to 1 + 5.55e-17 exactly; left-to-right float64 gives 0.9999999999999999.
    membership = sp.csr_matrix(np.ones((1, 10)))
    weights = np.full(10, 0.1)
    assert sum(weights.tolist()) < 1.0 < Fraction(0.1) * 10
    np.testing.assert_array_equal(infeasible_rows(membership, np.array([1.0]), weights), [0])
    # ... and a row exactly at capacity is feasible.
    exactly_full = np.array([0.125] * 8 + [0.0] * 2)
    np.testing.assert_array_equal(infeasible_rows(membership, np.array([1.0]), exactly_full), [])
    tiny = sp.csr_matrix(np.ones((1, 2)))
    np.testing.assert_array_equal(infeasible_rows(tiny, np.array([1.0]), np.array([1.0, 2.0**-60])), [0])


@pytest.mark.parametrize("seed", range(5))
def test_repair_only_scales_down_and_reaches_exact_feasibility(seed):
    membership, capacity, upper = random_lp(seed)
    rng = np.random.default_rng(seed)
    weights = np.minimum(upper, rng.uniform(0.0, 1.0, size=upper.size))
    repaired = repair_feasible(membership, capacity, weights, "test")
    assert np.all(repaired <= weights) and np.all(repaired >= 0)
    assert infeasible_rows(membership, capacity, repaired).size == 0
    for j in range(membership.shape[0]):
        row = repaired[membership.indices[membership.indptr[j]:membership.indptr[j + 1]]].tolist()
        assert math.fsum([*row, -capacity[j]]) <= 0.0
    # Examples in no over-full row keep their weight exactly.
    over = infeasible_rows(membership, capacity, weights)
    touched = np.asarray(membership[over].sum(axis=0)).ravel() > 0
    np.testing.assert_array_equal(repaired[~touched], weights[~touched])
    # Feasible weights come back unchanged.
    np.testing.assert_array_equal(repair_feasible(membership, capacity, repaired, "test"), repaired)


def test_relative_gap_refuses_an_objective_above_its_bound():
    assert relative_gap(9.0, 10.0, "x") == pytest.approx(0.1)
    assert relative_gap(0.0, 0.0, "x") == 0.0
    with pytest.raises(LPSolverError, match="exceeds its certified bound"):
        relative_gap(10.0 + 1e-9, 10.0, "x")


def test_implied_upper_bounds_brute_force():
    membership, capacity, _ = random_lp(3)
    dense = membership.toarray()
    expected = [min([1.0] + [capacity[j] for j in range(dense.shape[0]) if dense[j, i]])
                for i in range(dense.shape[1])]
    np.testing.assert_array_equal(implied_upper_bounds(membership, capacity, drop_secretless=False), expected)
    dropped = implied_upper_bounds(membership, capacity, drop_secretless=True)
    secretless = dense.sum(axis=0) == 0
    assert secretless.any()
    np.testing.assert_array_equal(dropped[secretless], 0.0)
    np.testing.assert_array_equal(dropped[~secretless], np.asarray(expected)[~secretless])


def _component_count(membership: sp.csr_matrix) -> int:
    """Components of the secret-example graph by a plain union-find (rows that touch at least one column)."""
    parent = list(range(membership.shape[0] + membership.shape[1]))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    coo = membership.tocoo()
    for j, i in zip(coo.row, coo.col, strict=True):
        parent[find(j)] = find(membership.shape[0] + i)
    nodes = set(coo.row) | {membership.shape[0] + i for i in coo.col}
    return len({find(v) for v in nodes})


@pytest.mark.parametrize("batch_nnz", [1, 40, 10_000])
def test_reduce_lp_partitions_the_binding_part(batch_nnz):
    rng = np.random.default_rng(0)
    blocks = [sp.csr_matrix((rng.random((6, 20)) < 0.3).astype(np.float64)) for _ in range(7)]
    membership = sp.block_diag(blocks, format="csr")
    capacity = rng.uniform(0.5, 6.0, size=membership.shape[0])
    reduction = reduce_lp(membership, capacity, drop_secretless=False, small_component_nnz=30,
                          batch_nnz=batch_nnz)
    upper = reduction.upper
    rows = np.concatenate([b.rows for b in reduction.blocks])
    cols = np.concatenate([b.cols for b in reduction.blocks])
    assert np.unique(rows).size == rows.size == reduction.num_active_rows
    assert np.unique(cols).size == cols.size == reduction.num_active_cols
    dropped = np.setdiff1d(np.arange(membership.shape[0]), rows)
    assert np.all(membership[dropped] @ upper <= capacity[dropped])
    assert np.all(membership[rows] @ upper > capacity[rows])
    for block in reduction.blocks:  # a block holds every example of its secrets, and nothing else
        assert np.array_equal(np.unique(membership[block.rows].indices), block.cols)
        assert block.nnz == membership[block.rows].nnz
        if block.batched:  # small components only, packed up to ~batch_nnz memberships
            assert block.nnz <= 30 * block.num_components and block.nnz <= batch_nnz + 30
        else:
            assert block.num_components == 1 and block.nnz > 30
    assert {b.batched for b in reduction.blocks} == {True, False}
    assert len(reduction.blocks) == {1: 7, 40: 5, 10_000: 4}[batch_nnz]
    assert reduction.num_components == _component_count(membership[rows])
    assert sum(b.num_components for b in reduction.blocks) == reduction.num_components
