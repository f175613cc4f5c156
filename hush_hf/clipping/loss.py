"""Per-example language-modelling loss: the quantity each example's gradient is clipped for."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100

_SELECT_BELOW = 0.5
"""Compute the softmax at the target positions only when at most this fraction of positions has one."""


def example_cross_entropy(logits: Tensor, labels: Tensor, *, causal: bool) -> Tensor:
    """loss_i = (1/n_i) sum_{t: y_{i,t} != -100} -log softmax(logits_{i,t})[y_{i,t}], shape (b,).

    n_i is example i's number of target tokens; an example with none has loss 0 (and gradient 0).
    ``causal=True`` predicts token t+1 from position t (logits[:, :-1] against labels[:, 1:]), as
    transformers' causal-LM loss does; ``causal=False`` (masked LM) compares position by position.

    Why a per-example *mean* over tokens: the privacy unit is the example, and clipping bounds each
    example's whole gradient by C whatever its scale, so any per-example reduction is private. The
    mean keeps every example's loss on one scale, so long and short examples are clipped alike; a
    sum would make long examples' gradients larger and clip them harder. (transformers' own loss is
    a token-weighted mean over the batch, which is not a sum of per-example terms.) Computed in
    float32 at least, like transformers' loss.
    """
    if not isinstance(logits, Tensor) or logits.dim() != 3 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a floating tensor of shape (batch, seq, vocab), got {shape}")
    if (
        not isinstance(labels, Tensor)
        or labels.dtype in (torch.bool,)
        or labels.is_floating_point()
        or labels.is_complex()
        or tuple(labels.shape) != tuple(logits.shape[:2])
    ):
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"labels must be an integer tensor of shape {tuple(logits.shape[:2])}, got {shape}")
    vocab = logits.shape[-1]
    bad_mask = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= vocab))
    if causal:
        # Shift the labels, not the logits: slicing logits[:, :-1] would copy the (b, T, vocab) tensor
        # forward and again backward. The last position gets no target (loss 0, not counted).
        labels = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    b, t_len = labels.shape
    dtype = torch.promote_types(logits.dtype, torch.float32)
    flat_logits, flat_labels = logits.reshape(b * t_len, vocab), labels.reshape(b * t_len).long()
    targets = flat_labels != IGNORE_INDEX
    n_targets = targets.view(b, t_len).sum(dim=1)
    # One device-to-host read for both (on a GPU each read waits for the queue): the bad labels' count
    # and the targets' count.
    bad_count, count = torch.stack([bad_mask.sum(), n_targets.sum()]).tolist()
    if bad_count:
        # Token ids may be secret: report the position of a bad label, never its value.
        i, t = torch.nonzero(bad_mask)[0].tolist()
        raise ValueError(
            f"labels must be in [0, {vocab}) or {IGNORE_INDEX}; "
            f"{bad_count} are not (first at example {i}, position {t})"
        )
    if count <= _SELECT_BELOW * b * t_len:
        # Sparse targets (a masked LM: ~15%): the softmax only where there is one. Exact: an ignored
        # position adds 0 to the loss and gets a zero gradient either way.
        rows = torch.nonzero(targets).flatten()
        token_loss = F.cross_entropy(flat_logits[rows].to(dtype), flat_labels[rows], reduction="none")
        per_example = torch.zeros(b, dtype=token_loss.dtype, device=token_loss.device)
        per_example = per_example.index_add(0, rows // t_len, token_loss)
    else:
        token_loss = F.cross_entropy(
            flat_logits.to(dtype), flat_labels, ignore_index=IGNORE_INDEX, reduction="none"
        )
        per_example = token_loss.view(b, t_len).sum(dim=1)
    return per_example / n_targets.clamp_min(1).to(dtype)
