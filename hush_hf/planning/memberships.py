"""Which examples contain which secrets: the bipartite graph E of Hush Sec. 3, as a sparse matrix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from hush_hf.data import SECRET_IDS_COLUMN


def membership_matrix(secret_ids: Any, num_secrets: int, *, field: str = SECRET_IDS_COLUMN) -> sp.csr_matrix:
    """A (num_secrets x num_examples) 0/1 CSR matrix with entry (j, i) = 1 iff example i contains secret j.

    ``secret_ids`` is one list of secret indices per example (a Python sequence, or a ``datasets`` column /
    pyarrow ListArray, read without converting to Python objects). An index outside
    ``[0, num_secrets)`` is an error naming the example and the index; a repeated index within one
    example counts once (an example contains a secret or not).
    """
    if not isinstance(num_secrets, (int, np.integer)) or num_secrets < 1:
        raise ValueError(f"num_secrets must be a positive integer, got {num_secrets!r}")
    offsets, values = _flatten(secret_ids, field)
    num_examples = offsets.size - 1
    if values.size:
        bad = (values < 0) | (values >= num_secrets)
        if np.any(bad):
            k = int(np.flatnonzero(bad)[0])
            example = int(np.searchsorted(offsets, k, side="right") - 1)
            raise ValueError(
                f"{field}: example {example} names unknown secret {int(values[k])} "
                f"(valid secret indices are 0..{num_secrets - 1})"
            )
    examples = np.repeat(np.arange(num_examples, dtype=np.int64), np.diff(offsets))
    matrix = sp.csr_matrix(
        (np.ones(values.size, dtype=np.float64), (values, examples)), shape=(num_secrets, num_examples)
    )
    matrix.sum_duplicates()
    matrix.data[:] = 1.0
    return matrix


def _flatten(secret_ids: Any, field: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of a ragged list of integer lists."""
    arrow = _as_arrow_list(secret_ids)
    if arrow is not None:
        if arrow.null_count:
            raise ValueError(f"{field}: {arrow.null_count} examples have a null list (use [] for none)")
        offsets = np.asarray(arrow.offsets, dtype=np.int64)
        values = np.asarray(arrow.flatten().to_numpy(zero_copy_only=False))
        offsets = offsets - offsets[0]
    else:
        lists = list(secret_ids) if not isinstance(secret_ids, Sequence) else secret_ids
        lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        values = np.fromiter((v for x in lists for v in x), dtype=np.float64, count=int(offsets[-1]))
    if values.size and not np.issubdtype(values.dtype, np.integer):
        non_integer = ~np.isfinite(values) | (values != np.round(values))
        if np.any(non_integer):
            k = int(np.flatnonzero(non_integer)[0])
            example = int(np.searchsorted(offsets, k, side="right") - 1)
            raise ValueError(
                f"{field}: example {example} has a non-integer secret index {float(values[k])!r}"
            )
    return offsets, values.astype(np.int64)


def _as_arrow_list(secret_ids: Any):
    """The pyarrow ListArray behind a datasets column, if it is one."""
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - datasets depends on pyarrow
        return None
    if isinstance(secret_ids, pa.ChunkedArray):
        secret_ids = secret_ids.combine_chunks()
    if isinstance(secret_ids, (pa.ListArray, pa.LargeListArray)):
        return secret_ids
    return None
