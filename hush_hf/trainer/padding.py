"""Left-padded batches, moved to the right before the DP step: each example must stand alone.

DP-SGD's sensitivity C holds only if example i's clipped gradient is a function of example i
(docs/design.md, "Examples stand alone"). A left-padded row breaks that: absolute positions (GPT-2,
GPT-Neo, BERT) count from the row's left edge, so its tokens sit further right the longer the *other*
rows are, and a causal LM scores the row's first token from a pad position, whose hidden state depends
on the padded width (eager attention spreads a fully masked row over every key). Adding one long row to
five short ones moved the clipped sum by 1.06-2.2 C here (tests/test_example_independence.py); right
padding moves it by the new row's clipped gradient alone, at most C.

Right padding is exact because nothing the loss reads sees a trailing pad: the loss ignores pad
positions (label -100), a causal mask hides later positions from earlier ones, a padding mask hides
pad keys from every query (causal and bidirectional, BERT's MLM included), and positions count from
the left edge, where the row starts. So the row's real positions compute exactly what the row alone
computes.

:func:`right_align` moves every row's leading padding (the zeros of its ``attention_mask`` before its
first one) to its end, in every tensor laid out (batch, sequence, ...) like the mask: the values at
pad positions (pad id, mask 0, label -100, token type 0) move with them, so the batch is exactly the
one the same collator builds with ``padding_side="right"``. Refused instead (a ``ValueError`` naming
the fix) where moving cannot be shown exact:

- ``position_ids`` given with the batch: whether they count from the left edge (the row then moves
  with them) or from the first real token cannot be told;
- encoder-decoder models: their labels and decoder inputs are laid out along the decoder's length,
  not the mask's, and padded by the collator on the same side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

RIGHT_PADDING_FIX = "pad on the right: tokenizer.padding_side = 'right' (or the data collator's padding side)"


def leading_padding(mask: Tensor) -> Tensor:
    """Per row, how many positions precede its first nonzero mask entry (0 for an all-zero row)."""
    attended = mask != 0
    first = attended.int().argmax(dim=1)
    return torch.where(attended.any(dim=1), first, torch.zeros_like(first))


def is_left_padded(batch: Mapping[str, Any]) -> bool:
    """Whether some row of a batch with a (batch, seq) ``attention_mask`` starts with padding."""
    mask = batch.get("attention_mask")
    return isinstance(mask, Tensor) and mask.dim() == 2 and bool(leading_padding(mask).any())


def right_align(batch: dict[str, Any], *, encoder_decoder: bool) -> dict[str, Any]:
    """``batch`` with every row's leading padding moved to its end (see the module docstring).

    Returns ``batch`` itself when no row starts with padding (or it has no (batch, seq) mask).
    Every tensor whose first two dimensions are the mask's (batch, seq) is rolled row by row along
    dimension 1; other values pass unchanged.
    """
    if not is_left_padded(batch):
        return batch
    mask = batch["attention_mask"]
    row = int(leading_padding(mask).nonzero()[0, 0])
    if encoder_decoder:
        raise ValueError(
            f"left-padded batch (attention_mask row {row} starts with padding) for an encoder-decoder "
            "model: its labels are padded along the decoder's length, which cannot be re-aligned; "
            + RIGHT_PADDING_FIX
        )
    if "position_ids" in batch:
        raise ValueError(
            f"left-padded batch (attention_mask row {row} starts with padding) with position_ids: whether "
            f"they count from the row's edge or its first token is unknown; {RIGHT_PADDING_FIX}, "
            "or leave position_ids out of the batch"
        )
    b, length = mask.shape
    shift = leading_padding(mask)
    index = (torch.arange(length, device=mask.device)[None, :] + shift[:, None]) % length  # (b, seq)
    aligned = {}
    for key, value in batch.items():
        if isinstance(value, Tensor) and value.dim() >= 2 and tuple(value.shape[:2]) == (b, length):
            rows = index.to(value.device).view(b, length, *([1] * (value.dim() - 2))).expand_as(value)
            value = torch.gather(value, 1, rows)
        aligned[key] = value
    return aligned
