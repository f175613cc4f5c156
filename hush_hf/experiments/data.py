"""The data of an experiment: an offline corpus or the user's dataset, a seeded held-out split, tokenizing,
and the secrets each example holds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hush_hf.data import SECRET_IDS_COLUMN


def load_corpus(
    dataset_name: str | None,
    split: str,
    columns: Sequence[str],
    *,
    offline: Callable[[], Any],
    offline_source: str,
) -> tuple[Any, str]:
    """``(dataset, description)``: ``offline()`` when ``dataset_name`` is None, else the Hub dataset or
    local file (``hush_hf.data.load_text_dataset``); ValueError naming a missing column."""
    if dataset_name is None:
        corpus, source = offline(), offline_source
    else:
        from hush_hf.data import load_text_dataset

        corpus, source = load_text_dataset(dataset_name, split=split), f"{dataset_name} [{split}]"
    for name in columns:
        if name not in corpus.column_names:
            raise ValueError(f"column {name!r} is not in the dataset (columns: {corpus.column_names})")
    return corpus, source


def split_held_out(
    corpus: Any,
    fraction: float,
    *,
    seed: int,
    group_column: str | None = None,
    max_train: int | None = None,
    max_test: int | None = None,
) -> tuple[Any, Any]:
    """``(train, test)``: a seeded ``fraction`` of the rows held out, or of the groups (e.g. whole papers)
    when ``group_column`` is given; each side keeps its original row order and is cut to its maximum."""
    rng = np.random.default_rng(seed)
    if group_column is None:
        held_out = np.zeros(len(corpus), dtype=bool)
        held_out[rng.permutation(len(corpus))[: max(1, round(fraction * len(corpus)))]] = True
    else:
        groups = np.asarray(corpus[group_column])
        names = np.unique(groups)
        held_out = np.isin(groups, rng.permutation(names)[: max(1, round(fraction * names.size))])
    train = corpus.select(np.flatnonzero(~held_out)[:max_train])
    test = corpus.select(np.flatnonzero(held_out)[:max_test])
    if len(train) < 2 or len(test) < 1:
        raise ValueError(f"the split left {len(train)} training and {len(test)} test examples")
    return train, test


def describe_counts(counts: Any) -> dict[str, float]:
    """min / median / max / mean of a vector of counts (e.g. examples per secret)."""
    import numpy as np

    counts = np.asarray(counts)
    if counts.size == 0:
        return {"min": 0, "median": 0, "max": 0, "mean": 0}
    return {
        "min": int(counts.min()),
        "median": float(np.median(counts)),
        "max": int(counts.max()),
        "mean": float(counts.mean()),
    }


def tokenize_text(
    data: Any, tokenizer: Any, *, text_column: str, max_length: int, keep_text: bool = False
) -> Any:
    """``data`` with the tokenizer's columns (truncated to ``max_length``). ``keep_text``: the text column
    stays (training rows: the trainer checks their ``secret_ids`` against the text they were tagged from,
    and Trainer drops the column before the collator)."""

    def tokens(batch: dict[str, Any]) -> Any:
        return tokenizer(batch[text_column], truncation=True, max_length=max_length)

    dropped = [] if keep_text else [text_column]
    return data.map(tokens, batched=True, remove_columns=dropped, desc="Tokenizing")


def secret_ids_column(dataset: Any) -> Any:
    """The ``secret_ids`` column of a tagged dataset in its current row order (an Arrow array for a
    ``datasets.Dataset``, which respects ``shuffle``/``select`` where ``dataset.data`` does not)."""
    from hush_hf.trainer.plan_setup import column

    return column(dataset, SECRET_IDS_COLUMN)


def secret_counts(secret_ids: Any, num_secrets: int) -> tuple[np.ndarray, int]:
    """``(sizes, with_a_secret)``: ``sizes[j]`` = |D_j|, the number of examples holding secret j, and the
    number of examples holding any secret, from a ``secret_ids`` column."""
    from hush_hf.planning import membership_matrix

    membership = membership_matrix(secret_ids, num_secrets)
    return np.asarray(membership.sum(axis=1)).ravel(), int(np.count_nonzero(membership.sum(axis=0)))


def chunk_texts(
    texts: Sequence[str], secret_ids: Sequence[Sequence[int]], tokenizer: Any, *, block_size: int,
    chunks_per_text: int, min_tokens: int = 8,
) -> Any:
    """Training sequences: the first ``chunks_per_text`` blocks of ``block_size`` tokens of each text
    (blocks shorter than ``min_tokens`` dropped), each with its text's ``secret_ids`` (a block counts as
    containing every secret of its text: more protection, never less) and its decoded ``text``."""
    import datasets

    rows: dict[str, list[Any]] = {"input_ids": [], "attention_mask": [], SECRET_IDS_COLUMN: [], "text": []}
    for text, ids in zip(texts, secret_ids, strict=True):
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, min(len(tokens), block_size * chunks_per_text), block_size):
            block = tokens[start : start + block_size]
            if len(block) < min_tokens:
                continue
            rows["input_ids"].append(block)
            rows["attention_mask"].append([1] * len(block))
            rows[SECRET_IDS_COLUMN].append(ids)
            rows["text"].append(tokenizer.decode(block))
    return datasets.Dataset.from_dict(rows)
