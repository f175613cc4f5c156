"""Steps whose term of a per-example gradient is zero, left out before the norms and clipped sums.

For a use ``G_i = sum_t row_{i,t} col_{i,t}^T`` a step t whose row or column vector is all zero adds
nothing to ``G_i``. A masked-LM head gets an output gradient only at the ~15% masked positions (padding
and ignored labels likewise), so every Gram matrix or product over T steps costs that much less when
they are dropped. Exact: only zero terms are left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from hush_hf.clipping.factors import (
    DenseFactor,
    Factor,
    OneHotFactor,
    OuterSum,
    PerExampleGrad,
    _dense,
    norm_strategy,
)

_COMPACT_BELOW = 0.75
"""Drop zero steps when at most this fraction of the T steps carries a nonzero term (``drop_zero_steps``)."""


def _nonzero_rows(f: Factor) -> Tensor | None:
    """(b, T) mask of the steps whose dense factor vector is not all zero; None for a one-hot factor
    (never zero). Exact (no norm that could underflow), and a NaN step is kept (``amax`` propagates
    NaN), so a non-finite norm is still seen. (max and min: ~5x faster on CPU than a max-abs norm.)"""
    v = _dense(f)
    if v is None:
        return None
    high = v.amax(dim=-1)
    return (high > 0) | (v.amin(dim=-1) < 0) | high.isnan()


def _take_steps(f: Factor, index: Tensor) -> Factor:
    if isinstance(f, DenseFactor):
        return DenseFactor(torch.gather(f.values, 1, index[:, :, None].expand(-1, -1, f.values.shape[-1])))
    return OneHotFactor(torch.gather(f.ids, 1, index), f.size)


def _worth_compacting(bound: int, steps: int) -> bool:
    return steps - bound <= _COMPACT_BELOW * steps


def _compact(g: OuterSum) -> PerExampleGrad:
    mask = _step_mask(g)
    return _compact_to(g, mask, int(mask.sum(dim=1).max()) if mask.numel() else 0)


def _step_mask(g: OuterSum) -> Tensor:
    """(b, T): the steps whose term is not zero."""
    masks = [m for m in (_nonzero_rows(g.row), _nonzero_rows(g.col)) if m is not None]
    return masks[0] if len(masks) == 1 else masks[0] & masks[1]


def _compact_to(g: OuterSum, mask: Tensor, keep: int) -> PerExampleGrad:
    """g with each example's ``keep`` first steps by ``mask`` (its nonzero ones, then zero-term padding),
    or g itself when that keeps too many to be worth it."""
    if keep > _COMPACT_BELOW * mask.shape[1]:
        return g
    # Nonzero steps first (a stable sort of the mask), then zero-term steps as padding.
    index = torch.sort(mask.to(torch.int8), dim=1, descending=True, stable=True).indices[:, :keep]
    return OuterSum(_take_steps(g.row, index), _take_steps(g.col, index))


def drop_zero_steps(g: PerExampleGrad, not_worth: set[tuple[int, ...]] | None = None) -> PerExampleGrad:
    """The same per-example gradient with the steps t whose term row_t col_t^T is zero left out.

    A masked-LM head gets an output gradient only at the ~15% masked positions (padding and ignored
    labels likewise), and every Gram or matmul over T steps costs that much less on the rest. Exact:
    a zero step adds nothing to G_i. Each example keeps its nonzero steps, padded to the largest count
    with steps whose dense factor is zero. A zero step has a zero first entry on some side: a cheap
    upper bound on each example's zero steps settles most uses (no step is zero), one read, without
    reading the whole factors.

    ``not_worth``: the (b, T) shapes not to check (returned as they are, with all their steps), to which
    a use whose check finds too few zero steps to compact adds its shape (``drop_zero_steps_if_costly``).
    """
    firsts = _first_entries(g)
    if firsts is None:
        return g
    shape = tuple(firsts[0].shape)
    if not_worth is not None and shape in not_worth:
        return g
    maybe_zero = (firsts[0] == 0) | (firsts[1] == 0)
    if not _worth_compacting(int(maybe_zero.sum(dim=1).min()), shape[1]):
        if not_worth is not None:
            not_worth.add(shape)
        return g
    return _compact(g)  # type: ignore[arg-type]


def drop_zero_steps_if_costly(
    g: PerExampleGrad, vocab: int | None, not_worth: set[tuple[int, ...]] | None = None
) -> PerExampleGrad:
    """``drop_zero_steps`` for one use arriving on its own (a layer call's gradient hook under gradient
    checkpointing), without the device-to-host read its check takes where the check is not worth it. On
    a GPU each read drains the queue: one per use made the checkpointed step of Llama-1B with LoRA
    host-bound on an H200 (hundreds a step). Exact either way: only zero terms are ever left out, and a
    use returned as it is has all its steps. ``vocab``: see ``norm_strategy``. Not checked:

    - a use whose per-example gradient takes no more bytes than its factors (a low-rank adapter's, a
      small projection's): ``norm_strategy`` materialises it, at ``T rows cols`` with or without its
      zero steps, little either way. (A use it materialises only up to 5/4 of its factors' bytes, a
      full float32 layer's weight at T near its width, is still checked: padding can halve its
      product.);
    - a use of a (b, T) shape in ``not_worth`` (the pass's), to which a use whose check found too few
      zero steps to compact adds its shape. A backward pass reaches the output layer first, whose zero
      steps are the positions without a target; a layer below gets a gradient at every position that
      a target's position reads (all of them in an encoder, all up to the last target in a decoder), so
      it has no more zero steps. One read then settles a pass for a causal LM without padding, where a
      read per use was spent to find nothing to drop (a masked LM: one read per use until a layer below
      the head finds too few).
    """
    return g if _materialized_anyway(g, vocab) else drop_zero_steps(g, not_worth)


def _materialized_anyway(g: PerExampleGrad, vocab: int | None) -> bool:
    return isinstance(g, OuterSum) and norm_strategy([g], vocab, beyond_factors=False) == "materialize"


def _first_entries(g: PerExampleGrad) -> tuple[Tensor, Tensor] | None:
    """The (b, T) first entries of g's two dense factors (the one dense factor twice), or None when
    there is nothing to drop (not an ``OuterSum``, no dense factor, or an empty one)."""
    if not isinstance(g, OuterSum):
        return None
    dense = [v for v in (_dense(g.row), _dense(g.col)) if v is not None]
    if not dense or any(v.dim() != 3 or v.shape[-1] == 0 for v in dense) or dense[0].shape[:2].numel() == 0:
        return None
    return dense[0][:, :, 0], dense[-1][:, :, 0]


def drop_zero_steps_all(uses: Sequence[PerExampleGrad], vocab: int | None = None) -> list[PerExampleGrad]:
    """``drop_zero_steps`` of every use, its cheap bound (see ``drop_zero_steps``) taken for all uses of
    one (b, T) shape at once and read with one device-to-host transfer for the whole list (instead of a
    few small operations and one stall of the step per use on a GPU), and the compacted widths of the
    uses worth compacting with one more (not one each). Uses that are materialised anyway
    are left as they are (see ``drop_zero_steps_if_costly``): when that is all of them (LoRA), there is
    no read, which on a GPU would hold the host until the backward pass has run, and the device while
    the host then works out the norms and sums."""
    out = list(uses)
    groups: dict[tuple, list[tuple[int, Tensor, Tensor]]] = {}
    for k, g in enumerate(out):
        firsts = None if _materialized_anyway(g, vocab) else _first_entries(g)
        if firsts is not None:
            a, c = firsts
            groups.setdefault((tuple(a.shape), a.device, a.dtype, c.dtype), []).append((k, a, c))
    if not groups:
        return out
    indices, steps, bounds = [], [], []
    for (shape, *_), members in groups.items():
        maybe_zero = torch.stack([a for _, a, _ in members]) == 0
        maybe_zero |= torch.stack([c for _, _, c in members]) == 0
        bounds.append(maybe_zero.sum(dim=2).amin(dim=1))  # (K,): each use's fewest maybe-zero steps
        indices += [k for k, _, _ in members]
        steps += [shape[1]] * len(members)
    read = _read_together(bounds)
    chosen = [
        k for k, t_len, bound in zip(indices, steps, read, strict=True) if _worth_compacting(bound, t_len)
    ]
    masks = {k: _step_mask(out[k]) for k in chosen}  # type: ignore[arg-type]
    # Each chosen use's widest example, read back together: one more read in all, not one per use.
    widest = _read_together([m.sum(dim=1).max().view(1) for m in masks.values()])
    for (k, mask), keep in zip(masks.items(), widest, strict=True):
        out[k] = _compact_to(out[k], mask, keep)  # type: ignore[arg-type]
    return out


def _read_together(parts: list[Tensor]) -> list[int]:
    """The entries of 1-D integer tensors, in order, read back with one transfer per device."""
    by_device: dict[torch.device, list[int]] = {}
    for k, part in enumerate(parts):
        by_device.setdefault(part.device, []).append(k)
    values: list[list[int]] = [[] for _ in parts]
    for ks in by_device.values():
        flat = torch.cat([parts[k] for k in ks]).tolist()
        start = 0
        for k in ks:
            values[k] = flat[start : start + parts[k].numel()]
            start += parts[k].numel()
    return [v for part in values for v in part]
