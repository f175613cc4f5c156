"""k-extractability (Carlini et al. 2023, "Quantifying memorization"; Hush Def. 5.1, Sec. 5.2).

A training sequence is extractable with k = n tokens of context when greedy decoding from its first
n tokens reproduces its next m tokens exactly.

Greedy decoding outputs s_0..s_{m-1} from prompt p iff argmax P(. | p, s_<k) = s_k for every k < m
(by induction: while the first k generated tokens equal s_<k, step k conditions on exactly p||s_<k).
So :func:`extractable` decides it with one teacher-forced forward pass per batch, argmax ties broken
as in greedy decoding (lowest token id), instead of m decoding steps. :func:`greedy_decode` is the
decoding itself (left padding, KV cache when the model returns one), for prompts whose continuation
is unknown; the tests check that both agree.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hush_hf.audit.scoring import check_positive_int, encode, logits_of, model_device, pad


def _accepts(model: torch.nn.Module, name: str) -> bool:
    parameters = inspect.signature(model.forward).parameters
    return name in parameters


@torch.no_grad()
def greedy_decode(model: torch.nn.Module, prompts: Sequence[Sequence[int]], num_tokens: int, *,
                  batch_size: int = 16, pad_id: int = 0) -> list[list[int]]:
    """The ``num_tokens`` tokens greedy decoding appends to each prompt (no early stop at EOS).

    Prompts are padded on the left with ``position_ids`` counted from each prompt's first real
    token, so a padded prompt decodes as it would alone.
    """
    num_tokens = check_positive_int("num_tokens", num_tokens)
    batch_size = check_positive_int("batch_size", batch_size)
    for k, prompt in enumerate(prompts):
        if not len(prompt):
            raise ValueError(f"prompts[{k}] is empty")
    model.eval()
    device = model_device(model)
    with_positions = _accepts(model, "position_ids")
    with_cache = _accepts(model, "use_cache") and _accepts(model, "past_key_values")
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        ids, mask = pad(prompts[start:start + batch_size], side="left", pad_id=pad_id, device=device)
        generated = []
        cache = None
        step_ids = ids
        for _ in range(num_tokens):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            kwargs: dict[str, Any] = {"attention_mask": mask}
            if with_positions:
                kwargs["position_ids"] = positions[:, -step_ids.shape[1]:]
            if with_cache:
                kwargs.update(use_cache=True, past_key_values=cache)
            output = model(input_ids=step_ids, **kwargs)
            token = logits_of(output)[:, -1].argmax(-1, keepdim=True)
            generated.append(token)
            cache = getattr(output, "past_key_values", None) if with_cache else None
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            ids = torch.cat([ids, token], dim=1)
            step_ids = token if cache is not None else ids
        out.extend(torch.cat(generated, dim=1).cpu().tolist())
    return out


@dataclass(frozen=True)
class ExtractionResult:
    """How many of the evaluated sequences are extractable (by position, never by content)."""

    prefix_length: int
    suffix_length: int
    num_sequences: int
    num_extracted: int
    mean_matched_tokens: float
    token_accuracy: float
    extracted_indices: tuple[int, ...]
    skipped_too_short: tuple[int, ...]

    @property
    def fraction_extracted(self) -> float:
        return self.num_extracted / self.num_sequences if self.num_sequences else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "prefix_length": self.prefix_length,
            "suffix_length": self.suffix_length,
            "num_sequences": self.num_sequences,
            "num_extracted": self.num_extracted,
            "fraction_extracted": self.fraction_extracted,
            "mean_matched_tokens": self.mean_matched_tokens,
            "token_accuracy": self.token_accuracy,
            "num_skipped_too_short": len(self.skipped_too_short),
        }


@torch.no_grad()
def matched_tokens(model: torch.nn.Module, sequences: Sequence[Sequence[int]], prefix_length: int,
                   suffix_length: int, *, batch_size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence of exactly n + m tokens: (leading suffix tokens greedy decoding reproduces,
    suffix tokens whose teacher-forced argmax is right). Extractable iff the first equals m."""
    n = check_positive_int("prefix_length", prefix_length)
    m = check_positive_int("suffix_length", suffix_length)
    batch_size = check_positive_int("batch_size", batch_size)
    for k, seq in enumerate(sequences):
        if len(seq) != n + m:
            raise ValueError(f"sequences[{k}] has {len(seq)} tokens, "
                             f"expected prefix_length + suffix_length = {n + m}")
    model.eval()
    device = model_device(model)
    leading, correct = [], []
    for start in range(0, len(sequences), batch_size):
        ids, mask = pad(sequences[start:start + batch_size], side="right", device=device)
        predicted = logits_of(model(input_ids=ids, attention_mask=mask))[:, n - 1: n + m - 1].argmax(-1)
        hits = (predicted == ids[:, n:]).cpu().numpy()
        correct.append(hits.sum(axis=1))
        # Leading run of hits: index of the first miss, or m when there is none.
        leading.append(np.where(hits.all(axis=1), m, np.argmin(hits, axis=1)))
    if not leading:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(leading).astype(np.int64), np.concatenate(correct).astype(np.int64)


def extraction_attack(model: torch.nn.Module, sequences: Sequence[Sequence[int]], *, prefix_length: int = 50,
                      suffix_length: int = 50, batch_size: int = 16) -> ExtractionResult:
    """Prompt with the first n tokens of each sequence and check that greedy decoding gives the next m.

    Sequences shorter than n + m cannot be evaluated; they are listed in ``skipped_too_short``
    (and counted in the report), not silently dropped. Longer ones are cut to their first n + m.
    """
    n = check_positive_int("prefix_length", prefix_length)
    m = check_positive_int("suffix_length", suffix_length)
    usable = [k for k, seq in enumerate(sequences) if len(seq) >= n + m]
    skipped = tuple(k for k, seq in enumerate(sequences) if len(seq) < n + m)
    windows = [list(sequences[k])[: n + m] for k in usable]
    leading, correct = matched_tokens(model, windows, n, m, batch_size=batch_size)
    extracted = tuple(usable[k] for k in np.flatnonzero(leading == m))
    return ExtractionResult(
        prefix_length=n,
        suffix_length=m,
        num_sequences=len(usable),
        num_extracted=len(extracted),
        mean_matched_tokens=float(leading.mean()) if leading.size else 0.0,
        token_accuracy=float(correct.sum() / (m * leading.size)) if leading.size else 0.0,
        extracted_indices=extracted,
        skipped_too_short=skipped,
    )


def extraction_attack_on_texts(model: torch.nn.Module, tokenizer: Any, texts: Sequence[str], **kwargs: Any
                               ) -> ExtractionResult:
    """:func:`extraction_attack` on texts tokenized as in training (special tokens included)."""
    return extraction_attack(model, encode(tokenizer, texts), **kwargs)
