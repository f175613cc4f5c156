"""Which solver runs each block, and in what order of attempts.

``solver`` strings: "highs" (default: exact simplex on batches of small components; HiPDLP with
tightening tolerances, then IPM, on large ones), "highs:simplex", "highs:ipm", "highs:pdlp", "pulp"
(= CBC) or "pulp:NAME" for any PuLP solver. A block's attempts stop at the first answer whose
certified gap reaches ``gap_tol``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hush_hf.planning.lp_highs import HIGHS_METHODS, solve_block_highs
from hush_hf.planning.lp_pulp import pulp_solver_name, solve_block_pulp
from hush_hf.planning.lp_types import BlockAnswer

Attempt = tuple[str, float]  # (method, solver tolerance)


@dataclass(frozen=True)
class Backend:
    """A parsed ``solver`` argument: the block solver and the attempts it makes on each kind of block."""

    name: str
    solve: Callable[..., BlockAnswer]
    method: str  # a HiGHS method, "auto", or a PuLP solver name

    def attempts(self, batched: bool, gap_tol: float) -> tuple[Attempt, ...]:
        """The (method, tolerance) pairs tried on a block, in order."""
        if self.method not in (*HIGHS_METHODS, "auto"):  # PuLP: one exact solve
            return ((self.method, 0.0),)
        pdlp = tuple(("pdlp", gap_tol * factor) for factor in (1.0, 0.25, 0.025))
        ipm = (("ipm", gap_tol * 0.1), ("ipm", 1e-8))
        if self.method == "simplex":
            return (("simplex", 0.0),)
        if self.method == "ipm":
            return ipm
        if self.method == "pdlp":
            return pdlp
        # auto: small components exactly; large ones by first-order steps with an IPM fallback
        return (("simplex", 0.0),) if batched else (*pdlp, ipm[-1])


def parse_solver(solver: object) -> Backend:
    """Backend for a ``solver`` string; ValueError naming ``solver`` for anything unknown."""
    if not isinstance(solver, str):
        raise ValueError(f"solver must be a string such as 'highs' or 'pulp:CBC', got {solver!r}")
    family, _, method = solver.partition(":")
    if family == "highs":
        if method and method not in HIGHS_METHODS:
            raise ValueError(f"solver {solver!r}: HiGHS method must be one of {HIGHS_METHODS}")
        return Backend(solver, solve_block_highs, method or "auto")
    if family == "pulp":
        return Backend(solver, solve_block_pulp, pulp_solver_name(method or "CBC"))
    raise ValueError(f"solver must be 'highs', 'highs:METHOD' or 'pulp[:NAME]', got {solver!r}")
