"""Validation of the example-weight LP's inputs: every check runs before any work is done."""

from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.sparse as sp


def validate_membership(membership: object) -> sp.csr_matrix:
    """Return ``membership`` as a canonical CSR matrix with float64 entries all equal to 1.

    Raises ``ValueError`` naming ``membership`` and the offending shape, index or value when the
    input is not a 2-D scipy.sparse matrix, has an index out of range, or has an entry other than 0/1
    (duplicate COO entries add up, so a repeated (secret, example) pair reads as a 2).
    """
    if not sp.issparse(membership):
        raise ValueError(f"membership must be a scipy.sparse matrix, got {type(membership).__name__}")
    if len(membership.shape) != 2:
        raise ValueError(f"membership must be 2-D (num_secrets, num_examples), got shape {membership.shape}")
    num_secrets, num_examples = (int(s) for s in membership.shape)
    _check_index_ranges(membership, num_secrets, num_examples)
    csr = sp.csr_matrix(membership, dtype=np.float64, copy=True)
    csr.sum_duplicates()
    bad = csr.data != 1.0
    if np.any(bad):
        row = np.repeat(np.arange(num_secrets), np.diff(csr.indptr))
        k = np.flatnonzero(bad & (csr.data != 0.0))
        if k.size:
            k0 = int(k[0])
            raise ValueError(f"membership entries must be 0 or 1; membership[{row[k0]}, {csr.indices[k0]}] = "
                             f"{float(csr.data[k0])!r}")
    csr.eliminate_zeros()  # explicit zeros mean "not a member": nothing is dropped
    csr.sort_indices()
    csr.indices = csr.indices.astype(np.int64, copy=False)
    csr.indptr = csr.indptr.astype(np.int64, copy=False)
    return csr


def _check_index_ranges(membership: sp.spmatrix, num_secrets: int, num_examples: int) -> None:
    """Check stored indices of CSR/CSC/COO inputs, whose constructors do not always do it."""
    fmt = membership.format
    if fmt in ("csr", "csc"):
        minor_size = num_examples if fmt == "csr" else num_secrets
        major_size = num_secrets if fmt == "csr" else num_examples
        indptr, indices = np.asarray(membership.indptr), np.asarray(membership.indices)
        if indptr.size != major_size + 1 or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
            raise ValueError(f"membership ({fmt}) has a malformed indptr for shape {membership.shape}")
        if indptr[-1] > indices.size:
            raise ValueError(f"membership ({fmt}) indptr[-1]={indptr[-1]} exceeds its {indices.size} "
                             "stored indices")
        _check_range(indices[: indptr[-1]], minor_size, "example" if fmt == "csr" else "secret")
    elif fmt == "coo":
        _check_range(np.asarray(membership.row), num_secrets, "secret")
        _check_range(np.asarray(membership.col), num_examples, "example")


def _check_range(index: np.ndarray, size: int, what: str) -> None:
    if index.size == 0:
        return
    bad = (index < 0) | (index >= size)
    if np.any(bad):
        value = int(index[np.flatnonzero(bad)[0]])
        raise ValueError(f"membership has {what} index {value} out of range [0, {size})")


def validate_capacity(capacity: object, num_secrets: int) -> np.ndarray:
    """Return ``capacity`` as a float64 vector of length ``num_secrets``, every entry finite and > 0."""
    try:
        cap = np.array(capacity, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"capacity must be an array of numbers, got {type(capacity).__name__}") from err
    if cap.shape != (num_secrets,):
        raise ValueError(f"capacity must have shape ({num_secrets},) = (num_secrets,), got {cap.shape}")
    bad = ~np.isfinite(cap) | (cap <= 0)
    if np.any(bad):
        j = int(np.flatnonzero(bad)[0])
        raise ValueError(f"capacity must be finite and > 0; capacity[{j}] = {float(cap[j])!r}")
    return cap


def validate_options(gap_tol: object, time_limit: object, drop_secretless: object, progress: object) -> None:
    """Check the scalar options of ``solve_example_weights``."""
    if isinstance(gap_tol, bool) or not isinstance(gap_tol, numbers.Real) or not 0 < gap_tol < 1:
        raise ValueError(f"gap_tol must be a number in (0, 1), got {gap_tol!r}")
    if time_limit is not None and (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, numbers.Real)
        or not math.isfinite(time_limit)
        or time_limit <= 0
    ):
        raise ValueError(f"time_limit must be None or a finite number > 0, got {time_limit!r}")
    for name, value in (("drop_secretless", drop_secretless), ("progress", progress)):
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be a bool, got {value!r}")
