"""Splitting one rank's share of a logical batch into physical micro-batches.

The logical batch of a DP step (Poisson-sized, B in expectation) is collated once and processed in
micro-batches of at most ``per_device_train_batch_size`` rows; gradients are accumulated inside the
step, so the split changes memory use, not the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

# Tensors laid out (batch, sequence) whose padded tail may be cut off.
SEQUENCE_KEYS = frozenset(
    {"input_ids", "attention_mask", "token_type_ids", "position_ids", "labels", "special_tokens_mask"}
)
IGNORE_INDEX = -100


def batch_size(batch: Mapping[str, Any]) -> int:
    """Number of rows of a collated batch (0 for the empty batch ``{}``); rows must agree."""
    sizes = {k: v.shape[0] for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    if not sizes:
        if batch:
            raise ValueError(f"collated batch has no batched tensor; keys: {sorted(batch)}")
        return 0
    if len(set(sizes.values())) != 1:
        raise ValueError(f"collated batch has tensors with different numbers of rows: {sizes}")
    return next(iter(sizes.values()))


def split_micro_batches(batch: Mapping[str, Any], max_size: int) -> list[dict[str, Any]]:
    """Consecutive row slices of at most ``max_size`` rows, each with its right padding trimmed.

    Every tensor with a batch dimension is sliced; other values are passed to every slice unchanged.
    """
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
        raise ValueError(f"per_device_train_batch_size must be a positive integer, got {max_size!r}")
    n = batch_size(batch)
    slices = []
    for start in range(0, n, max_size):
        rows = slice(start, min(start + max_size, n))
        micro = {k: v[rows] if isinstance(v, torch.Tensor) and v.dim() > 0 else v for k, v in batch.items()}
        slices.append(trim_right_padding(micro))
    return slices


def trim_right_padding(batch: dict[str, Any]) -> dict[str, Any]:
    """Drop trailing positions that are padding in every row (attention_mask 0 and no label).

    Only for batches made of (batch, sequence) LM tensors (``SEQUENCE_KEYS``) with an attention
    mask. Cutting a right-padded tail leaves every real position's output unchanged: padded keys are
    masked out of attention and positions count from the left. Collating a whole share pads it to
    its longest row; trimming gives each micro-batch its own length back.
    """
    mask = batch.get("attention_mask")
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    if mask is None or mask.dim() != 2 or not set(tensors) <= SEQUENCE_KEYS:
        return batch
    length = mask.shape[1]
    if any(v.dim() != 2 or v.shape[1] != length for v in tensors.values()):
        return batch
    used = mask.bool().any(dim=0)
    labels = tensors.get("labels")
    if labels is not None:
        used |= (labels != IGNORE_INDEX).any(dim=0)
    keep = int(used.nonzero().max()) + 1 if used.any() else 1
    if keep == length:
        return batch
    # contiguous: models reshape these with .view() (BERT's MLM loss does labels.view(-1))
    return {k: v[:, :keep].contiguous() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
