"""Per-example gradients of expert-indexed parameters (mixture-of-experts layers), in factored form.

transformers 5 keeps a layer's experts as one parameter W of shape (E, rows, cols) (``gate_up_proj``,
``down_proj``; biases (E, n) are the case cols = 1). Every token t is routed to k experts; each
(token, expert) *pair* p adds ``row_p col_p^T`` to the gradient of W[expert(p)] (for a weight, the output
gradient and the input of that expert's product; see ``rules_moe``). Example i's gradient is

    G_i[e] = sum_{p in P(i, e)} row_p col_p^T,      P(i, e): the pairs of example i's tokens routed to e,

so ``||G_i||^2 = sum_e ||G_i[e]||^2`` and, for two uses of W, ``<G_i, H_i> = sum_e <G_i[e], H_i[e]>``.
Each (example, expert) block is taken like one weight of ``factors`` (mixed ghost clipping, Bu et al.
2023): from the Gram matrices of its pairs, ``sum_{p, q} <row_p, row_q><col_p, col_q>``, or from the
block G_i[e] formed, whichever ``factors.norm_strategy``'s rule picks for that expert (formed only when
the (rows x cols) block is no larger than the pairs' factors it stands for). The norm is taken one
expert at a time, so at most one expert's per-example blocks, (b, rows, cols), exist at once: never a
per-example copy of all experts, (b, E, rows, cols). The clipped sum ``sum_i c_i G_i`` is, per expert,
one (rows x |P_e|) @ (|P_e| x cols) product with c_i folded into the pairs (book-keeping, Bu et al.
2023): the work of that expert's ordinary weight gradient.

Measured (tests/test_clipping_moe.py, a dispatch mode recording every tensor of a clipped backward): a
Mixtral layer of 5 experts (72 x 20 up, 20 x 36 down), top-2, 3 examples of 11 tokens: a block pays
from 15.7 (down: 12.9) pairs of one example on one expert and an example sends at most 11, so only Gram
matrices appear, no (3, 72, 20) block; with 70 tokens and 20 x 8 / 8 x 10 experts blocks are formed,
(3, 20, 8), one expert at a time. In neither case does any tensor of 3 x 5 x rows x cols entries appear.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hush_hf.clipping.factors import ExtensionGrad, PerExampleGrad, compute_dtype


@dataclass(frozen=True)
class _Expert:
    """One expert's pairs, example by example: ``row``/``col`` of shape (b, T, n), T the most pairs any
    example sends to it, examples with fewer padded with zero pairs (which add nothing)."""

    row: Tensor
    col: Tensor


def _blocks(expert: _Expert, dtype: torch.dtype) -> Tensor:
    """The expert's per-example blocks G_i[e] = sum_p row_p col_p^T, flattened: (b, rows * cols)."""
    return torch.bmm(expert.row.to(dtype).transpose(1, 2), expert.col.to(dtype)).flatten(1)


@dataclass(frozen=True)
class RoutedOuterSum(ExtensionGrad):
    """``G_i[e] = sum_{p: example(p) = i, expert(p) = e} row_p col_p^T`` for a (E, rows, cols) parameter.

    ``example``, ``expert``: (P,) integer tensors; ``row`` (P, rows), ``col`` (P, cols). Pairs that
    carry nothing (a zero routing weight or output gradient) may be left out: they add 0.
    """

    example: Tensor
    expert: Tensor
    row: Tensor
    col: Tensor
    batch: int
    num_experts: int

    def __post_init__(self) -> None:
        pairs = self.example.shape[0]
        if self.expert.shape != (pairs,) or self.row.shape[0] != pairs or self.col.shape[0] != pairs:
            raise ValueError(
                f"routed pairs disagree: {pairs} examples, experts {tuple(self.expert.shape)}, rows "
                f"{tuple(self.row.shape)}, cols {tuple(self.col.shape)}"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.num_experts, self.row.shape[1], self.col.shape[1]

    def _sorted(self) -> tuple[Tensor, list[int], list[int]]:
        """The pairs ordered by (expert, example) and each hit expert's [start, end) in that order."""
        order = torch.argsort(self.expert * self.batch + self.example, stable=True)
        counts = torch.bincount(self.expert, minlength=self.num_experts).tolist()
        starts, hit, bounds = 0, [], []
        for e, count in enumerate(counts):
            if count:
                hit.append(e)
                bounds.append((starts, starts + count))
            starts += count
        return order, hit, bounds  # type: ignore[return-value]

    def _experts(self) -> dict[int, _Expert]:
        """Every hit expert's pairs laid out (b, T_e, n) (see ``_Expert``)."""
        order, hit, bounds = self._sorted()
        example = self.example[order]
        row, col = self.row[order], self.col[order]
        out: dict[int, _Expert] = {}
        for e, (start, end) in zip(hit, bounds, strict=True):
            ex = example[start:end]
            counts = torch.bincount(ex, minlength=self.batch)
            width = int(counts.max())
            first = torch.cumsum(counts, 0) - counts  # where each example's pairs start
            slot = torch.arange(end - start, device=ex.device) - first[ex]
            blocks = []
            for values in (row[start:end], col[start:end]):
                block = values.new_zeros(self.batch, width, values.shape[1])
                block[ex, slot] = values
                blocks.append(block)
            out[e] = _Expert(*blocks)
        return out

    def inner(self, other: PerExampleGrad) -> Tensor:
        """``sum_e <G_i[e], H_i[e]>`` per example, shape (b,), expert by expert (see the module docstring)."""
        if not isinstance(other, RoutedOuterSum) or other.shape != self.shape or other.batch != self.batch:
            raise ValueError(
                "an expert-indexed parameter's uses must all be routed uses of the same shape; got "
                f"{type(other).__name__} beside a routed use of shape {self.shape}"
            )
        dtype = compute_dtype(self.row, self.col, other.row, other.col)
        total = torch.zeros(self.batch, dtype=dtype, device=self.row.device)
        mine = self._experts()
        theirs = mine if other is self else other._experts()
        _, rows, cols = self.shape
        pair_bytes = rows * self.row.element_size() + cols * self.col.element_size()
        for e in sorted(mine.keys() & theirs.keys()):
            a, c = mine[e], theirs[e]
            steps = a.row.shape[1] + (c.row.shape[1] if c is not a else 0)
            # factors.norm_strategy's rule: form the block when it is no larger than the pairs' factors.
            if rows * cols * dtype.itemsize <= steps * pair_bytes:
                block_a = _blocks(a, dtype)
                block_c = block_a if c is a else _blocks(c, dtype)
                total += torch.bmm(block_a[:, None, :], block_c[:, :, None]).flatten()
            else:
                k_row = torch.bmm(a.row.to(dtype), c.row.to(dtype).transpose(1, 2))
                k_col = torch.bmm(a.col.to(dtype), c.col.to(dtype).transpose(1, 2))
                total += (k_row * k_col).sum(dim=(1, 2))
        return total

    def weighted_sum(self, weights: Tensor) -> Tensor:
        """``sum_i w_i G_i``, shape (E, rows, cols), one product per hit expert with w folded into the
        narrower factor (no per-example tensor)."""
        dtype = compute_dtype(self.row, self.col)
        out = torch.zeros(self.shape, dtype=dtype, device=self.row.device)
        order, hit, bounds = self._sorted()
        w = weights.to(dtype)[self.example[order]][:, None]
        row, col = self.row[order].to(dtype), self.col[order].to(dtype)
        fold_row = row.shape[1] <= col.shape[1]
        for e, (start, end) in zip(hit, bounds, strict=True):
            r, c = row[start:end], col[start:end]
            if fold_row:
                r = r * w[start:end]
            else:
                c = c * w[start:end]
            out[e] = r.T @ c
        return out
