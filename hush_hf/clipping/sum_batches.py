"""The clipped sums of many weights at once: weights whose factors have the same shapes in one product.

The clipped sum of a weight whose per-example gradient is one ``OuterSum`` of two dense factors is
``sum_{i,t} w_i row_{i,t} col_{i,t}^T`` (``factors.weighted_sum``): the weights folded into the narrower
factor, one matrix product. Per weight that is a few kernel launches (on CUDA with bf16 factors seven:
the scaled factor, its two exact bf16 pieces, the product and the block sum), each with little work on
a small or medium model. The layers of a transformer repeat, so their weights come in groups of one
shape (every layer's query projection, every layer's MLP input); here each such group is summed at
once:

- the narrower factors are stacked into one (U, b, T, n) tensor in the compute dtype (the stack widens a
  bf16 factor as it copies) and scaled by the weights in place; on CUDA with bf16 factors by the weights
  cut to bf16's bits toward zero (``float32_products.bf16_toward_zero``), and split into its two exact
  bf16 pieces once for the group (``float32_products.bf16_pieces_side_by_side``);
- the wider factors are stacked (widened by the stack where the product needs float32 operands; kept
  bf16 where it takes them with float32 output) and one batched product gives all U sums, (U, rows, cols).

The same numbers as one weight at a time (``factors.weighted_sum``): each scaled entry is the same
float32 product, each sum the same float32 matrix product (only the accumulation order of the GEMM may
differ). Each weight's sum is a view of its group's result (contiguous, shaped like the weight).

Memory: a batch holds at most ``gram_batches.BATCH_BYTES`` of stacked factors, pieces and results (see
``sum_footprint``); larger weights, weights with several uses, one-hot or materialised uses and a shape
no other weight shares take ``factors.weighted_sum`` one at a time, as before.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from hush_hf.clipping import gram_batches
from hush_hf.clipping.factors import OuterSum, PerExampleGrad, _dense_pair_route
from hush_hf.clipping.float32_products import (
    as_dtype,
    bf16_pieces_side_by_side,
    bf16_toward_zero,
    bmm_float32,
)
from hush_hf.clipping.gram_batches import _batchable


def sum_footprint(g: OuterSum) -> int:
    """Bytes one weight can hold in a batch, at most: its narrower factor scaled and split into bf16
    pieces, its wider factor stacked, its part of the product (two blocks on the pieces route)."""
    route, narrow, wide, dtype = _dense_pair_route(g)  # type: ignore[misc]
    steps, n, m = narrow.shape[0] * narrow.shape[1], narrow.shape[-1], wide.shape[-1]
    return dtype.itemsize * (steps * (n + m) + 2 * n * m) + 4 * steps * n


def _chunks(members: list[tuple[str, OuterSum, int]], budget: int) -> Iterator[list[tuple[str, OuterSum]]]:
    """Consecutive runs of ``members`` whose footprints add up to at most ``budget``."""
    chunk: list[tuple[str, OuterSum]] = []
    held = 0
    for name, g, size in members:
        if chunk and held + size > budget:
            yield chunk
            chunk, held = [], 0
        chunk.append((name, g))
        held += size
    if chunk:
        yield chunk


def _group_sum(group: list[OuterSum], weights: Tensor) -> Tensor:
    """``sum_{i,t} w_i row_{i,t} col_{i,t}^T`` of every use in ``group`` (one route, factor shapes and
    dtypes), shape (U, rows, cols), in the compute dtype (see the module docstring)."""
    route, narrow, wide, dtype = _dense_pair_route(group[0])  # type: ignore[misc]
    narrow_is_row = narrow is group[0].row.values  # type: ignore[union-attr]
    pairs = [(g.row.values, g.col.values) if narrow_is_row else (g.col.values, g.row.values) for g in group]  # type: ignore[union-attr]
    u, (b, t_len, n), m = len(group), narrow.shape, wide.shape[-1]
    scaled = torch.empty((u, b, t_len, n), dtype=dtype, device=narrow.device)
    torch.stack([p[0] for p in pairs], out=scaled)  # widened as it copies
    if route == "pieces":  # bf16 x bf16 products with float32 output: exact pieces, the wide side as it is
        scaled.mul_(bf16_toward_zero(weights).view(1, -1, 1, 1))  # exact: see _weighted_product_bf16
        left = bf16_pieces_side_by_side(scaled.view(u * b * t_len, n), 2).view(u, b * t_len, 2 * n)
        right = torch.stack([p[1] for p in pairs]).view(u, b * t_len, m)
    else:
        scaled.mul_(as_dtype(weights, dtype).view(1, -1, 1, 1))  # one view, not three unsqueezes
        left = scaled.view(u, b * t_len, n)
        right = torch.empty((u, b, t_len, m), dtype=dtype, device=wide.device)
        torch.stack([p[1] for p in pairs], out=right)  # widened as it copies
        right = right.view(u, b * t_len, m)
    del scaled
    if narrow_is_row:
        total = bmm_float32(left.transpose(1, 2), right, dtype)  # (U, n or 2 n, m)
        return total.view(u, 2, n, m).sum(dim=1) if route == "pieces" else total
    total = bmm_float32(right.transpose(1, 2), left, dtype)  # (U, m, n or 2 n)
    return total.view(u, m, 2, n).sum(dim=2) if route == "pieces" else total


@torch.no_grad()  # no graph is needed; and a stack with out= refuses an input that requires grad
def weighted_sums(
    uses: dict[str, list[PerExampleGrad]], weights: Tensor, budget: int | None = None
) -> dict[str, Tensor]:
    """``sum_i w_i G_i`` of every parameter of ``uses`` (name -> its combined uses) that shares its factor
    shapes and route with another one, groupwise (see the module docstring), each shaped (rows, cols)
    in at least float32. Those parameters are removed from ``uses``; the rest are left for
    ``factors.weighted_sum``. ``budget`` None: ``gram_batches.BATCH_BYTES`` as it is at the call."""
    budget = gram_batches.BATCH_BYTES if budget is None else budget
    groups: dict[tuple, list[tuple[str, OuterSum, int]]] = {}
    for name, found in uses.items():
        g = _batchable(found)
        if g is None:
            continue
        route = _dense_pair_route(g)[0]  # type: ignore[index]
        if route == "examples":  # one GEMM per example and weight already: nothing to batch
            continue
        size = sum_footprint(g)
        if size > budget:
            continue
        row, col = g.row.values, g.col.values  # type: ignore[union-attr]
        key = (route, tuple(row.shape), tuple(col.shape), row.dtype, col.dtype, row.device)
        groups.setdefault(key, []).append((name, g, size))
    chunks = [chunk for members in groups.values() for chunk in _chunks(members, budget) if len(chunk) > 1]
    del groups
    sums: dict[str, Tensor] = {}
    while chunks:
        chunk = chunks.pop()  # its factors are freed once its sums are taken
        for name, _ in chunk:
            del uses[name]
        total = _group_sum([g for _, g in chunk], weights)
        sums.update(zip((name for name, _ in chunk), total.unbind(0), strict=True))
    return sums
