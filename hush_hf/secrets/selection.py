"""Choosing secrets the way the paper's experiment does (Hush, Sec. 5.1).

The paper sorts the words of all arXiv abstracts by the number of abstracts containing them,
takes the 50,001st to 150,000th (``rank_range=(50_000, 150_000)`` here), gives every one the prior
p = 1e-10 and a target posterior r drawn uniformly from [2e-4, 1e-3]. Words are those of
:func:`hush_hf.secrets.words.words` (case-folded), so tag with ``case_sensitive=False``.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Iterable
from typing import Any

import datasets
import numpy as np

from hush_hf.secrets.matching import term_key
from hush_hf.secrets.secret import Secret, check_probability
from hush_hf.secrets.secret_set import SecretSet
from hush_hf.secrets.words import words

COUNT_BATCH_SIZE = 10_000


def _count_batch(texts: Iterable[Any], first_index: int, counts: Counter[str]) -> None:
    for offset, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"document {first_index + offset} is a {type(text).__name__}, not a string")
        counts.update(set(words(text)))


class _BatchDocumentFrequency:
    """``Dataset.map`` function: a batch of texts -> (word, df within the batch) rows."""

    def __init__(self, text_column: str) -> None:
        self.text_column = text_column

    def __call__(self, batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        counts: Counter[str] = Counter()
        _count_batch(batch[self.text_column], indices[0] if indices else 0, counts)
        return {"word": list(counts), "df": list(counts.values())}


def document_frequencies(
    texts_or_dataset: Iterable[str] | datasets.Dataset,
    *,
    text_column: str = "text",
    num_proc: int | None = None,
) -> Counter[str]:
    """df(w) = the number of documents among whose words (case-folded) ``w`` is.

    One pass, each document's distinct words counted once. With ``num_proc`` > 1 the documents are
    counted per batch in ``Dataset.map`` workers and the partial counts summed with Arrow's group-by.
    """
    _check_optional_positive_int("num_proc", num_proc)
    dataset = _as_dataset_or_none(texts_or_dataset, text_column)
    counts: Counter[str] = Counter()
    if num_proc is None or num_proc == 1:
        if dataset is None:
            _count_batch(texts_or_dataset, 0, counts)
        else:
            texts = dataset.select_columns([text_column])
            for k, batch in enumerate(texts.iter(COUNT_BATCH_SIZE)):
                _count_batch(batch[text_column], k * COUNT_BATCH_SIZE, counts)
        return counts
    if dataset is None:
        texts = list(texts_or_dataset)
        for k, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"document {k} is a {type(text).__name__}, not a string")
        dataset = datasets.Dataset.from_dict({text_column: texts})
    partial = dataset.select_columns([text_column]).map(
        _BatchDocumentFrequency(text_column),
        batched=True,
        with_indices=True,
        batch_size=COUNT_BATCH_SIZE,
        num_proc=num_proc,
        remove_columns=[text_column],
        features=datasets.Features({"word": datasets.Value("string"), "df": datasets.Value("int64")}),
        desc="Counting document frequencies",
    )
    summed = partial.data.table.group_by("word").aggregate([("df", "sum")])
    words_column, df_column = summed.column("word").to_pylist(), summed.column("df_sum").to_pylist()
    counts.update(dict(zip(words_column, df_column, strict=True)))
    return counts


def rank_by_document_frequency(counts: Counter[str]) -> list[tuple[str, int]]:
    """(word, df) pairs by descending df; ties in increasing code-point order of the word."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def select_by_document_frequency(
    texts_or_dataset: Iterable[str] | datasets.Dataset,
    *,
    text_column: str = "text",
    rank_range: tuple[int, int] | None = None,
    df_range: tuple[int, int] | None = None,
    prior: float = 1e-10,
    target_range: tuple[float, float] = (2e-4, 1e-3),
    seed: int = 0,
    max_secrets: int | None = None,
    num_proc: int | None = None,
) -> SecretSet:
    """Secrets = words chosen by document frequency (Hush, Sec. 5.1), in rank order.

    Exactly one of:
      - ``rank_range=(lo, hi)``: ranks lo..hi-1 (0-based) of :func:`rank_by_document_frequency`;
        the paper's "50,001st to 150,000th" is ``(50_000, 150_000)``. The corpus must have at least
        ``hi`` distinct words (nothing is clamped).
      - ``df_range=(lo, hi)``: every word with lo <= df <= hi.
    Each secret gets ``prior`` and r ~ Uniform[target_range) from ``seed``; ``max_secrets`` keeps a
    uniformly random subset (same seed, rank order kept). Names are the words, with no terms, so
    :func:`tagger_for` tags by the word itself; words it cannot tag (``\\w+`` runs of separators only,
    such as ``____``: the tagger reads underscores as separators) are neither ranked nor chosen.
    """
    if (rank_range is None) == (df_range is None):
        raise ValueError("select_by_document_frequency: give exactly one of rank_range and df_range")
    if rank_range is not None:
        _check_int_pair("rank_range", rank_range, minimum=0, strict=True)
    if df_range is not None:
        _check_int_pair("df_range", df_range, minimum=1, strict=False)
    prior = check_probability("prior", prior)
    lo_r, hi_r = _check_target_range(target_range, prior)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    _check_optional_positive_int("max_secrets", max_secrets)
    _check_optional_positive_int("num_proc", num_proc)

    counts = document_frequencies(texts_or_dataset, text_column=text_column, num_proc=num_proc)
    ranked = [(word, df) for word, df in rank_by_document_frequency(counts) if term_key(word)]
    if rank_range is not None:
        lo, hi = rank_range
        if hi > len(ranked):
            raise ValueError(
                f"rank_range=({lo}, {hi}) reaches beyond the corpus, which has {len(ranked)} distinct "
                "taggable words"
            )
        chosen = [word for word, _ in ranked[lo:hi]]
    else:
        lo, hi = df_range
        chosen = [word for word, df in ranked if lo <= df <= hi]
        if not chosen:
            raise ValueError(
                f"no word has a document frequency in df_range=({lo}, {hi}) "
                f"(the corpus has {len(ranked)} distinct words, df from "
                f"{ranked[-1][1] if ranked else 0} to {ranked[0][1] if ranked else 0})"
            )
    subset_rng, target_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(2))
    if max_secrets is not None and len(chosen) > max_secrets:
        keep = np.sort(subset_rng.choice(len(chosen), size=max_secrets, replace=False))
        chosen = [chosen[k] for k in keep]
    targets = target_rng.uniform(lo_r, hi_r, size=len(chosen)).tolist()
    pairs = zip(chosen, targets, strict=True)
    return SecretSet(Secret(name=word, prior=prior, target_posterior=r) for word, r in pairs)


def _as_dataset_or_none(texts_or_dataset: Any, text_column: str) -> datasets.Dataset | None:
    if isinstance(texts_or_dataset, datasets.Dataset):
        if text_column not in texts_or_dataset.column_names:
            raise ValueError(
                f"text_column {text_column!r} not found; available columns: {texts_or_dataset.column_names}"
            )
        return texts_or_dataset
    not_texts = (str, bytes, datasets.DatasetDict)
    if isinstance(texts_or_dataset, not_texts) or not isinstance(texts_or_dataset, Iterable):
        raise ValueError(
            "texts_or_dataset must be a datasets.Dataset or an iterable of strings, "
            f"got a {type(texts_or_dataset).__name__}"
        )
    return None


def _check_int_pair(field: str, value: Any, minimum: int, strict: bool) -> None:
    ok = (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value)
        and value[0] >= minimum
        and (value[0] < value[1] if strict else value[0] <= value[1])
    )
    if not ok:
        order = "<" if strict else "<="
        raise ValueError(f"{field} must be a pair of integers {minimum} <= lo {order} hi, got {value!r}")


def _check_target_range(value: Any, prior: float) -> tuple[float, float]:
    if not (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"target_range must be a pair of numbers (lo, hi), got {value!r}")
    lo, hi = float(value[0]), float(value[1])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"target_range={value!r} must be finite")
    if not prior < lo <= hi < 1.0:
        raise ValueError(f"target_range={value!r} must satisfy prior={prior!r} < lo <= hi < 1")
    return lo, hi


def _check_optional_positive_int(field: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{field} must be a positive integer or None, got {value!r}")
