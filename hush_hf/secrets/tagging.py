"""Adding the per-example secret ids to a Hugging Face dataset (the membership of each D_j).

Secret ids are only valid for the text they were found in: a ``map`` that changes the text after
tagging (appending a secret to every row, say) leaves them stale, and a plan made from them would
count the secret in 4 rows while 24 hold it. So ``tag_dataset`` also writes, per row, a digest of
the text it tagged (column ``secret_ids__hush_tagged_text__<text column>``), which follows the rows
through ``shuffle``/``filter``/``select``, and :func:`check_secret_ids_current` compares it with the
text the row holds now.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Sequence
from typing import Any

import datasets
import numpy as np
import pyarrow as pa

from hush_hf.data import SECRET_IDS_COLUMN, arrow_columns
from hush_hf.digests import row_digests
from hush_hf.secrets.taggers import Tagger, UnionTagger

FINGERPRINT_NOTE = "hush_hf secret set fingerprint: "
TEXT_DIGEST_MARK = "__hush_tagged_text__"  # "<ids column>__hush_tagged_text__<text column>"
TEXT_DIGEST_BYTES = 8


def text_digest_column(column: str, text_column: str) -> str:
    """The name of the column holding the digests of the text ``column`` was tagged from."""
    return f"{column}{TEXT_DIGEST_MARK}{text_column}"


def is_text_digest_column(name: str) -> bool:
    return TEXT_DIGEST_MARK in name


def tagged_text_columns(names: list[str], column: str) -> list[str]:
    """The text columns ``column``'s ids were tagged from, as their digest columns among ``names`` record
    (:func:`text_digest_column`)."""
    prefix = column + TEXT_DIGEST_MARK
    return [name[len(prefix) :] for name in names if name.startswith(prefix)]


def text_digests(texts: Any, text_column: str) -> np.ndarray:
    """int64 per row: the first 8 bytes of the row digest (:mod:`hush_hf.digests`) of its text.

    Unkeyed: the column describes the text beside it, which it is stored with; drop both if the
    dataset is shared without its text.
    """
    array = texts
    if not isinstance(texts, (pa.Array, pa.ChunkedArray)):
        array = pa.array(texts, type=pa.large_string())
    digests = row_digests([(text_column, array)], size=TEXT_DIGEST_BYTES)
    return np.ascontiguousarray(digests).view("<i8").reshape(-1)


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

    def __call__(self, batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list]:
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
        texts = batch[self.text_column]
        return {
            self.column: out,
            text_digest_column(self.column, self.text_column): text_digests(texts, self.text_column).tolist(),
        }


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
    column: str = SECRET_IDS_COLUMN,
    num_secrets: int | None = None,
    overwrite: bool = False,
) -> datasets.Dataset | datasets.DatasetDict:
    """Add ``column``: for each example the sorted, unique indices j of the secrets it contains.

    A tagger made by :func:`hush_hf.secrets.tagger_for` also records its secret set's fingerprint in
    the dataset (:func:`dataset_fingerprint`): planning or training it with another set is refused.
    A second column, ``<column>__hush_tagged_text__<text_column>``, holds a digest of each row's text,
    so ids left stale by a later change to the text are refused (:func:`check_secret_ids_current`).

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


def text_sources(dataset: datasets.Dataset, text_column: str) -> list[str]:
    """The columns a dataset's rows are tagged from: ``text_column``, and, when the dataset is not
    tokenized (no ``input_ids``: the data collator tokenizes its rows, and every column reaches it with
    ``remove_unused_columns=False``), every other string column, since each may be text the model reads
    (over-marking a column the collator ignores costs utility only). hush_hf's bookkeeping columns hold
    numbers, never strings."""
    if "input_ids" in dataset.column_names:
        return [text_column]  # tokenized: the tokens-spell-text check decides
    return [text_column] + [
        name for name, feature in dataset.features.items()
        if name != text_column
        and isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
    ]


def tag_columns(
    dataset: datasets.Dataset,
    tagger: Tagger,
    text_columns: Sequence[str],
    *,
    num_secrets: int | None = None,
    column: str = SECRET_IDS_COLUMN,
    overwrite: bool = False,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """``tag_dataset`` on each of ``text_columns``, the ids of a row the union over them (a secret in any
    column the model reads marks the row), with one tagged-text digest column per source, so
    :func:`check_secret_ids_current` checks each."""
    first, *others = text_columns
    tagged = tag_dataset(dataset, tagger, text_column=first, column=column, num_secrets=num_secrets,
                         overwrite=overwrite, num_proc=num_proc)
    for source in others:
        part = tag_dataset(dataset.select_columns([source]), tagger, text_column=source, column=column,
                           num_secrets=num_secrets, num_proc=num_proc)
        extra = part[column]
        union = [sorted(set(a) | set(b)) for a, b in zip(tagged[column], extra, strict=True)]
        digests = part[text_digest_column(column, source)]
        features = tagged.features[column]
        tagged = tagged.remove_columns(column).add_column(column, union, feature=features)
        tagged = tagged.add_column(text_digest_column(column, source), list(digests),
                                   feature=datasets.Value("int64"))
    return _record_fingerprint(tagged, getattr(tagger, "secret_set_fingerprint", None))


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
    digest_column = text_digest_column(column, text_column)
    stale = [c for c in dataset.column_names if c == column or c.startswith(column + TEXT_DIGEST_MARK)]
    if stale:
        dataset = dataset.remove_columns(stale)
    features = dataset.features.copy()
    features[column] = datasets.Sequence(datasets.Value("int64"))  # List(int64); also on datasets 3
    features[digest_column] = datasets.Value("int64")
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


def check_secret_ids_current(
    dataset: datasets.Dataset,
    *,
    column: str = SECRET_IDS_COLUMN,
    secret_set: Any = None,
    text_column: str = "text",
    what: str = "the dataset",
) -> str | None:
    """ValueError if ``column`` no longer describes the text its rows hold; what cannot be checked, in words.

    With the tagged-text digests of :func:`tag_dataset` and the text column still there, every row's
    text must be the text it was tagged from (else: an error naming how many rows changed and the
    first). Without digests (ids made elsewhere), ``secret_set`` given and ``text_column`` present, the
    text is tagged again and each row's ids must include every secret found (the cost of tagging).
    Returns None when the ids were checked, else one sentence saying what is trusted unchecked.
    """
    names = dataset.column_names
    recorded = tagged_text_columns(names, column)
    n = len(dataset)
    for source in recorded:
        digest_column = text_digest_column(column, source)
        if source not in names:
            return (
                f"{what}'s '{column}' cannot be checked against the text they were tagged from (column "
                f"{source!r} is gone): they are trusted to list every secret each row holds now, so a "
                "change to the rows after tagging would go unnoticed; mark secrets on the tokens instead "
                "(hush_hf.mark_secrets), which keeps them in step with input_ids"
            )
        text, recorded_digests = (array for _, array in arrow_columns(dataset, [source, digest_column]))
        now = text_digests(text, source)
        then = np.asarray(recorded_digests.to_numpy(), dtype=np.int64)
        changed = np.flatnonzero(now != then)
        if changed.size:
            raise ValueError(
                f"{what}'s '{column}' were tagged from other text than column {source!r} holds now, at "
                f"{changed.size} of {n} rows (first: row {int(changed[0])}): the text changed after "
                "tag_dataset (e.g. a map), so the ids are stale; tag again after the last change to the text"
            )
    if recorded:
        return None
    if secret_set is not None and text_column in names:
        missing = _untagged_rows(dataset, column, secret_set, text_column)
        if missing.size:
            raise ValueError(
                f"{what}'s '{column}' lack secrets that tagging column {text_column!r} finds, at "
                f"{missing.size} of {n} rows (first: row {int(missing[0])}): they were made from other "
                "text or another tagger; tag again with tag_dataset after the last change to the text"
            )
        return None
    return (
        f"{what}'s '{column}' record no text they were tagged from (not made by "
        "hush_hf.secrets.tag_dataset): they are trusted to list every secret each row holds, unchecked"
    )


def _untagged_rows(dataset: datasets.Dataset, column: str, secret_set: Any, text_column: str) -> np.ndarray:
    """Rows whose ``column`` lacks a secret that tagging their text with ``secret_set`` finds."""
    from hush_hf.secrets.taggers import tagger_for

    tagger = tagger_for(secret_set)
    texts, given = (array.to_pylist() for _, array in arrow_columns(dataset, [text_column, column]))
    return np.asarray(
        [
            i
            for i, (text, ids) in enumerate(zip(texts, given, strict=True))
            if isinstance(text, str) and not tagger(text) <= set(ids or ())
        ],
        dtype=np.int64,
    )


TOKEN_COLUMNS = ("input_ids", "labels")
"""What the model reads and what it is trained to write."""


def unchecked_tokens(
    dataset: datasets.Dataset, *, column: str = SECRET_IDS_COLUMN, what: str = "the dataset"
) -> str | None:
    """One sentence when ``dataset`` holds token lists (``input_ids``, ``labels``) beside ids tagged from a
    text column: the model reads the tokens, and nothing here can decode them to check that they spell
    that text (:func:`hush_hf.prepare_secret_ids` with a tokenizer does); None otherwise."""
    names = dataset.column_names
    sources = [source for source in tagged_text_columns(names, column) if source in names]
    schema = dataset.data.schema
    tokens = [
        name for name in TOKEN_COLUMNS
        if name in names and (pa.types.is_list(schema.field(name).type)
                              or pa.types.is_large_list(schema.field(name).type))
    ]
    if not sources or not tokens:
        return None
    return (
        f"{what}'s {' and '.join(tokens)} are trusted to spell the text its '{column}' were tagged from "
        f"(column {', '.join(repr(s) for s in sources)}), unchecked: a secret only the tokens spell (a "
        "completion or chat template the column lacks) would train unprotected; pass the rows through "
        "hush_hf.prepare_secret_ids(rows, secret_set=secrets, tokenizer=tokenizer) first, which checks them"
    )


class _Vouched:
    """The datasets whose secret ids :func:`hush_hf.prepare_secret_ids` has checked, or warned about what
    it could not check, in this process: planning them says nothing again. Weak references: an entry
    whose dataset is gone (its id may be reused) never matches."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def add(self, dataset: Any) -> None:
        try:
            ref = weakref.ref(dataset)
        except TypeError:  # no weak references: never vouched, warned each time
            return
        self._refs = {key: r for key, r in self._refs.items() if r() is not None}
        self._refs[id(dataset)] = ref

    def __contains__(self, dataset: Any) -> bool:
        ref = self._refs.get(id(dataset))
        return ref is not None and ref() is dataset


VOUCHED = _Vouched()
