"""Document-frequency selection of secrets (Hush, Sec. 5.1) on a hand-built corpus."""

from __future__ import annotations

from collections import Counter

import datasets
import numpy as np
import pytest
from scipy import stats

from hush_hf.secrets import (
    document_frequencies,
    rank_by_document_frequency,
    select_by_document_frequency,
    tag_dataset,
    tagger_for,
)

DOCS = [
    "The alpha alpha ALPHA beta gamma delta eps zeta",
    "the Alpha beta gamma delta eps",
    "THE alpha, beta; gamma delta",
    "the alpha beta gamma",
    "the alpha.",
    "The end of the alphabet",
]
# df counts documents, not occurrences, after case folding; "alphabet" is not "alpha".
DF = {"the": 6, "alpha": 5, "beta": 4, "gamma": 4, "delta": 3, "eps": 2}
DF |= {"zeta": 1, "end": 1, "of": 1, "alphabet": 1}
# Descending df; ties in code-point order of the word.
RANKED = ["the", "alpha", "beta", "gamma", "delta", "eps", "alphabet", "end", "of", "zeta"]


def _names(secret_set):
    return [secret.name for secret in secret_set]


def test_document_frequencies_and_ranking_of_the_hand_built_corpus():
    counts = document_frequencies(DOCS)
    assert counts == Counter(DF)
    assert rank_by_document_frequency(counts) == [(word, DF[word]) for word in RANKED]


def test_dataset_input_and_num_proc_two_count_the_same():
    dataset = datasets.Dataset.from_dict({"body": DOCS * 7, "n": list(range(42))})
    expected = Counter({word: 7 * df for word, df in DF.items()})
    assert document_frequencies(dataset, text_column="body") == expected
    assert document_frequencies(dataset, text_column="body", num_proc=2) == expected
    assert document_frequencies(DOCS * 7, num_proc=2) == expected


def test_rank_range_is_zero_based_and_half_open():
    assert _names(select_by_document_frequency(DOCS, rank_range=(1, 4))) == ["alpha", "beta", "gamma"]
    assert _names(select_by_document_frequency(DOCS, rank_range=(0, 10))) == RANKED
    assert _names(select_by_document_frequency(DOCS, rank_range=(9, 10))) == ["zeta"]


def test_df_range_is_inclusive_and_in_rank_order():
    assert _names(select_by_document_frequency(DOCS, df_range=(2, 4))) == ["beta", "gamma", "delta", "eps"]
    assert _names(select_by_document_frequency(DOCS, df_range=(1, 1))) == ["alphabet", "end", "of", "zeta"]
    assert _names(select_by_document_frequency(DOCS, df_range=(6, 100))) == ["the"]


def test_priors_and_seeded_targets():
    first = select_by_document_frequency(DOCS, df_range=(1, 6), seed=3)
    again = select_by_document_frequency(DOCS, df_range=(1, 6), seed=3)
    other = select_by_document_frequency(DOCS, df_range=(1, 6), seed=4)
    assert np.all(first.priors == 1e-10)
    np.testing.assert_array_equal(first.targets, again.targets)
    assert not np.array_equal(first.targets, other.targets)
    assert np.all((first.targets >= 2e-4) & (first.targets < 1e-3))
    custom = select_by_document_frequency(DOCS, rank_range=(0, 3), prior=1e-6, target_range=(0.01, 0.02))
    assert np.all(custom.priors == 1e-6)
    assert np.all((custom.targets >= 0.01) & (custom.targets < 0.02))


def test_targets_are_uniform_on_the_range():
    corpus = [f"w{i}" for i in range(3000)]
    secrets = select_by_document_frequency(corpus, df_range=(1, 1), seed=0)
    assert len(secrets) == 3000
    # Fixed seed, so deterministic; a wrong scale or offset would give p ~ 0.
    assert stats.kstest(secrets.targets, stats.uniform(loc=2e-4, scale=8e-4).cdf).pvalue > 0.01


def test_max_secrets_keeps_a_seeded_subset_in_rank_order():
    corpus = [" ".join(f"w{i}" for i in range(k)) for k in range(1, 301)]  # df(w_i) = 300 - i
    full = _names(select_by_document_frequency(corpus, df_range=(1, 300)))
    assert full == [f"w{i}" for i in range(300)]
    subset = _names(select_by_document_frequency(corpus, df_range=(1, 300), max_secrets=40, seed=5))
    assert len(subset) == 40 and set(subset) <= set(full)
    assert subset == sorted(subset, key=full.index)
    assert subset == _names(select_by_document_frequency(corpus, df_range=(1, 300), max_secrets=40, seed=5))
    assert subset != _names(select_by_document_frequency(corpus, df_range=(1, 300), max_secrets=40, seed=6))
    assert subset != full[:40]  # a random subset, not the most frequent words


def test_selected_words_tag_exactly_their_documents():
    secrets = select_by_document_frequency(DOCS, df_range=(1, 5))
    dataset = datasets.Dataset.from_dict({"text": DOCS})
    tagged = tag_dataset(dataset, tagger_for(secrets), num_secrets=len(secrets))
    per_secret = Counter(j for ids in tagged["secret_ids"] for j in ids)
    assert [per_secret[j] for j in range(len(secrets))] == [DF[name] for name in _names(secrets)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give exactly one of rank_range and df_range"),
        ({"rank_range": (0, 2), "df_range": (1, 2)}, "give exactly one of rank_range and df_range"),
        ({"rank_range": (3, 3)}, r"rank_range must be a pair of integers 0 <= lo < hi, got \(3, 3\)"),
        ({"rank_range": (-1, 3)}, "rank_range must be a pair of integers"),
        ({"rank_range": (0.5, 3)}, "rank_range must be a pair of integers"),
        ({"rank_range": (5, 11)}, r"rank_range=\(5, 11\) reaches beyond the corpus, which has 10 distinct"),
        ({"df_range": (0, 3)}, r"df_range must be a pair of integers 1 <= lo <= hi, got \(0, 3\)"),
        ({"df_range": (4, 3)}, "df_range must be a pair of integers"),
        ({"df_range": (7, 9)}, r"no word has a document frequency in df_range=\(7, 9\) .*df from 1 to 6"),
        ({"df_range": (1, 2), "prior": 0.0}, r"prior=0.0 must lie in the open interval \(0, 1\)"),
        ({"df_range": (1, 2), "target_range": (1e-10, 1e-3)}, "must satisfy prior=1e-10 < lo <= hi < 1"),
        ({"df_range": (1, 2), "target_range": (0.5, 1.0)}, "must satisfy prior=1e-10 < lo <= hi < 1"),
        ({"df_range": (1, 2), "target_range": (0.3, 0.2)}, "must satisfy prior=1e-10 < lo <= hi < 1"),
        ({"df_range": (1, 2), "target_range": (0.1, float("nan"))}, "must be finite"),
        ({"df_range": (1, 2), "seed": -1}, "seed must be a non-negative integer, got -1"),
        ({"df_range": (1, 2), "max_secrets": 0}, "max_secrets must be a positive integer or None, got 0"),
        ({"df_range": (1, 2), "num_proc": 0}, "num_proc must be a positive integer or None, got 0"),
    ],
)
def test_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        select_by_document_frequency(DOCS, **kwargs)


def test_input_errors():
    with pytest.raises(ValueError, match=r"text_column 'text' not found; available columns: \['body'\]"):
        select_by_document_frequency(datasets.Dataset.from_dict({"body": DOCS}), df_range=(1, 2))
    with pytest.raises(ValueError, match="^document 1 is a NoneType, not a string$"):
        select_by_document_frequency(["a", None], df_range=(1, 2))
    with pytest.raises(ValueError, match="iterable of strings, got a str"):
        select_by_document_frequency("just one text", df_range=(1, 2))
    with pytest.raises(ValueError, match="iterable of strings, got a DatasetDict"):
        splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS})})
        select_by_document_frequency(splits, df_range=(1, 2))


def test_words_the_tagger_cannot_tag_are_never_ranked_or_chosen():
    # ACLSum paragraphs: "____" (a fill-in blank) was ranked, chosen by --df-ranks and then refused by
    # the tagger ("contains no word characters": it reads underscores as separators).
    docs = [f"{doc} ____ __ _" for doc in DOCS]
    assert document_frequencies(docs)["____"] == len(DOCS)  # counted as a \w+ word, at the top by df
    assert _names(select_by_document_frequency(docs, rank_range=(0, 10))) == RANKED  # the same ten
    assert _names(select_by_document_frequency(docs, df_range=(6, 6))) == ["the"]
    with pytest.raises(ValueError, match="has 10 distinct taggable words"):
        select_by_document_frequency(docs, rank_range=(0, 11))
    chosen = select_by_document_frequency(docs, df_range=(1, 6))
    dataset = datasets.Dataset.from_dict({"text": docs})
    tagged = tag_dataset(dataset, tagger_for(chosen), num_secrets=len(chosen))
    assert sorted({j for ids in tagged["secret_ids"] for j in ids}) == list(range(len(chosen)))
