"""One row per drawn example, whatever the collator: the DP step's unit of clipping.

DP-SGD's sensitivity is C per *example* (Hush Alg. 2, line 9): the engine clips each row of the batch
it is given, so a batch must hold exactly one row per example the sampler drew. Two collator layouts
break that silently and are laid out again here, exactly, from the drawn rows themselves:

- **Padding-free** (transformers' ``DataCollatorWithFlattening``, TRL's ``padding_free=True``, BFD
  packing): the drawn examples are put end to end in one row, with ``position_ids`` restarting per
  sequence (and ``cu_seq_lens_*``, ``seq_idx``). Clipping that row clips all of them as one, so one
  example could move the clipped sum by up to 2C. The row is cut back into the drawn examples by their
  own token counts, checked token by token against the drawn rows, and laid out right-padded
  (``attention_mask`` 0 and label -100 on the padding): the batch a right-padding collator builds from
  the same rows, so the run trains what the right-padded run trains. The cut follows the *drawn rows*,
  never the sequence restarts: a BFD-packed dataset row holds several documents (restarts inside it)
  and is still one example of the plan.
- **Padding without a mask** (a collator returning ``input_ids`` and ``labels`` only): the mask is
  inferred exactly from where each drawn row's tokens sit in its padded row (a prefix: right padding;
  a suffix: left padding, then moved right by :mod:`hush_hf.trainer.padding`).

Refused, with the fix, where the drawn examples cannot be found in the batch: more rows than drawn
examples, fewer rows that are not one flattened row, flattened tokens that differ from the drawn
rows' tokens (a collator that rewrites or drops tokens), real tokens after the last example, an empty
example, or per-token tensors the cut cannot follow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from hush_hf.clipping.loss import IGNORE_INDEX

FLATTENING_METADATA = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
"""Batch-wide sequence-boundary keys of a flattened row; meaningless once each example is its own row
(each row is then one sequence), so they are dropped with the flattening."""

FLATTENED_FIX = (
    "use a collator that returns one row per example (e.g. DataCollatorWithPadding / "
    "DataCollatorForLanguageModeling with padding), or one that flattens the drawn rows unchanged "
    "(transformers' DataCollatorWithFlattening, TRL's padding_free=True)"
)


class ExampleRowsCollator:
    """The user's collator, then :func:`example_rows`: one right-padded row per drawn example.

    An empty draw (a noise-only step) collates to ``{}``. ``pad_token_id``: the id written into the
    padding of rows cut from a flattened batch (None: 0; padding is masked and unlabelled either way).
    """

    def __init__(self, collate_fn: Any, pad_token_id: int | None = None) -> None:
        self.collate_fn = collate_fn
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[Any]) -> Any:
        if not features:
            return {}
        return example_rows(self.collate_fn(features), features, pad_token_id=self.pad_token_id)


def _drawn_ids(features: Sequence[Any]) -> list[list[int]] | None:
    """Each drawn row's ``input_ids`` as a list, or None when a row has none (tokenized by the collator)."""
    ids = []
    for feature in features:
        value = feature.get("input_ids") if isinstance(feature, Mapping) else None
        if value is None:
            return None
        ids.append(value.tolist() if hasattr(value, "tolist") else list(value))
    return ids


def example_rows(batch: Any, features: Sequence[Any], *, pad_token_id: int | None = None) -> Any:
    """``batch`` (the collation of ``features``) with exactly one row per feature (module docstring)."""
    if not isinstance(batch, Mapping) or not isinstance(batch.get("input_ids"), Tensor):
        return batch  # no token batch to lay out; the engine checks rows against per_example_loss
    ids = batch["input_ids"]
    if ids.dim() != 2:
        return batch
    rows, drawn = ids.shape[0], len(features)
    flattened = any(key in batch for key in FLATTENING_METADATA)
    if rows == drawn and not (flattened and rows == 1):
        if flattened:
            raise ValueError(
                f"the data collator returned {rows} rows with flattening keys "
                f"({', '.join(k for k in FLATTENING_METADATA if k in batch)}) that span them, so which "
                f"tokens form which example is ambiguous; {FLATTENED_FIX}"
            )
        return batch if "attention_mask" in batch else _with_inferred_mask(dict(batch), _drawn_ids(features))
    if rows > drawn:
        raise ValueError(
            f"the data collator returned {rows} rows for {drawn} drawn examples: an example split over "
            f"several rows is clipped as several, so C no longer bounds it; {FLATTENED_FIX}"
        )
    if rows != 1:
        raise ValueError(
            f"the data collator returned {rows} rows for {drawn} drawn examples, which is neither one row "
            f"per example nor one flattened row, so the examples cannot be told apart; {FLATTENED_FIX}"
        )
    drawn_ids = _drawn_ids(features)
    if drawn_ids is None:
        raise ValueError(
            f"the data collator flattened {drawn} drawn examples into one row, but the drawn rows have no "
            "'input_ids' to find them by; tokenize the dataset before training, or " + FLATTENED_FIX
        )
    return unflatten(dict(batch), drawn_ids, pad_token_id=pad_token_id)


def unflatten(
    batch: dict[str, Any], drawn_ids: list[list[int]], *, pad_token_id: int | None
) -> dict[str, Any]:
    """A one-row flattened batch cut into one right-padded row per drawn example (module docstring)."""
    lengths = [len(ids) for ids in drawn_ids]
    if min(lengths) == 0:
        raise ValueError(
            f"drawn example {lengths.index(0)} of a flattened batch has no tokens "
            "(DataCollatorWithFlattening drops such rows, so the examples no longer line up); filter "
            "empty rows out of the dataset"
        )
    flat = batch["input_ids"][0]
    total, width = sum(lengths), flat.shape[0]
    expected = torch.tensor([t for ids in drawn_ids for t in ids], dtype=flat.dtype, device=flat.device)
    if total > width or not torch.equal(flat[:total], expected):
        raise ValueError(
            f"the flattened row does not hold the {len(lengths)} drawn examples' tokens end to end "
            f"({width} tokens for {total} drawn): the collator changed, dropped or reordered tokens, so the "
            f"examples cannot be found; {FLATTENED_FIX}"
        )
    labels = batch.get("labels")
    tail_labelled = isinstance(labels, Tensor) and bool((labels[0, total:] != IGNORE_INDEX).any())
    tail_real = pad_token_id is not None and bool((flat[total:] != pad_token_id).any())
    if tail_labelled or tail_real:
        raise ValueError(
            f"the flattened row has {width - total} tokens after the drawn examples that are not padding "
            f"(pad id {pad_token_id}, label {IGNORE_INDEX}); they belong to no example; {FLATTENED_FIX}"
        )
    longest = max(lengths)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    laid_out: dict[str, Any] = {}
    for key, value in batch.items():
        if key in FLATTENING_METADATA:
            continue
        if not isinstance(value, Tensor) or value.dim() == 0:
            laid_out[key] = value
            continue
        if value.dim() < 2 or value.shape[0] != 1 or value.shape[1] != width:
            raise ValueError(
                f"batch key {key!r} (shape {tuple(value.shape)}) is not laid out per token like the "
                f"flattened input_ids (1, {width}), so it cannot be cut per example; {FLATTENED_FIX}"
            )
        laid_out[key] = _cut(key, value[0], starts, lengths, longest, pad_token_id)
    mask = torch.zeros(len(lengths), longest, dtype=torch.long, device=flat.device)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    if "attention_mask" in batch and not bool((laid_out["attention_mask"] == mask).all()):
        raise ValueError(
            "the flattened row's attention_mask masks tokens inside the drawn examples; " + FLATTENED_FIX
        )
    laid_out["attention_mask"] = mask
    return laid_out


def _cut(
    key: str, flat: Tensor, starts: list[int], lengths: list[int], longest: int, pad: int | None
) -> Tensor:
    """Per-token tensor ``flat`` (seq, ...) cut at the examples, each row padded on the right: labels
    with -100, input ids with the pad id, position ids counting on (so they stay in range), else 0."""
    rows = []
    for start, n in zip(starts, lengths, strict=True):
        piece = flat[start : start + n]
        extra = longest - n
        if extra:
            if key == "position_ids":
                steps = torch.arange(1, extra + 1, device=piece.device)
                filler = piece[-1:] + steps.view(-1, *[1] * (piece.dim() - 1))
            else:
                value = IGNORE_INDEX if key == "labels" else (pad or 0) if key == "input_ids" else 0
                filler = torch.full((extra, *piece.shape[1:]), value, dtype=piece.dtype, device=piece.device)
            piece = torch.cat([piece, filler.to(piece.dtype)])
        rows.append(piece)
    return torch.stack(rows)


def _with_inferred_mask(batch: dict[str, Any], drawn_ids: list[list[int]] | None) -> dict[str, Any]:
    """A padded batch without ``attention_mask`` gets the mask of where each drawn row's tokens sit.

    Row r of width L holding drawn tokens t (n < L of them): ``row[:n] == t`` means right padding,
    ``row[L-n:] == t`` left padding; anything else (a collator that rewrote tokens) is left to the
    first-step independence check. Rows as long as the batch need no mask, nor does a batch where all
    are.
    """
    ids = batch["input_ids"]
    if drawn_ids is None:
        return batch
    width = ids.shape[1]
    if all(len(t) == width for t in drawn_ids):
        return batch
    mask = torch.ones_like(ids, dtype=torch.long)
    for row, tokens in enumerate(drawn_ids):
        n = len(tokens)
        if n >= width:
            continue
        own = torch.tensor(tokens, dtype=ids.dtype, device=ids.device)
        if torch.equal(ids[row, :n], own):
            mask[row, n:] = 0
        elif torch.equal(ids[row, width - n :], own):
            mask[row, : width - n] = 0
        else:
            return batch  # tokens rewritten by the collator: the independence check decides
    batch["attention_mask"] = mask
    return batch


def pad_token_id(trainer: Any) -> int | None:
    """The pad id of the trainer's tokenizer (``processing_class``, or a processor's ``tokenizer``), else
    of the model's config; None when neither has one."""
    for owner in (getattr(trainer, "processing_class", None), getattr(trainer, "model", None)):
        owner = getattr(owner, "tokenizer", owner)
        value = getattr(owner, "pad_token_id", None)
        if value is None:
            value = getattr(getattr(owner, "config", None), "pad_token_id", None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
