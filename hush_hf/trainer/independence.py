"""Every example's loss depends on that example alone: the DP step's first-step self-check.

DP-SGD's sensitivity is C only if example i's clipped gradient ``clip(grad loss_i, C)`` is a function of
example i (Hush Alg. 2, line 9; docs/design.md, "Examples stand alone"). Many things break that
silently: left padding (re-padded, :mod:`hush_hf.trainer.padding`), a ``per_example_loss`` normalised
over the batch, labels on padding positions (the loss then changes with the padded width, i.e. with the
other rows' lengths), packing without a per-row mask, a model whose forward mixes rows (capacity-limited
experts, a batch statistic). Coupling shows in the loss: so at the first step of a run, before any
gradient reaches the optimizer, each of a few training rows is scored twice, without gradient:

- inside a batch: the rows collated together by the user's collator, re-padded and cut into
  micro-batches exactly as the DP step does;
- alone: the row collated by itself with the same collator, whatever its layout (padded on either
  side, with or without a mask, flattened), so the padded width and the other rows both change. A
  collator that draws at random (MLM masking: two collations differ) would score other masks alone, so
  for it the row is cut from its micro-batch to its own length instead (``alone``), which needs a
  per-row ``attention_mask``.

The two per-example losses must agree to rounding (``RTOL``); otherwise training is refused with the
rows named. The rows are the shortest and the longest of the training set's first ``SCAN_ROWS`` rows
and the first others (``CHECK_ROWS`` in all), so padding shows in every row but the longest; they do
not depend on the Poisson draw, so the check runs at step 0 even when the first batch is empty, and
identically on every rank (under FSDP its forwards are collectives). The model runs in eval mode
(dropout would make two forwards differ). Cost, once per run: one forward per check row alone and one
per check micro-batch, without gradient.

What it cannot see: coupling that shows only in training mode, only on other rows, or only in the
gradient and not the loss; it is a detector, not a proof.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

CHECK_ROWS = 4
SCAN_ROWS = 64

DECODER_KEYS = ("labels", "decoder_input_ids", "decoder_attention_mask", "decoder_position_ids")
"""Keys laid out along an encoder-decoder model's decoder length, not its encoder's mask."""

RTOL: dict[str, float] = {"float64": 1e-7, "float32": 1e-4, "reduced": 2.0**-5}
"""|loss_i(batch) - loss_i(alone)| <= RTOL * max(|loss_i(batch)|, |loss_i(alone)|, mean |loss| of the
check rows), by the precision the forwards run in ("reduced": bf16/fp16 parameters or mixed precision,
and TF32 matmuls on CUDA, whose 10-bit mantissa is fp16's).

The two forwards differ only in their shapes, so in the order of their sums. Measured on CPU (the 19
tiny random-init families of tests/model_families.py and BLOOM, 6 right-padded rows of 3-24 tokens):
at most 1.2e-9 relative in float64 (Llama + LoRA; float32 rotary tables), 2.1e-7 in float32; under
bf16 autocast the CPU kernels give every row bit-identical logits in a batch and alone (2.1e-7, from
the float32 loss). GPU kernels are chosen by shape and round differently, so for reduced precision
the bound is set from how far bf16 autocast is from float32 at all (two bf16 results are at most
twice that apart): 5e-4 on those models, 8.9e-4 on the pretrained MiniLM-L6 encoder (random MLM
head); 2^-5 leaves 17x. float32 on GPU differs from exact by ~1e-6; 1e-4 leaves 100x, and float64
1e-7 leaves 80x over the measured 1.2e-9.

What it catches at these bounds: the loss of a row left-padded (not re-padded) moves by 2.4e-3 to
1.4e-2 relative on those random-init models (caught in float32 and float64, not under reduced
precision: re-padding is what removes it there); a loss normalised by the batch mean, labels on
padding positions, or rows mixed by the model move it by more (tests/test_example_independence.py)."""


def check_rows(dataset: Any, count: int = CHECK_ROWS, scan: int = SCAN_ROWS) -> list[int]:
    """Up to ``count`` row indices of ``dataset``: the shortest and the longest ``input_ids`` among the
    first ``scan`` rows (in that order, when they differ), then the first others by index."""
    n = min(len(dataset), scan)
    lengths = [_length(dataset[i]) for i in range(n)]
    chosen: list[int] = []
    if n:
        shortest = min(range(n), key=lambda k: (lengths[k], k))
        longest = max(range(n), key=lambda k: (lengths[k], -k))
        chosen = [shortest] if longest == shortest else [shortest, longest]
    chosen += [i for i in range(n) if i not in chosen]
    return chosen[:count]


def _length(row: Any) -> int:
    ids = row.get("input_ids") if isinstance(row, Mapping) else None
    return len(ids) if ids is not None and hasattr(ids, "__len__") else 0


def alone(micro: Mapping[str, Any], row: int, *, encoder_decoder: bool) -> dict[str, Any]:
    """Row ``row`` of a micro-batch as a micro-batch of one, cut to its own length.

    It spans the first to the last position its (batch, seq) ``attention_mask`` attends to; every tensor
    laid out (batch, seq, ...) like the mask is cut there (labels at the cut positions included, so a
    loss that scores padding differs). Encoder-decoder models: only the encoder side is cut (``DECODER_KEYS``
    keep their length). Without a 2-D mask the row keeps the batch's length.
    """
    b = _rows(micro)
    single = {
        k: v[row : row + 1] if isinstance(v, Tensor) and v.dim() and v.shape[0] == b else v
        for k, v in micro.items()
    }
    mask = single.get("attention_mask")
    if not isinstance(mask, Tensor) or mask.dim() != 2 or not bool((mask != 0).any()):
        return single
    width = mask.shape[1]
    attended = (mask[0] != 0).nonzero()
    first, end = int(attended.min()), int(attended.max()) + 1
    return {
        k: v[:, first:end].contiguous()
        if isinstance(v, Tensor)
        and v.dim() >= 2
        and v.shape[1] == width
        and not (encoder_decoder and k in DECODER_KEYS)
        else v
        for k, v in single.items()
    }


def _rows(batch: Mapping[str, Any]) -> int:
    sizes = {v.shape[0] for v in batch.values() if isinstance(v, Tensor) and v.dim()}
    if len(sizes) != 1:
        raise ValueError(f"micro-batch tensors disagree on the number of rows: {sorted(sizes)}")
    return sizes.pop()


def coupled_rows(in_batch: Sequence[float], by_itself: Sequence[float], rtol: float) -> list[int]:
    """Positions i where ``in_batch[i]`` and ``by_itself[i]`` differ beyond ``rtol`` (see ``RTOL``).

    Both non-finite: not reported here (the clipping engine refuses a non-finite loss itself); one
    non-finite: reported.
    """
    a = torch.as_tensor(list(in_batch), dtype=torch.float64)
    b = torch.as_tensor(list(by_itself), dtype=torch.float64)
    finite = torch.isfinite(a) & torch.isfinite(b)
    scale = float(torch.cat([a[finite], b[finite]]).abs().mean()) if bool(finite.any()) else 0.0
    bound = rtol * torch.maximum(torch.maximum(a.abs(), b.abs()), torch.tensor(scale, dtype=torch.float64))
    differ = torch.where(finite, (a - b).abs() > bound, torch.isfinite(a) ^ torch.isfinite(b))
    return differ.nonzero().flatten().tolist()


def precision(parameter_dtypes: Sequence[torch.dtype], *, mixed_precision: bool, tf32: bool) -> str:
    """The ``RTOL`` key of a run: "reduced" under bf16/fp16 (mixed precision or parameters) or TF32
    matmuls, else "float32" unless every floating parameter is float64."""
    floating = [d for d in parameter_dtypes if d.is_floating_point]
    if mixed_precision or tf32 or any(torch.finfo(d).bits < 32 for d in floating):
        return "reduced"
    return "float64" if floating and all(d == torch.float64 for d in floating) else "float32"


def seed_random_states(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (inside a preserved random state)."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def same_batch(first: Mapping[str, Any], second: Mapping[str, Any]) -> bool:
    """Whether two collations are equal key by key (tensors exactly, other values by ``==``)."""
    if first.keys() != second.keys():
        return False
    for key, a in first.items():
        b = second[key]
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            both = isinstance(a, Tensor) and isinstance(b, Tensor)
            if not (both and a.shape == b.shape and torch.equal(a, b)):
                return False
        elif a != b:
            return False
    return True
