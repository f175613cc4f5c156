"""Pretraining on blocks of tokens (Hush Sec. 5.2, Fig. 2-3): texts joined and cut into fixed-length blocks,
training and validation blocks from disjoint texts, each training block its own secret, and the figure.

No text reaches a result: blocks are token ids, results are counts and fractions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hush_hf.data import SECRET_IDS_COLUMN
from hush_hf.experiments.figures import new_figure, save_figure

BYTE_VOCAB = 256


class ByteTokens:
    """UTF-8 bytes as token ids 0..255: no vocabulary to learn from (and leak) the training text."""

    vocab_size = BYTE_VOCAB

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]


def make_blocks(
    texts: Sequence[str], encode: Callable[[list[str]], list[list[int]]], block_size: int, count: int,
    separator: list[int],
) -> list[list[int]]:
    """The first ``count`` blocks of ``block_size`` tokens of the texts joined by ``separator``."""
    blocks: list[list[int]] = []
    buffer: list[int] = []
    for start in range(0, len(texts), 256):
        for ids in encode(list(texts[start : start + 256])):
            buffer.extend(ids + separator)
            while len(buffer) >= block_size and len(blocks) < count:
                blocks.append(buffer[:block_size])
                buffer = buffer[block_size:]
        if len(blocks) >= count:
            return blocks
    raise ValueError(f"the corpus gives only {len(blocks)} blocks of {block_size} tokens, {count} are needed")


def split_blocks(
    texts: Sequence[str], tokenizer: Any, *, block_size: int, num_train: int, num_validation: int, seed: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Training and validation blocks from disjoint texts (a seeded shuffle; a tenth of the texts, at
    least one, is held out). ``tokenizer=None``: UTF-8 bytes, texts separated by a blank line; else the
    tokenizer's ids without special tokens, texts separated by its EOS."""
    if tokenizer is None:
        encode, separator = ByteTokens(), list(b"\n\n")
    else:

        def encode(batch: list[str]) -> list[list[int]]:
            return tokenizer(batch, add_special_tokens=False)["input_ids"]

        separator = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    order = np.random.default_rng(seed).permutation(len(texts))
    held_out = max(1, len(texts) // 10)
    validation_texts = [texts[k] for k in order[:held_out]]
    train_texts = [texts[k] for k in order[held_out:]]
    train = make_blocks(train_texts, encode, block_size, num_train, separator)
    validation = make_blocks(validation_texts, encode, block_size, num_validation, separator)
    return train, validation


def block_dataset(blocks: list[list[int]], *, with_secret_ids: bool) -> Any:
    """A dataset of the blocks (``input_ids`` = ``labels``); ``with_secret_ids``: block i is secret i."""
    import datasets

    columns: dict[str, Any] = {"input_ids": blocks, "attention_mask": [[1] * len(b) for b in blocks],
                               "labels": blocks}
    if with_secret_ids:
        columns[SECRET_IDS_COLUMN] = [[i] for i in range(len(blocks))]  # sequence i is secret i
    return datasets.Dataset.from_dict(columns)


def fig2_fig3_figure(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Hush Fig. 2 (validation loss against the step, a curve per sigma) and Fig. 3 (the fraction of
    training and held-out blocks k-extractable, per sigma) side by side."""
    figure, axes = new_figure(1, 2, width=11, height=4)
    curves, bars = axes[0]
    for row in rows:
        steps, losses = zip(*row["validation_curve"], strict=True) if row["validation_curve"] else ((), ())
        curves.plot(steps, losses, marker="o", label=f"sigma = {row['noise_multiplier']:g}")
    curves.set(xlabel="step", ylabel="validation loss (nats/token)", title="Fig. 2: validation loss")
    curves.legend(fontsize=8)
    curves.grid(alpha=0.3)
    labels = [f"{r['noise_multiplier']:g}" for r in rows]
    x = np.arange(len(rows))
    bars.bar(x - 0.2, [r["extractable_fraction"] for r in rows], width=0.4, label="training sequences")
    heldout = [r["heldout_extractable_fraction"] for r in rows]
    bars.bar(x + 0.2, heldout, width=0.4, label="held-out (control)")
    bars.set_xticks(x, labels)
    bars.set(xlabel="noise multiplier sigma", ylabel="fraction k-extractable", title="Fig. 3: extraction")
    bars.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    return save_figure(figure, path)
