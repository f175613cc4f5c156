"""What rows of token ids spell: their runs of ordinary tokens, decoded.

Special tokens (BOS/EOS, [CLS]/[SEP], padding, [UNK]) and negative ids (-100 labels) spell nothing of
a text, so they split a row into runs; each run is decoded with special tokens skipped and no clean-up
of spaces (the matchers set spaces aside anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def token_runs(ids: list[int], special: set[int]) -> list[list[int]]:
    """The maximal runs of ``ids`` holding no special token id (nor a negative one: -100 labels)."""
    runs: list[list[int]] = [[]]
    for token in ids:
        if token < 0 or token in special:
            runs.append([])
        else:
            runs[-1].append(token)
    return [run for run in runs if run]


def special_ids(tokenizer: Any) -> set[int]:
    """The ids ``tokenizer`` calls special (none known: the empty set)."""
    return set(getattr(tokenizer, "all_special_ids", ()) or ())


def decode_runs(tokenizer: Any, runs: list[list[int]]) -> list[str]:
    """Each run decoded (special tokens skipped, no clean-up of spaces). A fast tokenizer's Rust backend
    decodes the batch in one call (``batch_decode`` makes one Python ``decode`` call per sequence, which
    checks every id in Python first); others through ``batch_decode``."""
    if not runs:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and callable(getattr(backend, "decode_batch", None)):
        return backend.decode_batch(runs, skip_special_tokens=True)
    return tokenizer.batch_decode(runs, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def row_parts(ids: Sequence[Any]) -> list[list[int]]:
    """A row's token lists: the row itself, or each of its lists when it holds several (a multiple-choice
    row: one sequence per choice)."""
    if ids and isinstance(ids[0], (list, tuple)):
        return [[int(t) for t in part] for part in ids]
    return [[int(t) for t in ids]]


def spelled_texts(tokenizer: Any, rows: Sequence[Sequence[Any]]) -> list[str]:
    """Per row, what its tokens spell: its runs decoded, joined by newlines (a separator the matchers read
    across, as they read across the special token that split the runs)."""
    special = special_ids(tokenizer)
    owners: list[int] = []
    runs: list[list[int]] = []
    for row, ids in enumerate(rows):
        for part in row_parts(ids):
            for run in token_runs(part, special):
                owners.append(row)
                runs.append(run)
    pieces: list[list[str]] = [[] for _ in rows]
    for row, text in zip(owners, decode_runs(tokenizer, runs), strict=True):
        pieces[row].append(text)
    return ["\n".join(parts) for parts in pieces]
