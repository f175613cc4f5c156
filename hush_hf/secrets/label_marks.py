"""A row's labels are trained too: every secret they spell must be among the row's marks.

Secret marks follow ``input_ids`` (the offsets of the text the inputs were tokenized from). A row trains
its ``labels`` as well, and they are the input tokens only where ``labels[t]`` is ``input_ids[t]`` or
-100 (a causal LM's copy, a masked prompt). Other labels (a seq2seq target tokenized apart from the
inputs: ``labels = tokenizer(targets)["input_ids"]``) are text the marks never saw; a secret only they
spell would leave its row out of D_j. So such rows' labels are decoded (runs of ordinary tokens:
:mod:`hush_hf.secrets.token_text`), tagged, and each secret found must be marked on the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hush_hf.secrets.token_text import spelled_texts

ROWS_PER_DECODE = 4096
"""Rows whose labels are decoded in one call."""


def labels_beyond_inputs(input_ids: Sequence[Any], labels: Sequence[Any]) -> np.ndarray:
    """The rows whose ``labels`` hold a token other than -100 and the row's own input token at that
    position (a different length counts as other tokens)."""
    if len(input_ids) != len(labels):
        raise ValueError(f"{len(input_ids)} rows of input_ids but {len(labels)} rows of labels")
    rows = []
    for row, (ids, target) in enumerate(zip(input_ids, labels, strict=True)):
        ids, target = np.asarray(ids), np.asarray(target)
        if ids.shape != target.shape or not bool(np.all((target == ids) | (target < 0))):
            rows.append(row)
    return np.asarray(rows, dtype=np.int64)


def label_secrets(tokenizer: Any, tagger: Any, labels: Sequence[Any]) -> list[set[int]]:
    """Per row, the secrets ``tagger`` finds in what its ``labels`` spell (decoded with ``tokenizer``)."""
    return [tagger(text) if text else set() for text in spelled_texts(tokenizer, labels)]


def first_unmarked_label_secret(
    rows: np.ndarray, labels: Sequence[Any], marked: Sequence[Any], *, tokenizer: Any, tagger: Any
) -> tuple[int, int] | None:
    """(row, secret) of the first of ``rows`` whose labels spell a secret its ``marked`` ids lack, or None."""
    for start in range(0, len(rows), ROWS_PER_DECODE):
        chunk = [int(row) for row in rows[start : start + ROWS_PER_DECODE]]
        found = label_secrets(tokenizer, tagger, [labels[row] for row in chunk])
        for row, secrets in zip(chunk, found, strict=True):
            missing = secrets.difference(marked[row] or ())
            if missing:
                return row, min(missing)
    return None
