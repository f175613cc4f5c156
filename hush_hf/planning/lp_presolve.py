"""Presolve and decomposition of the example-weight LP (Hush eq. (1)) into independent blocks.

1. Implied bounds: row j alone forces w_i <= cap_j, so u_i = min(1, min_{j: i in D_j} cap_j) is valid
   for every feasible w (and u_i = 0 for secretless examples when they are dropped).
2. Redundant rows: if sum_{i in D_j} u_i <= cap_j, row j holds for every w in the box and is removed.
   The test only reads u, which does not depend on which rows are removed, so one pass is a fixed
   point. Examples left in no row get w_i = u_i, the largest value their box allows.
3. Components: the rows that remain and their examples form a bipartite graph whose connected
   components share no variable, so each is an LP of its own and the optimum is their sum.
   Small components are batched into one block-diagonal LP (solved exactly); large ones stand alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components


@dataclass(frozen=True)
class Block:
    """Secrets ``rows`` and examples ``cols`` (original indices) of one independent sub-LP."""

    rows: np.ndarray
    cols: np.ndarray
    nnz: int
    num_components: int
    batched: bool


@dataclass(frozen=True)
class Reduction:
    """The presolved LP: implied bounds for every example and the blocks left to solve."""

    upper: np.ndarray
    blocks: tuple[Block, ...]
    num_active_rows: int
    num_active_cols: int
    num_active_nnz: int
    num_components: int


def implied_upper_bounds(csr: sp.csr_matrix, capacity: np.ndarray, drop_secretless: bool) -> np.ndarray:
    """u_i = min(1, min_{j: i in D_j} cap_j); secretless examples get 1, or 0 when dropped."""
    num_examples = csr.shape[1]
    upper = np.ones(num_examples)
    np.minimum.at(upper, csr.indices, np.repeat(capacity, np.diff(csr.indptr)))
    if drop_secretless:
        upper[np.bincount(csr.indices, minlength=num_examples) == 0] = 0.0
    return upper


def reduce_lp(
    csr: sp.csr_matrix,
    capacity: np.ndarray,
    *,
    drop_secretless: bool,
    small_component_nnz: int,
    batch_nnz: int,
) -> Reduction:
    """Presolve (implied bounds, redundant rows) and split what remains into blocks.

    Components with at most ``small_component_nnz`` memberships are packed, in order, into batches of
    at most ``batch_nnz`` memberships; larger components are one block each.
    """
    upper = implied_upper_bounds(csr, capacity, drop_secretless)
    # A row is kept only if the box alone can overfill it. The sum is exact for integer-valued u; for
    # fractional u a rounding slip could drop a row that binds by ~1e-16, and the final exact check on
    # the full matrix (lp_certificate.repair_feasible) would still catch and repair it.
    active_rows = np.flatnonzero(csr @ upper > capacity)
    active = csr[active_rows]
    col_degree = np.bincount(active.indices, minlength=csr.shape[1])
    active_cols = np.flatnonzero(col_degree > 0)
    if active_rows.size == 0:
        return Reduction(upper, (), 0, 0, 0, 0)
    active = active[:, active_cols]
    row_label, col_label, num_components = _bipartite_components(active)
    row_nnz = np.diff(active.indptr)
    comp_nnz = np.bincount(row_label, weights=row_nnz, minlength=num_components).astype(np.int64)
    block_of_comp = _assign_blocks(comp_nnz, small_component_nnz, batch_nnz)
    blocks = _gather_blocks(active_rows, active_cols, row_label, col_label, block_of_comp, comp_nnz,
                            small_component_nnz)
    return Reduction(upper, blocks, active_rows.size, active_cols.size, int(active.nnz), num_components)


def _bipartite_components(csr: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, int]:
    """Connected components of the secret-example graph: labels of rows, labels of columns, count."""
    num_rows, num_cols = csr.shape
    indptr = np.concatenate([csr.indptr, np.full(num_cols, csr.indptr[-1])])
    graph = sp.csr_matrix(
        (np.ones(csr.nnz, dtype=np.int8), csr.indices + num_rows, indptr), shape=(num_rows + num_cols,) * 2
    )
    count, labels = connected_components(graph, directed=False)
    return labels[:num_rows], labels[num_rows:], int(count)


def _assign_blocks(comp_nnz: np.ndarray, small_component_nnz: int, batch_nnz: int) -> np.ndarray:
    """Block id of every component: one per large component, consecutive small ones share a batch."""
    small = comp_nnz <= small_component_nnz
    block = np.empty(comp_nnz.size, dtype=np.int64)
    num_large = int(np.count_nonzero(~small))
    block[~small] = np.arange(num_large)
    # Batch of each small component: floor(cumulative nnz before it / batch_nnz), renumbered
    # consecutively; a batch holds at most batch_nnz + small_component_nnz memberships.
    small_nnz = comp_nnz[small]
    before = np.cumsum(small_nnz) - small_nnz
    _, batch = np.unique(before // max(batch_nnz, 1), return_inverse=True)
    block[small] = num_large + batch
    return block


def _gather_blocks(
    active_rows: np.ndarray,
    active_cols: np.ndarray,
    row_label: np.ndarray,
    col_label: np.ndarray,
    block_of_comp: np.ndarray,
    comp_nnz: np.ndarray,
    small_component_nnz: int,
) -> tuple[Block, ...]:
    row_block, col_block = block_of_comp[row_label], block_of_comp[col_label]
    num_blocks = int(block_of_comp.max()) + 1
    rows_by_block = _split_by(active_rows, row_block, num_blocks)
    cols_by_block = _split_by(active_cols, col_block, num_blocks)
    nnz = np.bincount(block_of_comp, weights=comp_nnz, minlength=num_blocks).astype(np.int64)
    comps = np.bincount(block_of_comp, minlength=num_blocks)
    batched = np.zeros(num_blocks, dtype=bool)
    batched[block_of_comp[comp_nnz <= small_component_nnz]] = True
    return tuple(
        Block(rows_by_block[b], cols_by_block[b], int(nnz[b]), int(comps[b]), bool(batched[b]))
        for b in range(num_blocks)
    )


def _split_by(values: np.ndarray, key: np.ndarray, num_keys: int) -> list[np.ndarray]:
    """``values`` grouped by ``key`` (stable, so each group stays sorted)."""
    order = np.argsort(key, kind="stable")
    bounds = np.cumsum(np.bincount(key, minlength=num_keys))[:-1]
    return np.split(values[order], bounds)
