"""The squared norms of many parameters at once: small Gram matrices computed and contracted in batches.

A ghost norm (``factors.squared_norm_of_sum``) of a weight whose per-example gradient is one
``OuterSum`` of two dense factors is ``sum_{t,s} K_row[i, t, s] K_col[i, t, s]`` with ``K = F F^T`` each
factor's per-example Gram matrix: per parameter, two widenings and two batched products (the Gram
matrices), a product and a float64 sum. On a small or medium model every one of them is a kernel launch
on a GPU with little work behind it, and the step is bound by their number. Here such parameters are
taken together:

- their distinct dense factors of one shape are stacked into one (U, b, T, n) tensor (in at least
  float32: the stack widens a bf16 factor itself, no separate cast; on CUDA two bf16 factors stay bf16 and
  the product has float32 output, ``float32_products``) and get all their Gram matrices from one batched
  product; a factor that several parameters share (Llama's q/k/v read one input) is stacked once;
- the (K_row, K_col) pairs of one shape are stacked and contracted at once: one product, one sum over
  (t, s) accumulated in float64 (``factors.exact_sum``), giving a (U, b) block of squared norms.

The same numbers as one parameter at a time: each Gram entry is the same float32 dot product, each norm
the same float64 sum of the same float32 products (only the order of float64 additions may differ).

Memory: a batch holds at most ``BATCH_BYTES`` of stacked factors, Gram matrices and their stacked copies
(counted conservatively); a parameter whose own share is larger takes the one-at-a-time path, as do
parameters with several uses (their cross terms), one-hot or materialised uses and extension forms.
Large matrices lose nothing by that: their products are long enough to hide a launch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from hush_hf.clipping.factor_memo import FactorMemo, _factor_key, gram_requests
from hush_hf.clipping.factors import (
    DenseFactor,
    OuterSum,
    PerExampleGrad,
    _gram_dot,
    compute_dtype,
    exact_sum,
    squared_norm_of_sum,
)
from hush_hf.clipping.float32_products import as_dtype, bmm_float32, float32_output_supported

BATCH_BYTES = 2**26
"""At most this many bytes (64 MiB) of stacked factors and Gram matrices per batch (``batch_footprint``)."""


def _batchable(uses: Sequence[PerExampleGrad]) -> OuterSum | None:
    """The single ``OuterSum`` of two dense (b, T, n) factors that ``uses`` consists of, else None."""
    if len(uses) != 1:
        return None
    g = uses[0]
    if not (isinstance(g, OuterSum) and isinstance(g.row, DenseFactor) and isinstance(g.col, DenseFactor)):
        return None
    row, col = g.row.values, g.col.values
    if row.dim() != 3 or col.dim() != 3 or row.shape[:2] != col.shape[:2] or row.device != col.device:
        return None
    return g


def batch_footprint(g: OuterSum) -> int:
    """Bytes a use can hold in a batch, at most: both factors stacked in the compute dtype, their two Gram
    matrices, those stacked for the contraction and the product of the two (5 Gram-sized tensors)."""
    row, col = g.row.values, g.col.values  # type: ignore[union-attr]
    b, t_len = row.shape[:2]
    item = compute_dtype(row, col).itemsize
    return item * b * t_len * (row.shape[-1] + col.shape[-1] + 5 * t_len)


def _stacked_grams(values: list[Tensor]) -> Tensor:
    """``F_j F_j^T`` of every (b, T, n) factor in ``values`` (one shape, dtype and device), as a
    (U, b, T, T) tensor in at least float32: one stack (widening a narrow dtype as it copies, except
    where the product takes bf16 operands with float32 output) and one batched product."""
    first = values[0]
    dtype = compute_dtype(first)
    u, (b, t_len, n) = len(values), first.shape
    if dtype == torch.float32 and float32_output_supported(first, first):
        stacked = torch.stack(values)  # bf16 as it is: the product has float32 output (CUDA)
    else:
        stacked = torch.empty((u, b, t_len, n), dtype=dtype, device=first.device)
        torch.stack(values, out=stacked)  # widened by the stack itself
    flat = stacked.view(u * b, t_len, n)
    return bmm_float32(flat, flat.transpose(1, 2), dtype).view(u, b, t_len, t_len)


@torch.no_grad()  # no graph is needed; and a stack with out= refuses an input that requires grad
def _batch_norms(batch: list[tuple[int, OuterSum]], out: list[Tensor | None]) -> None:
    """Writes ``out[k]`` (shape (b,), float64) for every (k, use) of ``batch``: see the module docstring."""
    factors: dict[tuple, Tensor] = {}
    for _, g in batch:
        for f in (g.row, g.col):
            factors.setdefault(_factor_key(f.values), f.values)  # type: ignore[union-attr]
    by_shape: dict[tuple, list[tuple]] = {}
    for key, values in factors.items():
        by_shape.setdefault((tuple(values.shape), values.dtype, values.device), []).append(key)
    grams: dict[tuple, Tensor] = {}
    for keys in by_shape.values():
        stacked = _stacked_grams([factors[key] for key in keys])
        grams.update(zip(keys, stacked.unbind(0), strict=True))
    del factors
    pairs: dict[tuple, list[tuple[int, Tensor, Tensor]]] = {}
    for k, g in batch:
        k_row = grams[_factor_key(g.row.values)]  # type: ignore[union-attr]
        k_col = grams[_factor_key(g.col.values)]  # type: ignore[union-attr]
        dtype = compute_dtype(k_row, k_col)  # float32 or wider Gram matrices: no dispatched promote_types
        pairs.setdefault((tuple(k_row.shape), dtype, k_row.device), []).append((k, k_row, k_col))
    del grams
    for (_, dtype, _), members in pairs.items():
        if len(members) == 1:
            k, k_row, k_col = members[0]
            out[k] = _gram_dot(k_row, k_col)
            continue
        rows = torch.stack([as_dtype(k_row, dtype) for _, k_row, _ in members])
        cols = torch.stack([as_dtype(k_col, dtype) for _, _, k_col in members])
        rows.mul_(cols)
        del cols
        sums = exact_sum(rows, dim=(2, 3))  # (U, b), float64
        for (k, _, _), norm in zip(members, sums.unbind(0), strict=True):  # one unbind, not U selects
            out[k] = norm


def squared_norms(
    all_uses: Sequence[Sequence[PerExampleGrad]],
    never_materialize_dim: int | None = None,
    budget: int | None = None,
) -> list[Tensor]:
    """``squared_norm_of_sum(uses, never_materialize_dim, clamp=False, combined=True)`` of every entry of
    ``all_uses`` (each one parameter's uses, ``combine_uses``'s result), in order, shape (b,) each: those
    with one two-dense-factor ``OuterSum`` in batches of at most ``budget`` bytes (see the module
    docstring), the rest one at a time, sharing the Gram matrices of shared factors (``FactorMemo``).
    ``budget`` None: ``BATCH_BYTES`` as it is at the call."""
    budget = BATCH_BYTES if budget is None else budget
    out: list[Tensor | None] = [None] * len(all_uses)
    batched: list[tuple[int, OuterSum, int]] = []
    rest: list[int] = []
    for k, uses in enumerate(all_uses):
        g = _batchable(uses)
        size = batch_footprint(g) if g is not None else budget + 1
        if g is not None and size <= budget:
            batched.append((k, g, size))
        else:
            rest.append(k)
    memo = FactorMemo(gram_requests([u for k in rest for u in all_uses[k]]))
    for k in rest:
        uses = all_uses[k]
        out[k] = squared_norm_of_sum(uses, never_materialize_dim, clamp=False, combined=True, grams=memo)
    batch: list[tuple[int, OuterSum]] = []
    held = 0
    for k, g, size in batched:
        if batch and held + size > budget:
            _batch_norms(batch, out)
            batch, held = [], 0
        batch.append((k, g))
        held += size
    if batch:
        _batch_norms(batch, out)
    assert all(t is not None for t in out)
    return out  # type: ignore[return-value]
