"""Adding the per-example secret ids to a Hugging Face dataset (the membership of each D_j)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import datasets

from hush_hf.secrets.taggers import Tagger, UnionTagger

FINGERPRINT_NOTE = "hush_hf secret set fingerprint: "


def dataset_fingerprint(dataset: Any) -> str | None:
    """The fingerprint of the secret set a dataset's ``secret_ids`` were tagged with, if recorded.

    :func:`tag_dataset` records it in ``dataset.info.description``, which ``map``, ``filter``,
    ``shuffle``, ``select`` and ``save_to_disk`` keep.
    """
    info = getattr(dataset, "info", None)
    description = getattr(info, "description", None) or ""
    notes = [line for line in description.splitlines() if line.startswith(FINGERPRINT_NOTE)]
    return notes[-1][len(FINGERPRINT_NOTE) :].strip() if notes else None


def _record_fingerprint(dataset: datasets.Dataset, fingerprint: str | None) -> datasets.Dataset:
    if fingerprint is None:
        return dataset
    description = dataset.info.description or ""
    kept = [line for line in description.splitlines() if not line.startswith(FINGERPRINT_NOTE)]
    dataset.info.description = "\n".join([*kept, FINGERPRINT_NOTE + fingerprint])
    return dataset


def check_fingerprint(found: str | None, expected: str | None, *, what: str, against: str) -> None:
    """ValueError when two known secret-set fingerprints differ (unknown ones cannot be compared)."""
    if found is not None and expected is not None and found != expected:
        # The fingerprints are not shown: each is a hash of its secrets, which could confirm a guess.
        raise ValueError(
            f"{what} was made with another secret set than {against} (their fingerprints differ); "
            "tag or tokenize again with this secret set"
        )


class _BatchTagger:
    """The ``Dataset.map(batched=True, with_indices=True)`` function: texts -> sorted secret ids."""

    def __init__(self, tagger: Tagger, text_column: str, column: str, num_secrets: int | None) -> None:
        self.tagger = tagger
        self.text_column = text_column
        self.column = column
        self.num_secrets = num_secrets

    def __call__(self, batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[list[int]]]:
        out = []
        for example, text in zip(indices, batch[self.text_column], strict=True):
            if not isinstance(text, str):
                raise ValueError(
                    f"example {example}: column {self.text_column!r} holds a "
                    f"{type(text).__name__}, not a string"
                )
            try:
                ids = sorted(self.tagger(text))
            except ValueError as error:
                raise ValueError(f"example {example}: {error}") from None
            if ids and self.num_secrets is not None and ids[-1] >= self.num_secrets:
                raise ValueError(
                    f"example {example}: secret id {ids[-1]} is out of range [0, {self.num_secrets})"
                )
            out.append(ids)
        return {self.column: out}


def _check_positive_int(field: str, value: object, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        shown = value if isinstance(value, numbers.Integral) else f"a {type(value).__name__}"
        raise ValueError(f"tag_dataset: {field} must be a positive integer, got {shown}")


def tag_dataset(
    dataset: datasets.Dataset | datasets.DatasetDict,
    tagger_or_taggers: Tagger | Sequence[Tagger],
    text_column: str = "text",
    *,
    num_proc: int | None = None,
    batch_size: int = 1000,
    column: str = "secret_ids",
    num_secrets: int | None = None,
    overwrite: bool = False,
) -> datasets.Dataset | datasets.DatasetDict:
    """Add ``column``: for each example the sorted, unique indices j of the secrets it contains.

    A tagger made by :func:`hush_hf.secrets.tagger_for` also records its secret set's fingerprint in
    the dataset (:func:`dataset_fingerprint`): planning or training it with another set is refused.

    Runs ``Dataset.map(batched=True, num_proc=num_proc)``; several taggers are unioned. With
    ``num_secrets`` every id must lie in [0, num_secrets): ids known in advance are checked before
    any work, others (from a :class:`CallableTagger`) per example, and an error names the example
    index and the id. An existing ``column`` is an error unless ``overwrite=True``. A
    ``DatasetDict`` is tagged split by split.
    """
    if isinstance(tagger_or_taggers, Tagger):
        tagger = tagger_or_taggers
    elif isinstance(tagger_or_taggers, Sequence) and not isinstance(tagger_or_taggers, str):
        tagger = UnionTagger(tagger_or_taggers)
    else:
        raise ValueError(
            f"tag_dataset: tagger_or_taggers must be a Tagger or a list of Taggers, "
            f"got a {type(tagger_or_taggers).__name__}"
        )
    _check_positive_int("num_secrets", num_secrets, allow_none=True)
    _check_positive_int("num_proc", num_proc, allow_none=True)
    _check_positive_int("batch_size", batch_size, allow_none=False)
    if not isinstance(column, str) or not column:
        raise ValueError("tag_dataset: column must be a non-empty string")
    if column == text_column:
        raise ValueError(f"tag_dataset: column={column!r} would overwrite the text column")
    if num_secrets is not None:
        parts = tagger.taggers if isinstance(tagger, UnionTagger) else (tagger,)
        known = [max(part.secret_indices) for part in parts if part.secret_indices]
        if known and max(known) >= num_secrets:
            raise ValueError(
                f"tag_dataset: the tagger has secret id {max(known)}, out of range [0, {num_secrets})"
            )

    if isinstance(dataset, datasets.DatasetDict):
        for split, part in dataset.items():
            _check_columns(part, text_column, column, overwrite, where=f" in split {split!r}")
        return datasets.DatasetDict(
            {
                split: _tag(part, tagger, text_column, column, num_secrets, num_proc, batch_size)
                for split, part in dataset.items()
            }
        )
    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(
            f"tag_dataset: dataset must be a datasets.Dataset or DatasetDict, got a {type(dataset).__name__}"
        )
    _check_columns(dataset, text_column, column, overwrite, where="")
    return _tag(dataset, tagger, text_column, column, num_secrets, num_proc, batch_size)


def _check_columns(
    dataset: datasets.Dataset, text_column: str, column: str, overwrite: bool, where: str
) -> None:
    if text_column not in dataset.column_names:
        raise ValueError(
            f"tag_dataset: text_column {text_column!r} not found{where}; "
            f"available columns: {dataset.column_names}"
        )
    if column in dataset.column_names and not overwrite:
        raise ValueError(
            f"tag_dataset: column {column!r} already exists{where}; pass overwrite=True to replace it"
        )


def _tag(
    dataset: datasets.Dataset,
    tagger: Tagger,
    text_column: str,
    column: str,
    num_secrets: int | None,
    num_proc: int | None,
    batch_size: int,
) -> datasets.Dataset:
    if column in dataset.column_names:
        dataset = dataset.remove_columns(column)
    features = dataset.features.copy()
    features[column] = datasets.Sequence(datasets.Value("int64"))  # List(int64); also on datasets 3
    tagged = dataset.map(
        _BatchTagger(tagger, text_column, column, num_secrets),
        batched=True,
        with_indices=True,
        batch_size=batch_size,
        num_proc=num_proc,
        features=features,
        desc="Tagging secrets",
    )
    return _record_fingerprint(tagged, getattr(tagger, "secret_set_fingerprint", None))
