"""HiGHS (highspy) on a scipy.sparse block: simplex, IPM without crossover, or PDLP.

The block LP is passed as  min -1^T w  s.t.  A w <= cap,  0 <= w <= u.  HiGHS's own model status is
read and mapped; its answer is only a suggestion that ``lp_certificate`` repairs and certifies.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import highspy
import numpy as np
import scipy.sparse as sp

from hush_hf.planning.lp_types import BlockAnswer, LPSolverError

HIGHS_METHODS = ("simplex", "ipm", "pdlp")

_Status = highspy.HighsModelStatus
# Statuses under which HiGHS may hold a usable (uncertified) point; everything else is a failure.
# PDLP and IPM without crossover end "Unknown" when their loose tolerances leave HiGHS's own 1e-7 KKT
# check unmet; that is expected here, and the certificate decides.
_ACCEPTED = {_Status.kOptimal, _Status.kUnknown, _Status.kTimeLimit, _Status.kIterationLimit}


def solve_block_highs(
    csr: sp.csr_matrix,
    capacity: np.ndarray,
    upper: np.ndarray,
    *,
    method: str,
    tolerance: float,
    time_limit: float,
    verbose: bool,
) -> BlockAnswer:
    """Run HiGHS ``method`` ("simplex", "ipm" = IPX without crossover, "pdlp" = HiPDLP) on one block.

    ``tolerance`` sets HiGHS's optimality tolerance for ipm/pdlp (ignored by simplex). Raises
    ``LPSolverError`` naming the method and HiGHS's status when HiGHS fails or returns no solution.
    """
    if method not in HIGHS_METHODS:
        raise ValueError(f"HiGHS method must be one of {HIGHS_METHODS}, got {method!r}")
    name = f"highs:{method}"
    highs = _new_highs(verbose)
    _pass_model(highs, csr, capacity, upper)
    _configure(highs, method, tolerance, time_limit)
    start = time.perf_counter()
    run_status = highs.run()
    seconds = time.perf_counter() - start
    status = highs.getModelStatus()
    status_text = highs.modelStatusToString(status)
    if run_status == highspy.HighsStatus.kError or status not in _ACCEPTED:
        raise LPSolverError(f"{name} failed with HiGHS status {status_text!r}")
    solution = highs.getSolution()
    if not (solution.value_valid and solution.dual_valid):
        why = " (time limit reached)" if status == _Status.kTimeLimit else ""
        raise LPSolverError(f"{name} returned no primal-dual solution{why}; HiGHS status {status_text!r}")
    return BlockAnswer(
        weights=np.asarray(solution.col_value, dtype=np.float64),
        # Row duals of a minimisation are <= 0 at a row's upper bound; y = -row_dual is the packing dual.
        duals=-np.asarray(solution.row_dual, dtype=np.float64),
        status=status_text,
        method=name,
        exact=method == "simplex" and status == _Status.kOptimal,
        timed_out=status == _Status.kTimeLimit,
        seconds=seconds,
    )


_banner_consumed = False


def consume_highs_banner() -> None:
    """Construct this process's first Highs instance with file descriptor 1 on /dev/null.

    Written by hand because highspy (>= 1.16) prints its licence banner to the C stdout while
    constructing the first Highs of a process: ``Highs.__init__`` calls a logging method before any
    option can be set (ERGO-Code/HiGHS#2749). Later instances (ours, or PuLP's HiGHS) with
    ``output_flag`` off are silent.
    """
    global _banner_consumed
    if not _banner_consumed:
        with _c_stdout_to_devnull():
            highspy.Highs()
        _banner_consumed = True


def _new_highs(verbose: bool) -> highspy.Highs:
    """A Highs instance with ``output_flag`` = verbose (and no banner unless verbose)."""
    if not verbose:
        consume_highs_banner()
    highs = highspy.Highs()
    _set(highs, "output_flag", bool(verbose))
    return highs


@contextmanager
def _c_stdout_to_devnull() -> Iterator[None]:
    """Point file descriptor 1 at /dev/null for the block (Python's own stdout flushed first)."""
    if sys.stdout is not None:
        sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 in this process: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            try:
                yield
            finally:
                os.dup2(saved, 1)
    finally:
        os.close(saved)


def _pass_model(highs: highspy.Highs, csr: sp.csr_matrix, capacity: np.ndarray, upper: np.ndarray) -> None:
    """Pass min -1^T w, A w <= cap, 0 <= w <= u as column-wise arrays (the array overload of passModel
    copies buffers; filling a HighsLp attribute by attribute took ~2 s at 7.5M memberships)."""
    num_rows, num_cols = csr.shape
    if csr.nnz > np.iinfo(np.int32).max:
        raise LPSolverError(f"HiGHS takes at most {np.iinfo(np.int32).max} memberships per block, "
                            f"got {csr.nnz}")
    csc = csr.tocsc()
    status = highs.passModel(
        num_cols, num_rows, csc.nnz, int(highspy.MatrixFormat.kColwise), int(highspy.ObjSense.kMinimize), 0.0,
        np.full(num_cols, -1.0), np.zeros(num_cols), np.ascontiguousarray(upper, dtype=np.float64),
        np.full(num_rows, -highspy.kHighsInf), np.ascontiguousarray(capacity, dtype=np.float64),
        csc.indptr[:-1].astype(np.int32), csc.indices.astype(np.int32), csc.data.astype(np.float64),
        np.full(num_cols, int(highspy.HighsVarType.kContinuous), dtype=np.int32),
    )
    if status != highspy.HighsStatus.kOk:
        raise LPSolverError(f"HiGHS rejected the model ({num_rows} rows, {num_cols} columns): {status}")


def _configure(highs: highspy.Highs, method: str, tolerance: float, time_limit: float) -> None:
    _set(highs, "time_limit", float(time_limit))
    if method == "simplex":
        _set(highs, "solver", "simplex")
        return
    # Our own presolve already ran; HiGHS's took minutes on the paper-scale instance (1.7M x 100K).
    _set(highs, "presolve", "off")
    if method == "ipm":
        _set(highs, "solver", "ipx")
        _set(highs, "run_crossover", "off")
        _set(highs, "ipm_optimality_tolerance", float(tolerance))
    else:
        # HiPDLP (Halpern-restarted PDHG) reached a 1% certified gap in ~100 iterations on the benchmark
        # instances; cuPDLP-C ("pdlp") needed ~5000. The certificate, not this tolerance, is the test.
        _set(highs, "solver", "hipdlp")
        _set(highs, "pdlp_optimality_tolerance", float(tolerance))


def _set(highs: highspy.Highs, option: str, value: object) -> None:
    if highs.setOptionValue(option, value) != highspy.HighsStatus.kOk:
        raise LPSolverError(f"HiGHS rejected option {option}={value!r}")
