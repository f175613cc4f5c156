"""solve_example_weights against independent references (scipy linprog/HiGHS, PuLP CBC) and its guards."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

import hush_hf.planning.lp as lp_module
from hush_hf.planning.lp import LPSolverError, WeightSolution, solve_example_weights
from hush_hf.planning.lp_backends import Backend
from hush_hf.planning.lp_certificate import infeasible_rows
from hush_hf.planning.lp_highs import solve_block_highs
from hush_hf.planning.lp_pulp import solve_block_pulp
from hush_hf.planning.lp_types import BlockAnswer

ALL_SOLVERS = ["highs", "highs:simplex", "highs:ipm", "highs:pdlp", "pulp", "pulp:CBC", "pulp:HiGHS"]
EXACT_SOLVERS = ["highs", "highs:simplex", "pulp", "pulp:CBC", "pulp:HiGHS"]


def random_instance(seed: int, num_secrets: int = 25, num_examples: int = 70, density: float = 0.08):
    """0/1 membership with some secretless examples, some empty secrets, capacities in [0.3, 4]."""
    rng = np.random.default_rng(seed)
    dense = rng.random((num_secrets, num_examples)) < density
    membership = sp.csr_matrix(dense.astype(np.float64))
    capacity = rng.uniform(0.3, 4.0, size=num_secrets)
    return membership, capacity


def clustered_instance(seed: int, clusters: int = 6, secrets_per: int = 8, examples_per: int = 30):
    """Block-diagonal instance: several components plus some secrets that can never bind."""
    rng = np.random.default_rng(seed)
    blocks = [sp.csr_matrix((rng.random((secrets_per, examples_per)) < 0.25).astype(np.float64))
              for _ in range(clusters)]
    membership = sp.block_diag(blocks, format="csr")
    sizes = np.diff(membership.indptr)
    capacity = rng.uniform(0.5, 5.0, size=membership.shape[0])
    capacity[::3] = sizes[::3] + 0.5  # |D_j| < cap_j: presolve drops these rows
    return membership, capacity


def reference_optimum(membership, capacity, upper=None) -> float:
    """max 1^T w s.t. A w <= cap, 0 <= w <= upper, by scipy's linprog (HiGHS) on the undecomposed LP."""
    num_examples = membership.shape[1]
    upper = np.ones(num_examples) if upper is None else upper
    result = linprog(-np.ones(num_examples), A_ub=membership, b_ub=capacity,
                     bounds=np.column_stack([np.zeros(num_examples), upper]), method="highs")
    assert result.status == 0, result.message
    return -result.fun


def assert_feasible(membership: sp.csr_matrix, capacity: np.ndarray, weights: np.ndarray) -> None:
    """0 <= w <= 1 and A w <= cap, every row summed exactly (math.fsum is correctly rounded)."""
    assert weights.shape == (membership.shape[1],)
    assert np.all(weights >= 0.0) and np.all(weights <= 1.0)
    for j in range(membership.shape[0]):
        row = weights[membership.indices[membership.indptr[j]:membership.indptr[j + 1]]].tolist()
        assert math.fsum([*row, -capacity[j]]) <= 0.0, f"secret {j} over capacity"


@pytest.mark.parametrize("solver", ALL_SOLVERS)
@pytest.mark.parametrize("seed", range(3))
def test_objective_matches_linprog_within_certified_gap(solver, seed):
    membership, capacity = random_instance(seed)
    optimum = reference_optimum(membership, capacity)
    solution = solve_example_weights(membership, capacity, solver=solver, gap_tol=1e-2)
    assert isinstance(solution, WeightSolution)
    assert_feasible(membership, capacity, solution.weights)
    assert solution.objective == pytest.approx(math.fsum(solution.weights.tolist()), rel=1e-15)
    assert solution.upper_bound >= optimum * (1 - 1e-12)
    assert solution.objective <= optimum * (1 + 1e-12)
    assert solution.objective >= (1 - 1e-2) * optimum
    assert solution.gap == pytest.approx((solution.upper_bound - solution.objective) / solution.upper_bound)
    assert 0 <= solution.gap <= 1e-2
    assert len(solution.block_gaps) == solution.num_blocks
    assert all(0 <= g <= 1e-2 for g in solution.block_gaps)
    assert solution.solver == solver


@pytest.mark.parametrize("solver", EXACT_SOLVERS)
def test_exact_solvers_are_optimal_and_tight(solver):
    membership, capacity = random_instance(7, num_secrets=40, num_examples=120)
    optimum = reference_optimum(membership, capacity)
    solution = solve_example_weights(membership, capacity, solver=solver)
    assert solution.status == "optimal"
    assert solution.objective == pytest.approx(optimum, rel=1e-7)
    assert solution.gap <= 1e-7


def test_tighter_gap_tol_is_honoured_by_first_order_path():
    membership, capacity = random_instance(3, num_secrets=60, num_examples=200)
    optimum = reference_optimum(membership, capacity)
    solution = solve_example_weights(membership, capacity, solver="highs:pdlp", gap_tol=1e-4)
    assert solution.gap <= 1e-4
    assert solution.objective >= (1 - 1e-4) * optimum
    assert solution.status == "gap_reached"


def test_decomposition_gives_the_undecomposed_optimum(monkeypatch):
    membership, capacity = clustered_instance(0)
    optimum = reference_optimum(membership, capacity)
    batched = solve_example_weights(membership, capacity)
    assert batched.num_components >= 4
    assert batched.num_active_secrets < membership.shape[0]
    assert batched.objective == pytest.approx(optimum, rel=1e-9)
    # One batch per component, then every component as a "large" block (first-order path).
    monkeypatch.setattr(lp_module, "BATCH_NNZ", 1)
    per_component = solve_example_weights(membership, capacity)
    assert per_component.num_blocks == per_component.num_components
    assert per_component.objective == pytest.approx(optimum, rel=1e-9)
    monkeypatch.setattr(lp_module, "SMALL_COMPONENT_NNZ", 0)
    large = solve_example_weights(membership, capacity, gap_tol=1e-3)
    assert set(large.methods) == {"highs:pdlp"} and large.status == "gap_reached"
    assert optimum * (1 - 1e-3) <= large.objective <= optimum * (1 + 1e-12) <= large.upper_bound * (1 + 1e-12)


def skewed_instance(seed: int, num_examples: int, num_secrets: int, sizes=(10, 20), c: float = 2.0):
    """Bench-like structure at test size: secrets draw examples by a lognormal popularity; cap ~ c * 3."""
    rng = np.random.default_rng(seed)
    popularity = rng.lognormal(0.0, 1.0, size=num_examples)
    popularity /= popularity.sum()
    rows, cols = [], []
    for j in range(num_secrets):
        members = rng.choice(num_examples, size=rng.integers(*sizes), replace=False, p=popularity)
        rows.extend([j] * members.size)
        cols.extend(members.tolist())
    membership = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(num_secrets, num_examples))
    return membership, c * rng.uniform(2.8, 3.3, size=num_secrets)


@pytest.mark.parametrize(("c", "gap_tol"), [(0.25, 1e-2), (1.0, 1e-2), (4.0, 1e-3)])
def test_first_order_path_on_skewed_memberships(monkeypatch, c, gap_tol):
    membership, capacity = skewed_instance(11, num_examples=3000, num_secrets=300, c=c)
    optimum = reference_optimum(membership, capacity)
    monkeypatch.setattr(lp_module, "SMALL_COMPONENT_NNZ", 0)  # the path large components take
    solution = solve_example_weights(membership, capacity, gap_tol=gap_tol)
    assert set(solution.methods) <= {"highs:pdlp", "highs:ipm"}
    assert_feasible(membership, capacity, solution.weights)
    assert optimum * (1 - gap_tol) <= solution.objective <= optimum * (1 + 1e-12)
    assert solution.upper_bound >= optimum * (1 - 1e-12)
    over_capacity = membership @ np.ones(membership.shape[1]) > capacity
    assert over_capacity.mean() > 0.5  # the instance is not trivial


@pytest.mark.slow
def test_benchmark_instance_reaches_one_percent():
    """200K examples x 20K secrets (bench/lp_scale.py); docs/design.md: plain HiGHS took 162-268 s."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "lp_scale.py"
    spec = importlib.util.spec_from_file_location("lp_scale", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    instance = bench.make_instance(200_000, 20_000)
    for c in (0.25, 4.0):
        capacity = c * instance.budget
        solution = solve_example_weights(instance.membership, capacity, time_limit=300)
        assert solution.gap <= 1e-2
        assert infeasible_rows(instance.membership, capacity, solution.weights).size == 0
        assert solution.num_components >= 1 and solution.status == "gap_reached"


@pytest.mark.parametrize("solver", ["highs", "highs:pdlp", "highs:ipm", "pulp"])
@pytest.mark.parametrize("scale", [1e-9, 1e-4, 1.0])
def test_tiny_capacities_are_solved_to_the_same_relative_gap(solver, scale):
    """With capacities <= 1 the LP is homogeneous: OPT(scale * cap) = scale * OPT(cap) for scale <= 1.
    The paper's budgets c * mu_j put capacities near 1e-4, where absolute solver tolerances bite."""
    membership, capacity = random_instance(9, num_secrets=40, num_examples=120, density=0.1)
    capacity = capacity / capacity.max()
    secretless = np.asarray(membership.sum(axis=0)).ravel() == 0
    optimum = reference_optimum(membership, capacity, np.where(secretless, 0.0, 1.0))
    solution = solve_example_weights(membership, scale * capacity, solver=solver, drop_secretless=True)
    assert_feasible(membership, scale * capacity, solution.weights)
    assert scale * optimum * (1 - 1e-2) <= solution.objective <= scale * optimum * (1 + 1e-9)
    assert solution.upper_bound >= scale * optimum * (1 - 1e-9)


def test_presolved_secrets_keep_full_weight():
    membership, capacity = clustered_instance(1)
    solution = solve_example_weights(membership, capacity)
    sizes = np.diff(membership.indptr)
    never_binding = sizes <= capacity
    free = np.asarray(membership[~never_binding].sum(axis=0)).ravel() == 0
    assert np.count_nonzero(free) > 0
    assert np.all(solution.weights[free] == 1.0)


def test_capacities_below_one_bound_each_weight():
    membership = sp.csr_matrix(np.array([[1.0, 0, 0], [0, 1, 1], [0, 0, 1]]))
    capacity = np.array([0.25, 1.5, 0.5])
    solution = solve_example_weights(membership, capacity, solver="highs:simplex")
    np.testing.assert_allclose(solution.weights, [0.25, 1.0, 0.5])
    assert solution.objective == pytest.approx(1.75) and solution.upper_bound == pytest.approx(1.75)


@pytest.mark.parametrize("solver", ["highs", "pulp"])
def test_drop_secretless(solver):
    membership, capacity = random_instance(4, density=0.03)
    secretless = np.asarray(membership.sum(axis=0)).ravel() == 0
    assert np.count_nonzero(secretless) >= 5
    kept = solve_example_weights(membership, capacity, solver=solver)
    dropped = solve_example_weights(membership, capacity, solver=solver, drop_secretless=True)
    assert np.all(kept.weights[secretless] == 1.0)
    assert np.all(dropped.weights[secretless] == 0.0)
    assert dropped.num_secretless == kept.num_secretless == np.count_nonzero(secretless)
    assert kept.objective - dropped.objective == pytest.approx(np.count_nonzero(secretless), rel=1e-9)
    upper = np.where(secretless, 0.0, 1.0)
    assert dropped.objective == pytest.approx(reference_optimum(membership, capacity, upper), rel=1e-9)


def test_empty_problems():
    none = solve_example_weights(sp.csr_matrix((0, 4)), np.zeros(0))
    np.testing.assert_array_equal(none.weights, np.ones(4))
    assert none.objective == 4.0 and none.gap < 1e-15 and none.status == "optimal"
    no_examples = solve_example_weights(sp.csr_matrix((3, 0)), np.ones(3))
    assert no_examples.weights.shape == (0,) and no_examples.objective == 0.0 and no_examples.gap == 0.0
    all_dropped = solve_example_weights(sp.csr_matrix((2, 3)), np.ones(2), drop_secretless=True)
    np.testing.assert_array_equal(all_dropped.weights, np.zeros(3))


def test_progress_logs_each_step(caplog):
    membership, capacity = clustered_instance(2)
    with caplog.at_level("INFO", logger="hush_hf.planning.lp"):
        solution = solve_example_weights(membership, capacity, progress=True)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("LP presolve:") for m in messages)
    assert sum("LP block of" in m for m in messages) == solution.num_blocks


def test_explicit_zeros_mean_not_a_member():
    membership = sp.csr_matrix((np.array([1.0, 0.0]), np.array([0, 1]), np.array([0, 2])), shape=(1, 2))
    solution = solve_example_weights(membership, np.array([0.5]))
    np.testing.assert_allclose(solution.weights, [0.5, 1.0])


def _hard_instance(seed: int = 0, num_examples: int = 6000, num_secrets: int = 600):
    """One large component where every secret is over capacity at w = 1."""
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(num_secrets), 40)
    cols = rng.integers(0, num_examples, size=rows.size)
    membership = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(num_secrets, num_examples))
    membership.data[:] = 1.0
    return membership, rng.uniform(3.0, 6.0, size=num_secrets)


@pytest.mark.parametrize("solver", ["highs", "highs:simplex", "pulp"])
def test_tiny_time_limit_raises_and_returns_nothing(solver):
    membership, capacity = _hard_instance()
    with pytest.raises(LPSolverError, match="time limit"):
        solve_example_weights(membership, capacity, solver=solver, time_limit=1e-6)


@pytest.mark.parametrize("name", ["PULP_CBC_CMD", "HiGHS"])
def test_pulp_time_out_reported_as_optimal_is_rejected(name):
    """docs/design.md#lp-solvers: PuLP says "Optimal" after a solver's time-out (wrong objective; CBC's
    point was infeasible here). The backend must refuse it."""
    membership, capacity = _hard_instance(1, num_examples=12000, num_secrets=1200)
    with pytest.raises(LPSolverError, match=f"pulp:{name}"):
        solve_block_pulp(membership, capacity, np.ones(membership.shape[1]), method=name, tolerance=0.0,
                         time_limit=0.01, verbose=False)


def _fake_backend(answer_fn, exact=True, timed_out=False):
    def solve(csr, capacity, upper, *, method, tolerance, time_limit, verbose):
        weights, duals = answer_fn(csr, capacity, upper)
        return BlockAnswer(weights, duals, "Optimal", "fake", exact, timed_out, 0.0)
    return Backend("fake", solve, "simplex")


def test_a_solver_claiming_optimal_with_a_wrong_answer_is_caught(monkeypatch):
    membership, capacity = random_instance(5)
    # All-ones weights (infeasible) and a zero dual (bound = number of examples): "Optimal", but not so.
    fake = _fake_backend(lambda a, c, u: (np.ones(a.shape[1]), np.zeros(a.shape[0])))
    monkeypatch.setattr(lp_module, "parse_solver", lambda solver: fake)
    with pytest.raises(LPSolverError, match="no attempt reached gap_tol"):
        solve_example_weights(membership, capacity)


def test_slightly_infeasible_answers_are_repaired_down(monkeypatch):
    membership, capacity = random_instance(6)
    exact = solve_example_weights(membership, capacity, solver="highs:simplex")
    block_duals = {}

    def nudged(a, c, u):  # the optimum of the block, pushed 1e-6 over every bound and capacity
        reference = linprog(-np.ones(a.shape[1]), A_ub=a, b_ub=c, bounds=np.column_stack([0 * u, u]),
                            method="highs")
        block_duals["y"] = -reference.ineqlin.marginals
        return reference.x * (1 + 1e-6) + 1e-6, -reference.ineqlin.marginals

    monkeypatch.setattr(lp_module, "parse_solver", lambda solver: _fake_backend(nudged))
    repaired = solve_example_weights(membership, capacity)
    assert_feasible(membership, capacity, repaired.weights)
    assert repaired.objective == pytest.approx(exact.objective, rel=1e-5)
    assert repaired.objective <= exact.objective * (1 + 1e-12)


def test_time_out_without_the_gap_raises(monkeypatch):
    membership, capacity = random_instance(8)
    fake = _fake_backend(lambda a, c, u: (np.zeros(a.shape[1]), np.zeros(a.shape[0])), timed_out=True)
    monkeypatch.setattr(lp_module, "parse_solver", lambda solver: fake)
    with pytest.raises(LPSolverError, match="time limit reached without reaching gap_tol"):
        solve_example_weights(membership, capacity, time_limit=60)


@st.composite
def instances(draw):
    num_secrets = draw(st.integers(0, 12))
    num_examples = draw(st.integers(0, 30))
    cell = st.tuples(st.integers(0, max(num_secrets - 1, 0)), st.integers(0, max(num_examples - 1, 0)))
    cells = draw(st.lists(cell, max_size=num_secrets * num_examples // 3 + 1, unique=True))
    if num_secrets == 0 or num_examples == 0:
        cells = []
    rows = np.array([c[0] for c in cells], dtype=np.int64)
    cols = np.array([c[1] for c in cells], dtype=np.int64)
    membership = sp.csr_matrix((np.ones(len(cells)), (rows, cols)), shape=(num_secrets, num_examples))
    capacity = np.array(draw(st.lists(st.floats(1e-3, 8.0), min_size=num_secrets, max_size=num_secrets)))
    return membership, capacity


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.sampled_from(["highs", "highs:pdlp"]), st.booleans())
def test_invariants(instance, solver, drop_secretless):
    membership, capacity = instance
    solution = solve_example_weights(membership, capacity, solver=solver, drop_secretless=drop_secretless)
    assert_feasible(membership, capacity, solution.weights)
    secretless = np.asarray(membership.sum(axis=0)).ravel() == 0
    assert np.all(solution.weights[secretless] == (0.0 if drop_secretless else 1.0))
    loose = np.asarray(membership.sum(axis=1)).ravel() <= capacity
    untouched = (np.asarray(membership[~loose].sum(axis=0)).ravel() == 0) & ~secretless
    cap_of_example = np.full(membership.shape[1], np.inf)
    np.minimum.at(cap_of_example, membership.indices, np.repeat(capacity, np.diff(membership.indptr)))
    np.testing.assert_array_equal(solution.weights[untouched], np.minimum(1.0, cap_of_example[untouched]))
    assert solution.objective <= solution.upper_bound
    assert solution.gap <= 1e-2


@pytest.mark.parametrize("method", ["simplex", "ipm", "pdlp"])
def test_highs_own_time_limit_status_raises(monkeypatch, method):
    """HiGHS stopped by its time limit returns a "valid" all-zero point; it must never come back."""
    membership, capacity = _hard_instance(2)

    def rushed(csr, cap, upper, *, method, tolerance, time_limit, verbose):
        return solve_block_highs(csr, cap, upper, method=method, tolerance=tolerance, time_limit=1e-4,
                                 verbose=verbose)

    monkeypatch.setattr(lp_module, "parse_solver", lambda solver: Backend(solver, rushed, method))
    with pytest.raises(LPSolverError, match=r"time limit reached.*'Time limit reached'"):
        solve_example_weights(membership, capacity, time_limit=60)


_SOLVE_ONCE = """
import sys
import numpy as np, scipy.sparse as sp
from hush_hf.planning.lp import solve_example_weights
from hush_hf.planning.lp_highs import _new_highs
if sys.argv[2] == "verbose-first":
    _new_highs(True)  # asked for logs: the banner is shown (so the check below can see it)
m = sp.csr_matrix(np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]))
solve_example_weights(m, np.array([1.0, 1.5]), solver=sys.argv[1])
"""


@pytest.mark.parametrize("solver", ["highs", "highs:ipm", "pulp:HiGHS"])
def test_a_fresh_process_prints_no_solver_banner(solver):
    # highspy prints its banner to the C stdout at the first Highs() of a process, before options
    # can be set: only a fresh process shows it, and only fd-level capture sees it.
    root = Path(__file__).resolve().parents[1]
    for mode, banner_expected in (("quiet", False), ("verbose-first", True)):
        command = [sys.executable, "-c", _SOLVE_ONCE, solver, mode]
        run = subprocess.run(command, cwd=root, capture_output=True, text=True, check=True)
        assert ("Running HiGHS" in run.stdout) is banner_expected, run.stdout[:200]
