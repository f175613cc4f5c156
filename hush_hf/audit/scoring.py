"""Batched log-likelihoods under a language model: the primitive every attack in the audit uses.

A *causal* LM scores a token sequence x_0..x_{L-1} by log P(x) = sum_{t>=1} log P(x_t | x_<t); the
log-perplexity of Carlini et al. (2019, "The Secret Sharer", Def. 1) is its negation (up to the base
of the logarithm, which no rank depends on). Sequences are padded on the right, so positions of real
tokens stay 0..L-1 and no ``position_ids`` are needed. Scores are returned as float64 NumPy arrays.

Any ``torch.nn.Module`` works as a model when ``model(input_ids=..., attention_mask=...)`` returns
an object with ``.logits`` (or a tuple whose first item is the logits), as Hugging Face models do.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

ModelKind = Literal["causal", "masked"]


def check_positive_int(field: str, value: object) -> int:
    """``value`` as an int >= 1, else a ``ValueError`` naming ``field`` and the value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{field} must be a positive integer, got {value!r}")
    return int(value)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (CPU for a model with neither)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def model_kind(model: torch.nn.Module, kind: ModelKind | None = None) -> ModelKind:
    """``kind`` if given, else "causal"/"masked" from the class name via transformers' auto mappings."""
    if kind is not None:
        if kind not in ("causal", "masked"):
            raise ValueError(f"kind must be 'causal' or 'masked', got {kind!r}")
        return kind
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    name = type(model).__name__
    if name in set(MODEL_FOR_MASKED_LM_MAPPING_NAMES.values()):
        return "masked"
    if name in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        return "causal"
    raise ValueError(f"cannot tell whether model class {name!r} is a causal or masked LM; pass kind=")


def logits_of(output: Any) -> torch.Tensor:
    """The logits from a model output object or tuple."""
    logits = getattr(output, "logits", None)
    return output[0] if logits is None else logits


def pad(sequences: Sequence[Sequence[int]], *, side: Literal["left", "right"], pad_id: int = 0,
        device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of shape (N, max length), padded on ``side`` with ``pad_id``."""
    length = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if not len(seq):
            continue
        span = slice(length - len(seq), length) if side == "left" else slice(0, len(seq))
        ids[row, span] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, span] = 1
    return ids.to(device), mask.to(device)


def _check_sequences(field: str, sequences: Sequence[Sequence[int]], min_length: int) -> list[list[int]]:
    out = []
    for k, seq in enumerate(sequences):
        seq = [int(t) for t in seq]
        if len(seq) < min_length:
            raise ValueError(f"{field}[{k}] has {len(seq)} tokens; at least {min_length} are needed")
        out.append(seq)
    return out


@torch.no_grad()
def token_log_probs(model: torch.nn.Module, sequences: Sequence[Sequence[int]], *,
                    batch_size: int = 16) -> list[np.ndarray]:
    """log P(x_t | x_<t) for t = 1..L-1 of each sequence (causal LM, teacher forcing, eval mode)."""
    batch_size = check_positive_int("batch_size", batch_size)
    sequences = _check_sequences("sequences", sequences, 2)
    model.eval()
    device = model_device(model)
    out: list[np.ndarray] = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start:start + batch_size]
        ids, mask = pad(chunk, side="right", device=device)
        logits = logits_of(model(input_ids=ids, attention_mask=mask)).float()
        # cross_entropy avoids materialising a second (B, L, V) tensor of log-probabilities.
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none"
        ).double().cpu().numpy()
        out.extend(-nll[row, : len(seq) - 1] for row, seq in enumerate(chunk))
    return out


def sequence_log_probs(model: torch.nn.Module, sequences: Sequence[Sequence[int]], *,
                       batch_size: int = 16) -> np.ndarray:
    """log P(x_1..x_{L-1} | x_0) of each sequence: minus the log-perplexity (Carlini et al. 2019, Def. 1)."""
    return np.array([lp.sum() for lp in token_log_probs(model, sequences, batch_size=batch_size)])


def mean_token_losses(model: torch.nn.Module, sequences: Sequence[Sequence[int]], *,
                      batch_size: int = 16) -> np.ndarray:
    """The mean next-token cross-entropy (nats) of each sequence: the training loss per example."""
    return np.array([-lp.mean() for lp in token_log_probs(model, sequences, batch_size=batch_size)])


def encode(tokenizer: Any, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[int]]:
    """Token ids of each text with a Hugging Face tokenizer (no truncation, no padding)."""
    encoded = tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"]
    return [list(map(int, ids)) for ids in encoded]
