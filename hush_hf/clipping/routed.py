"""Per-example gradients of expert-indexed parameters (mixture-of-experts layers), in factored form.

transformers 5 keeps a layer's experts as one parameter W of shape (E, rows, cols) (``gate_up_proj``,
``down_proj``; biases (E, n) are the case cols = 1). Every token t is routed to k experts; each
(token, expert) *pair* p adds ``row_p col_p^T`` to the gradient of W[expert(p)] (for a weight, the output
gradient and the input of that expert's product; see ``rules_moe``). Example i's gradient is

    G_i[e] = sum_{p in P(i, e)} row_p col_p^T,      P(i, e): the pairs of example i's tokens routed to e,

so ``||G_i||^2 = sum_e ||G_i[e]||^2`` and, for two uses of W, ``<G_i, H_i> = sum_e <G_i[e], H_i[e]>``.
Each (example, expert) block is taken like one weight of ``factors`` (mixed ghost clipping, Bu et al. 2023):
from the Gram matrices of its pairs, ``sum_{p, q} <row_p, row_q><col_p, col_q>``, or from the block G_i[e]
formed, for that (example, expert) group (formed only when the block is no larger than its factors;
``factors.norm_strategy`` keeps a whole weight's, up to 5/4 in float32). Blocks are formed one at a
time: never a per-example copy, (b, rows, cols), let alone one of all experts, (b, E, rows, cols). On CPU
each group's Gram matrices are taken on their own (``PER_GROUP_DEVICES``); elsewhere (a kernel launch per
group would cost more than the products) they are batched by size: each group padded to its size class (a
power of two or 3/4 of one) and each class taken in one product, so the work is at most 2.25x the groups'
own whatever the routing (padding every example to the busiest example of an expert cost up to b x that
busiest group's, e.g. a randomly initialised Mixtral sending 127 of an example's 128 tokens to one expert).
The pairs are kept in (expert, example) order (``pair_groups``: the rules build them so; others are sorted
once), every group a contiguous run. The clipped sum ``sum_i c_i G_i`` is, per expert, one (rows x |P_e|) @
(|P_e| x cols) product with c_i folded into the pairs (book-keeping, Bu et al. 2023): the work of that
expert's ordinary weight gradient.

Measured (tests/test_clipping_moe.py, a dispatch mode recording every tensor of a clipped backward): a
Mixtral layer of 5 experts (72 x 20 up, 20 x 36 down), top-2, 3 examples of 11 tokens: a block pays
from 15.7 (down: 12.9) pairs of one example on one expert and an example sends at most 11, so only Gram
matrices appear, no (72, 20) block is squared; with 70 tokens and 20 x 8 / 8 x 10 experts blocks are
formed, (20, 8), one at a time. In neither case does a (3, rows, cols) tensor appear.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from hush_hf.clipping.factors import ExtensionGrad, PerExampleGrad, compute_dtype, exact_sum


@dataclass(frozen=True)
class PairGroups:
    """The pairs grouped by (expert, example): ``order`` puts them in that order (None: they already are,
    as ``rules_moe`` builds them), ``sizes[e * b + i]`` is how many pairs example i sends to expert e."""

    order: Tensor | None
    sizes: list[int]

    def expert_counts(self, batch: int) -> list[int]:
        """Pairs per expert (the groups of one expert are adjacent)."""
        return [sum(self.sizes[e : e + batch]) for e in range(0, len(self.sizes), batch)]


def pair_groups(example: Tensor, expert: Tensor, batch: int, num_experts: int) -> PairGroups:
    """``PairGroups`` of the pairs, with one device-to-host read: the group sizes and whether the pairs
    are already grouped travel together."""
    key = expert.long() * batch + example.long()
    ordered = (key[1:] >= key[:-1]).all() if key.numel() > 1 else key.new_ones((), dtype=torch.bool)
    counts = torch.bincount(key, minlength=batch * num_experts)
    *sizes, is_grouped = torch.cat([counts, ordered.long()[None]]).tolist()
    return PairGroups(None if is_grouped else torch.argsort(key, stable=True), sizes)


def _padded_width(n: int) -> int:
    """The size class a group of n >= 1 pairs is padded to: the least of 2^k and 3 * 2^(k-2) (k >= 2)
    that is >= n, so at most 1.5 n (2.25x its Gram work), in about 2 log2(n) classes."""
    power = 1 << (n - 1).bit_length()
    return power * 3 // 4 if power >= 4 and n <= power * 3 // 4 else power


PER_GROUP_DEVICES = frozenset({"cpu"})
"""Devices where ``RoutedOuterSum``'s norm takes the (example, expert) groups one by one (no padding, no
gathered copy), not in size classes (one product per class: fewer kernel launches, for GPUs)."""


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
    carry nothing (a zero routing weight or output gradient) may be left out: they add 0. ``groups``:
    the pairs' ``pair_groups``, when the caller has it (the uses of one experts call share it); else
    computed on first need.
    """

    example: Tensor
    expert: Tensor
    row: Tensor
    col: Tensor
    batch: int
    num_experts: int
    groups: PairGroups | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        pairs = self.example.shape[0]
        if self.expert.shape != (pairs,) or self.row.shape[0] != pairs or self.col.shape[0] != pairs:
            raise ValueError(
                f"routed pairs disagree: {pairs} examples, experts {tuple(self.expert.shape)}, rows "
                f"{tuple(self.row.shape)}, cols {tuple(self.col.shape)}"
            )
        if self.groups is not None and len(self.groups.sizes) != self.batch * self.num_experts:
            raise ValueError(
                f"routed pair groups cover {len(self.groups.sizes)} (expert, example) groups, not "
                f"{self.num_experts} x {self.batch}"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.num_experts, self.row.shape[1], self.col.shape[1]

    @cached_property
    def _grouped(self) -> tuple[PairGroups, Tensor, Tensor, Tensor]:
        """(groups, example, row, col) with the pairs in (expert, example) order."""
        groups = self.groups or pair_groups(self.example, self.expert, self.batch, self.num_experts)
        if groups.order is None:
            return groups, self.example, self.row, self.col
        order = groups.order
        return groups, self.example[order], self.row[order], self.col[order]

    def _experts(self) -> dict[int, _Expert]:
        """Every hit expert's pairs laid out (b, T_e, n) (see ``_Expert``)."""
        groups, example, row, col = self._grouped
        out: dict[int, _Expert] = {}
        end = 0
        for e, count in enumerate(groups.expert_counts(self.batch)):
            start, end = end, end + count
            if not count:
                continue
            ex = example[start:end]
            sizes = groups.sizes[e * self.batch : (e + 1) * self.batch]
            counts = torch.tensor(sizes, device=ex.device)
            first = torch.cumsum(counts, 0) - counts  # where each example's pairs start
            slot = torch.arange(end - start, device=ex.device) - first[ex]
            blocks = []
            for values in (row[start:end], col[start:end]):
                block = values.new_zeros(self.batch, max(sizes), values.shape[1])
                block[ex, slot] = values
                blocks.append(block)
            out[e] = _Expert(*blocks)
        return out

    def inner(self, other: PerExampleGrad) -> Tensor:
        """``sum_e <G_i[e], H_i[e]>`` per example, shape (b,) (see the module docstring)."""
        if not isinstance(other, RoutedOuterSum) or other.shape != self.shape or other.batch != self.batch:
            raise ValueError(
                "an expert-indexed parameter's uses must all be routed uses of the same shape; got "
                f"{type(other).__name__} beside a routed use of shape {self.shape}"
            )
        if other is self:
            return self._squared_norms()
        dtype = compute_dtype(self.row, self.col, other.row, other.col)
        total = torch.zeros(self.batch, dtype=torch.float64, device=self.row.device)
        mine, theirs = self._experts(), other._experts()
        _, rows, cols = self.shape
        pair_bytes = rows * self.row.element_size() + cols * self.col.element_size()
        for e in sorted(mine.keys() & theirs.keys()):
            a, c = mine[e], theirs[e]
            steps = a.row.shape[1] + c.row.shape[1]
            # Form the block when it is no larger than the pairs' factors (one at a time, not kept).
            if rows * cols * dtype.itemsize <= steps * pair_bytes:
                total += exact_sum(_blocks(a, dtype) * _blocks(c, dtype), dim=1)
            else:
                k_row = torch.bmm(a.row.to(dtype), c.row.to(dtype).transpose(1, 2))
                k_col = torch.bmm(a.col.to(dtype), c.col.to(dtype).transpose(1, 2))
                total += exact_sum(k_row * k_col, dim=(1, 2))
        return total

    def _squared_norms(self) -> Tensor:
        """``||G_i||^2 = sum_e ||G_i[e]||^2``, group by group: a group of n pairs whose block is no larger
        than its factors is formed, one at a time; the others take
        ``sum_{p,q} <row_p, row_q><col_p, col_q>``, batched by size: each group padded to its size class W
        (``_padded_width``; the padding masked out), one Gram product per W. Work: at most 2.25x the
        unpadded Gram matrices', whatever the routing (an expert most of one example's tokens go to
        pads nothing else), in one product per size class instead of one per expert. Summed in float64
        (``factors.exact_sum``)."""
        groups, example, row, col = self._grouped
        dtype = compute_dtype(self.row, self.col)
        device = self.row.device
        total = torch.zeros(self.batch, dtype=torch.float64, device=device)
        _, rows, cols = self.shape
        pair_bytes = rows * self.row.element_size() + cols * self.col.element_size()
        starts = list(itertools.accumulate(groups.sizes, initial=0))
        if device.type in PER_GROUP_DEVICES:
            return self._squared_norms_group_by_group(starts, row, col, dtype, total)
        by_width: dict[int, list[int]] = {}
        for g, n in enumerate(groups.sizes):
            if not n:
                continue
            if rows * cols * dtype.itemsize <= n * pair_bytes:  # formed: one (rows x cols) block at a time
                r = row[starts[g] : starts[g] + n].to(dtype)
                block = r.T @ col[starts[g] : starts[g] + n].to(dtype)
                total[g % self.batch] += exact_sum(block.pow(2), dim=(0, 1))
            else:
                by_width.setdefault(_padded_width(n), []).append(g)
        for width, members in sorted(by_width.items()):
            first = torch.tensor([starts[g] for g in members], device=device)
            size = torch.tensor([groups.sizes[g] for g in members], device=device)
            slot = torch.arange(width, device=device)
            valid = slot[None, :] < size[:, None]  # (G, W)
            index = (first[:, None] + slot[None, :]).clamp_(max=row.shape[0] - 1)
            r, c = row[index].to(dtype), col[index].to(dtype)  # (G, W, n); padding rows masked below
            gram = torch.bmm(r, r.transpose(1, 2)).mul_(torch.bmm(c, c.transpose(1, 2)))
            # (where, not a product with the mask: a padding row may be another group's non-finite pair)
            gram = torch.where(valid[:, :, None] & valid[:, None, :], gram, 0.0)
            owner = torch.tensor([g % self.batch for g in members], device=device)
            total.index_add_(0, owner, exact_sum(gram, dim=(1, 2)))
        return total

    def _squared_norms_group_by_group(
        self, starts: list[int], row: Tensor, col: Tensor, dtype: torch.dtype, total: Tensor
    ) -> Tensor:
        """``_squared_norms`` on CPU: each group's own Gram matrices (or block), no padding and no gathered
        copy (a kernel launch per group costs nothing there; measured on the Mixtral bench's experts,
        one thread: 0.145 s against 0.23 s a step for the padded size classes)."""
        _, rows, cols = self.shape
        pair_bytes = rows * self.row.element_size() + cols * self.col.element_size()
        owners, sums = [], []
        for g, n in enumerate(self._grouped[0].sizes):
            if not n:
                continue
            r, c = row[starts[g] : starts[g] + n].to(dtype), col[starts[g] : starts[g] + n].to(dtype)
            if rows * cols * dtype.itemsize <= n * pair_bytes:  # the block, no larger than its factors
                terms = (r.T @ c).pow(2)
            else:
                terms = (r @ r.T).mul_(c @ c.T)
            sums.append(exact_sum(terms, dim=(0, 1)))
            owners.append(g % self.batch)
        if not sums:
            return total
        return total.index_add_(0, torch.tensor(owners, device=total.device), torch.stack(sums))

    def weighted_sum(self, weights: Tensor) -> Tensor:
        """``sum_i w_i G_i``, shape (E, rows, cols), one product per hit expert with w folded into the
        narrower factor (no per-example tensor)."""
        groups, example, row, col = self._grouped
        dtype = compute_dtype(self.row, self.col)
        out = torch.zeros(self.shape, dtype=dtype, device=self.row.device)
        w = weights.to(dtype)[example][:, None]
        row, col = row.to(dtype), col.to(dtype)
        if row.shape[1] <= col.shape[1]:
            row = row * w
        else:
            col = col * w
        end = 0
        for e, count in enumerate(groups.expert_counts(self.batch)):
            start, end = end, end + count
            if count:
                torch.mm(row[start:end].T, col[start:end], out=out[e])  # in place: no temporary
        return out
