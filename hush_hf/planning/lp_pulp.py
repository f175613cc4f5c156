"""Any PuLP solver (CBC, GUROBI, CPLEX, HiGHS, ...) on a scipy.sparse block.

PuLP's word is not trusted (pulp 3.3 reports HiGHS's time-limit stop as "Optimal" with a wrong
objective, docs/design.md#lp-solvers): we require its status AND its solution status to say optimal,
and the caller still repairs and certifies the answer. Model names carry indices only, never secret text.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pulp
import scipy.sparse as sp

from hush_hf.planning.lp_highs import consume_highs_banner
from hush_hf.planning.lp_types import BlockAnswer, LPSolverError

# Short names users type -> PuLP's solver names (anything else is passed to pulp.getSolver as is).
_ALIASES = {
    "CBC": "PULP_CBC_CMD", "CPLEX": "CPLEX_CMD", "GLPK": "GLPK_CMD", "SCIP": "SCIP_CMD", "HIGHS": "HiGHS",
}


def pulp_solver_name(name: str) -> str:
    """PuLP's name for ``name`` (case-insensitive); ValueError naming ``solver`` if PuLP lacks it."""
    wanted = _ALIASES.get(name.upper(), name)
    known = {s.upper(): s for s in pulp.listSolvers()}
    if wanted.upper() not in known:
        raise ValueError(f"solver 'pulp:{name}' is unknown to PuLP; known: {sorted(known.values())}")
    resolved = known[wanted.upper()]
    if not pulp.getSolver(resolved, msg=False).available():
        raise LPSolverError(f"solver 'pulp:{name}' ({resolved}) is not available in this environment")
    return resolved


def solve_block_pulp(
    csr: sp.csr_matrix,
    capacity: np.ndarray,
    upper: np.ndarray,
    *,
    method: str,
    tolerance: float,
    time_limit: float,
    verbose: bool,
) -> BlockAnswer:
    """Solve one block with the PuLP solver named ``method`` (a resolved PuLP name); ``tolerance`` unused."""
    del tolerance  # PuLP solvers are run to their own optimality; the certificate checks the gap
    name = f"pulp:{method}"
    problem, weights, rows = _build(csr, capacity, upper)
    limit = float(time_limit) if math.isfinite(time_limit) else None
    solver = pulp.getSolver(method, msg=bool(verbose), timeLimit=limit)
    if method == "HiGHS" and not verbose:  # PuLP's HiGHS is highspy: msg=False comes after its banner
        consume_highs_banner()
    start = time.perf_counter()
    try:
        problem.solve(solver)
    except pulp.PulpSolverError as err:
        raise LPSolverError(f"{name} failed: {err}") from err
    seconds = time.perf_counter() - start
    status = pulp.LpStatus[problem.status]
    solution_status = pulp.LpSolution.get(problem.sol_status, str(problem.sol_status))
    timed_out = seconds >= time_limit
    if problem.status != pulp.LpStatusOptimal or problem.sol_status != pulp.LpSolutionOptimal:
        why = " (time limit reached)" if timed_out else ""
        raise LPSolverError(f"{name} did not solve the LP{why}: status {status!r}, "
                            f"solution status {solution_status!r}")
    values = [v.varValue for v in weights]
    duals = [c.pi for c in rows]
    if any(v is None for v in values) or any(d is None for d in duals):
        raise LPSolverError(f"{name} returned no primal-dual solution (status {status!r}); cannot certify it")
    return BlockAnswer(
        weights=np.asarray(values, dtype=np.float64),
        duals=_packing_duals(np.asarray(duals, dtype=np.float64)),
        status=status,
        method=name,
        exact=True,
        timed_out=timed_out,
        seconds=seconds,
    )


def _packing_duals(pi: np.ndarray) -> np.ndarray:
    """Orient PuLP's row duals as y >= 0.

    PuLP solvers disagree on the sign of a maximisation's duals (CBC reports d(obj)/d(cap_j) >= 0,
    HiGHS the minimisation dual <= 0). Any y >= 0 gives a valid bound (lp_certificate), so picking the
    orientation with the larger positive mass can only tighten a bound that stays valid either way.
    """
    return pi if np.maximum(pi, 0.0).sum() >= np.maximum(-pi, 0.0).sum() else -pi


def _build(
    csr: sp.csr_matrix, capacity: np.ndarray, upper: np.ndarray
) -> tuple[pulp.LpProblem, list[pulp.LpVariable], list[pulp.LpConstraint]]:
    problem = pulp.LpProblem("hush_example_weights", pulp.LpMaximize)
    if hasattr(problem, "add_variable"):  # PuLP >= 3.3; constructing LpVariable directly is deprecated there
        weights = [problem.add_variable(f"w{i}", lowBound=0.0, upBound=float(u)) for i, u in enumerate(upper)]
    else:
        weights = [pulp.LpVariable(f"w{i}", lowBound=0.0, upBound=float(u)) for i, u in enumerate(upper)]
    problem += pulp.lpSum(weights)
    rows = []
    for j in range(csr.shape[0]):
        members = csr.indices[csr.indptr[j] : csr.indptr[j + 1]]
        row = pulp.LpConstraint(pulp.LpAffineExpression([(weights[i], 1.0) for i in members]),
                                sense=pulp.LpConstraintLE, rhs=float(capacity[j]), name=f"s{j}")
        problem += row
        rows.append(row)
    return problem, weights, rows
