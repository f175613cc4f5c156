"""Example weights from the Hush LP (Ganesh et al. 2025, eq. (1)), solved fast and certified.

    max sum_i w_i   s.t.   sum_{i in D_j} w_i <= capacity_j  (every secret j),   0 <= w_i <= 1.

Examples in no secret are not LP variables: w_i = 1, or 0 with ``drop_secretless`` (as the paper did).
The pipeline is presolve and decomposition (``lp_presolve``), one solver call per block with
tightening attempts (``lp_backends``), then checks that trust no solver (``lp_certificate``): the
weights are repaired to exact feasibility and the optimum is bounded by weak duality, so the reported
gap is certified.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from tqdm.auto import tqdm

from hush_hf.planning.lp_backends import Backend, parse_solver
from hush_hf.planning.lp_certificate import clip_to_bounds, dual_upper_bound, relative_gap, repair_feasible
from hush_hf.planning.lp_input import validate_capacity, validate_membership, validate_options
from hush_hf.planning.lp_presolve import Block, reduce_lp
from hush_hf.planning.lp_types import LPSolverError

__all__ = ["LPSolverError", "WeightSolution", "solve_example_weights"]

logger = logging.getLogger(__name__)

# Components up to this many memberships are batched and solved exactly by simplex (~0.1 s for a
# 20K-membership component); larger ones get a first-order method. Batches of ~BATCH_NNZ memberships
# were ~1.5x faster than one batch of 200K (block-diagonal simplex is not free of cross costs).
SMALL_COMPONENT_NNZ = 20_000
BATCH_NNZ = 50_000


@dataclass(frozen=True)
class WeightSolution:
    """Certified example weights: feasible, with sum(weights) within ``gap`` of the LP optimum.

    ``upper_bound`` >= the optimum of max sum(w) (secretless examples included), from weak duality;
    ``gap`` = (upper_bound - objective) / upper_bound. ``status`` is "optimal" when every block was
    solved exactly, "gap_reached" when a first-order or interior-point answer met ``gap_tol``.
    The rest are statistics: what presolve left (``num_active_*``), the components and solver blocks,
    and per block the method that succeeded, its own status string and its certified gap (each block
    meets ``gap_tol`` alone, a stricter test than the overall ``gap``, which fixed weights dilute).
    """

    weights: np.ndarray
    objective: float
    upper_bound: float
    gap: float
    status: str
    solver: str
    seconds: float
    num_secretless: int
    num_active_secrets: int
    num_active_examples: int
    num_active_memberships: int
    num_components: int
    num_blocks: int
    methods: tuple[str, ...]
    solver_statuses: tuple[str, ...]
    block_gaps: tuple[float, ...]


@dataclass(frozen=True)
class _BlockResult:
    weights: np.ndarray
    duals: np.ndarray
    method: str
    status: str
    exact: bool
    gap: float


def solve_example_weights(
    membership: sp.spmatrix,
    capacity: np.ndarray,
    *,
    solver: str = "highs",
    gap_tol: float = 1e-2,
    time_limit: float | None = None,
    drop_secretless: bool = False,
    progress: bool = False,
) -> WeightSolution:
    """Solve Hush eq. (1) for a (num_secrets x num_examples) 0/1 ``membership`` and ``capacity`` > 0.

    ``capacity_j`` is c * budget_j (the caller's). The answer is feasible exactly (checked in float64
    with rounding taken into account) and its certified relative gap is <= ``gap_tol``; otherwise
    ``LPSolverError`` is raised, also when ``time_limit`` seconds pass first. Bad input raises
    ``ValueError`` naming the field before any work.
    """
    start = time.perf_counter()
    csr = validate_membership(membership)
    cap = validate_capacity(capacity, csr.shape[0])
    validate_options(gap_tol, time_limit, drop_secretless, progress)
    backend = parse_solver(solver)
    deadline = math.inf if time_limit is None else start + float(time_limit)

    reduction = reduce_lp(csr, cap, drop_secretless=bool(drop_secretless),
                          small_component_nnz=SMALL_COMPONENT_NNZ, batch_nnz=BATCH_NNZ)
    if progress:
        logger.info("LP presolve: %d of %d secrets may bind, %d examples, %d memberships, %d components, "
                    "%.1f s", reduction.num_active_rows, csr.shape[0], reduction.num_active_cols,
                    reduction.num_active_nnz, reduction.num_components, time.perf_counter() - start)
    weights, duals = reduction.upper.copy(), np.zeros(csr.shape[0])
    results = []
    for block in tqdm(reduction.blocks, desc="LP blocks", disable=not progress or len(reduction.blocks) < 2):
        result = _solve_block(csr, cap, reduction.upper, block, backend, float(gap_tol), deadline, progress)
        weights[block.cols], duals[block.rows] = result.weights, result.duals
        results.append(result)

    # Independent final check on the full matrix (every row, presolved ones included).
    weights = repair_feasible(csr, cap, weights, solver)
    objective = math.fsum(weights.tolist())
    upper_bound = dual_upper_bound(csr, cap, reduction.upper, duals)
    gap = relative_gap(objective, upper_bound, solver)
    if gap > gap_tol:
        raise LPSolverError(f"{solver}: certified gap {gap:.3e} exceeds gap_tol={gap_tol!r} on the full LP")
    return WeightSolution(
        weights=weights,
        objective=objective,
        upper_bound=upper_bound,
        gap=gap,
        status="optimal" if all(r.exact for r in results) else "gap_reached",
        solver=solver,
        seconds=time.perf_counter() - start,
        num_secretless=int(np.count_nonzero(np.bincount(csr.indices, minlength=csr.shape[1]) == 0)),
        num_active_secrets=reduction.num_active_rows,
        num_active_examples=reduction.num_active_cols,
        num_active_memberships=reduction.num_active_nnz,
        num_components=reduction.num_components,
        num_blocks=len(reduction.blocks),
        methods=tuple(r.method for r in results),
        solver_statuses=tuple(r.status for r in results),
        block_gaps=tuple(r.gap for r in results),
    )


def _solve_block(
    csr: sp.csr_matrix,
    cap: np.ndarray,
    upper: np.ndarray,
    block: Block,
    backend: Backend,
    gap_tol: float,
    deadline: float,
    progress: bool,
) -> _BlockResult:
    """Try the backend's attempts on one block until a repaired answer's certified gap is <= gap_tol."""
    sub = csr[block.rows][:, block.cols]
    sub_cap, sub_upper = cap[block.rows], upper[block.cols]
    # Solvers see w = scale * v with max v_i <= 1: tolerances are absolute (HiGHS: 1e-7), and with the
    # paper's budgets c * mu_j capacities can be ~1e-4. The optimal dual y is the same for v and w.
    scale = float(sub_upper.max())
    tried = []
    for method, tolerance in backend.attempts(block.batched, gap_tol):
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise LPSolverError(f"{backend.name}: time limit reached before the LP was solved "
                                f"(tried: {tried})")
        answer = backend.solve(sub, sub_cap / scale, sub_upper / scale, method=method, tolerance=tolerance,
                               time_limit=remaining, verbose=progress and logger.isEnabledFor(logging.DEBUG))
        weights = clip_to_bounds(answer.weights * scale, sub_upper, answer.method)
        weights = repair_feasible(sub, sub_cap, weights, answer.method)
        duals = np.maximum(answer.duals, 0.0)
        objective = math.fsum(weights.tolist())
        gap = relative_gap(objective, dual_upper_bound(sub, sub_cap, sub_upper, duals), answer.method)
        tried.append(f"{answer.method}(tol={tolerance:.0e}): {answer.status!r}, certified gap {gap:.2e}")
        if progress:
            logger.info("LP block of %d secrets x %d examples: %s, %.1f s", block.rows.size, block.cols.size,
                        tried[-1], answer.seconds)
        if gap <= gap_tol:
            return _BlockResult(weights, duals, answer.method, answer.status, answer.exact, gap)
        if answer.timed_out:
            raise LPSolverError(f"{backend.name}: time limit reached without reaching gap_tol={gap_tol!r} "
                                f"(tried: {tried})")
    raise LPSolverError(f"{backend.name}: no attempt reached gap_tol={gap_tol!r} (tried: {tried})")
