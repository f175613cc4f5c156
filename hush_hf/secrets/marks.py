"""Secrets carried on the tokens: a per-token marks column that survives any chunking or packing.

A secret is located on the text as character spans (:meth:`hush_hf.secrets.Tagger.spans`) and carried
onto the tokens through a fast tokenizer's ``offset_mapping``: token t of a row is marked with every
secret j one of whose occurrences overlaps t's characters. The marks are one list per token, so any
step that concatenates and cuts the token columns in lockstep (``group_texts`` of transformers'
``run_clm.py``/``run_mlm.py``, TRL's packing, a user's chunker) keeps them aligned with
``input_ids``; a row then contains secret j exactly when one of its tokens is marked with j (Hush,
Sec. 3: the examples D_j), and an occurrence cut by a block boundary marks both blocks.

The column is named ``secret_marks_<fingerprint>`` after the secret set that made it, so marks made
with one secret set are never planned or trained with another. ``mark_secrets(tokenizer, secrets)``
returns a copy of the tokenizer whose outputs carry the column: the one line a training script needs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hush_hf.secrets.matching import SecretSpan
from hush_hf.secrets.secret_set import SecretSet
from hush_hf.secrets.taggers import Tagger, tagger_for

MARKS_PREFIX = "secret_marks_"


def marks_column_name(fingerprint: str) -> str:
    """The name of the marks column made with the secret set of this fingerprint."""
    return MARKS_PREFIX + fingerprint


def find_marks_column(column_names: Sequence[str]) -> str | None:
    """The marks column among ``column_names`` (``None`` if there is none; two are an error)."""
    found = [name for name in column_names if name.startswith(MARKS_PREFIX)]
    if len(found) > 1:
        raise ValueError(
            f"the dataset has {len(found)} secret marks columns ('{MARKS_PREFIX}...'): it was tokenized "
            "with several marked tokenizers; keep the one made with the secret set you train with"
        )
    return found[0] if found else None


def marks_fingerprint(column_name: str) -> str:
    """The secret-set fingerprint a marks column was made with."""
    return column_name[len(MARKS_PREFIX) :]


def token_marks(offsets: Sequence[Sequence[int]], spans: Sequence[SecretSpan]) -> list[list[int]]:
    """For each token ``(start, end)``, the sorted secrets whose spans overlap ``[start, end)``.

    Overlap means ``start < span.end and span.start < end``; empty tokens (special tokens and padding
    have offsets ``(0, 0)``) are never marked. Unmarked tokens share one empty list: treat it as read-only.
    """
    count = len(offsets)
    if not spans or not count:
        return [
            []
        ] * count  # one shared empty list (read-only use): building n lists costs more than tokenizing
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    starts, ends = bounds[:, 0], bounds[:, 1]
    nonempty = ends > starts
    found: dict[int, set[int]] = {}
    for start, end, secret in spans:
        for t in np.flatnonzero(nonempty & (starts < end) & (ends > start)).tolist():
            found.setdefault(t, set()).add(secret)
    marks: list[list[int]] = [[]] * count
    for t, secrets in found.items():
        marks[t] = sorted(secrets)
    return marks


class SecretMarker:
    """Finds a secret set's occurrences in texts and marks the tokens that overlap them.

    ``secrets``: a :class:`SecretSet` or a secrets file; ``tagger``: how occurrences are found
    (default :func:`hush_hf.secrets.tagger_for`; it must give spans).
    """

    def __init__(self, secrets: SecretSet | str | Path, *, tagger: Tagger | None = None) -> None:
        if isinstance(secrets, (str, Path)):
            secrets = SecretSet.load(secrets)
        if not isinstance(secrets, SecretSet):
            raise ValueError(f"secrets must be a SecretSet or a secrets file, got a {type(secrets).__name__}")
        self.num_secrets = len(secrets)
        self.fingerprint = secrets.fingerprint
        self.column = marks_column_name(self.fingerprint)
        self.tagger = tagger if tagger is not None else tagger_for(secrets)

    def __repr__(self) -> str:
        return f"SecretMarker({self.num_secrets} secrets)"

    def spans(self, text: str) -> list[SecretSpan]:
        """The occurrences of every secret in ``text`` (original character offsets)."""
        if not isinstance(text, str):
            raise ValueError(f"secret marking needs text, got a {type(text).__name__}")
        return self.tagger.spans(text)

    def batch_spans(self, texts: Sequence[str]) -> list[list[SecretSpan]]:
        """The occurrences in each of ``texts``, read one after the other (see :meth:`Tagger.batch_spans`)."""
        for k, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"secret marking needs text, got a {type(text).__name__} in row {k}")
        return self.tagger.batch_spans(texts)

    def encoding_marks(self, encoding: Any, text: Any, text_pair: Any = None) -> list:
        """The marks of a fast tokenizer's ``BatchEncoding`` made with ``return_offsets_mapping=True``.

        A batch of texts is read as one text, the rows one after the other, as ``group_texts`` and
        packing concatenate the rows of a ``datasets.map`` batch: an occurrence spanning rows marks the
        tokens holding its parts in every row. Rows produced by ``return_overflowing_tokens`` are mapped
        to their text through ``overflow_to_sample_mapping``; with pairs, each token is matched against
        its own sequence, row by row.
        """
        offsets = encoding["offset_mapping"]
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        pairs = None if text_pair is None else ([text_pair] if single else list(text_pair))
        # One text gives one row (a list of pairs) unless overflowing tokens split it into several.
        several = (
            bool(offsets)
            and isinstance(offsets[0], list)
            and bool(offsets[0])
            and (isinstance(offsets[0][0], (tuple, list)))
        )
        rows = offsets if (several or not single) else [offsets]
        samples = encoding.get("overflow_to_sample_mapping")
        cache: dict[tuple[int, int], list[SecretSpan]] = {}
        if pairs is None and len(texts) > 1:  # the rows as a script concatenating them reads them
            cache.update(((k, 0), spans) for k, spans in enumerate(self.batch_spans(texts)))

        def spans_of(sample: int, sequence: int) -> list[SecretSpan]:
            key = (sample, sequence)
            if key not in cache:
                source = texts if sequence == 0 else pairs
                cache[key] = self.spans(source[sample])  # type: ignore[index]
            return cache[key]

        out = []
        for row, row_offsets in enumerate(rows):
            sample = int(samples[row]) if samples is not None else row
            if pairs is None:
                out.append(token_marks(row_offsets, spans_of(sample, 0)))
                continue
            sequence_ids = encoding.sequence_ids(row)
            marks: list[list[int]] = [[]] * len(row_offsets)
            for sequence in (0, 1):
                keep = [t for t, s in enumerate(sequence_ids) if s == sequence]
                part = token_marks([row_offsets[t] for t in keep], spans_of(sample, sequence))
                for t, mark in zip(keep, part, strict=True):
                    marks[t] = mark
            out.append(marks)
        return out if (several or not single) else out[0]

    def with_target_secrets(
        self, marks: list, encoding: Any, text: Any, target: Any, tokenizer: Any = None
    ) -> list:
        """``marks`` with every secret of each row's ``text_target`` added to all of that row's tokens.

        A seq2seq row trains its target (the labels) as well as its input, but the marks follow
        ``input_ids``; a secret only the target holds still makes the row one of the secret's examples.
        Marking every input token with it keeps the row marked through any cut (over-marking, never under).
        With ``tokenizer``, the secrets that the labels spell once decoded are added too (a label cut by
        truncation can spell a secret its whole target does not: :mod:`hush_hf.secrets.label_marks`).
        """
        single = isinstance(text, str)
        targets = [target] if isinstance(target, str) else list(target)
        found = [{span.secret for span in self.spans(t)} for t in targets]
        labels = encoding.get("labels")
        if tokenizer is not None and labels is not None:
            from hush_hf.secrets.label_marks import label_secrets

            rows = [labels] if isinstance(target, str) else list(labels)
            if len(rows) == len(found):  # one row of labels per target (overflowing inputs share it)
                spelled = label_secrets(tokenizer, self.tagger, rows)
                found = [secrets | more for secrets, more in zip(found, spelled, strict=True)]
        samples = encoding.get("overflow_to_sample_mapping")
        if single and (not marks or not isinstance(marks[0], list) or not marks[0] or
                       not isinstance(marks[0][0], list)):
            return _add_to_every_token(marks, found[0])
        return [
            _add_to_every_token(row, found[int(samples[k]) if samples is not None else k])
            for k, row in enumerate(marks)
        ]


def _add_to_every_token(row: list[list[int]], secrets: set[int]) -> list[list[int]]:
    """``row``'s token marks with ``secrets`` added to every token (one shared list where none had any)."""
    if not secrets:
        return row
    extra = sorted(secrets)
    return [sorted(secrets.union(m)) if m else extra for m in row]


class _MarkingTokenizer:
    """Mixin: ``__call__`` adds the marks column to list outputs (the dataset ``map`` case)."""

    _hush_marker: SecretMarker

    def __call__(self, text: Any = None, text_pair: Any = None, *args: Any, **kwargs: Any) -> Any:
        wants_marks = (
            text is not None
            and kwargs.get("return_tensors") is None
            and not kwargs.get("is_split_into_words", False)
            and not args  # text_target etc. given positionally: leave the call alone
        )
        target = kwargs.get("text_target")
        if text is None and target is not None and kwargs.get("return_tensors") is None and not args:
            raise ValueError(
                "a marking tokenizer called with text_target alone (labels tokenized apart from the inputs) "
                "cannot carry the target's secrets to the row: the model trains on them, so call "
                "tokenizer(inputs, text_target=targets) once, which marks the row with the secrets of both"
            )
        if not wants_marks:
            return super().__call__(text, text_pair, *args, **kwargs)  # type: ignore[misc]
        wants_offsets = kwargs.pop("return_offsets_mapping", False)
        encoding = super().__call__(text, text_pair, return_offsets_mapping=True, **kwargs)  # type: ignore[misc]
        marker = self._hush_marker
        marks = marker.encoding_marks(encoding, text, text_pair)
        if target is not None:
            marks = marker.with_target_secrets(marks, encoding, text, target, tokenizer=self)
        encoding[marker.column] = marks
        if not wants_offsets:
            del encoding["offset_mapping"]
        return encoding

    def __reduce_ex__(self, protocol: Any) -> Any:
        base = type(self).__mro__[2]
        plain = base.__new__(base)
        plain.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_hush_marker"})
        return (_remark, (plain, self._hush_marker))


_MARKED_CLASSES: dict[type, type] = {}


def _marked_class(base: type) -> type:
    cls = _MARKED_CLASSES.get(base)
    if cls is None:
        # Same name as the base: save_pretrained writes tokenizer_class from the class name.
        cls = type(base.__name__, (_MarkingTokenizer, base), {"__module__": base.__module__})
        cls.__qualname__ = base.__qualname__
        _MARKED_CLASSES[base] = cls
    return cls


def _remark(tokenizer: Any, marker: SecretMarker) -> Any:
    marked = copy.copy(tokenizer)
    marked.__class__ = _marked_class(type(tokenizer))
    marked._hush_marker = marker
    return marked


def mark_secrets(
    tokenizer: Any, secrets: SecretSet | str | Path | SecretMarker, *, tagger: Tagger | None = None
) -> Any:
    """A copy of a fast ``tokenizer`` whose outputs carry the secret marks column.

    ``tokenizer(texts)`` (lists out, as in a ``datasets.map`` tokenize function) then also returns
    ``secret_marks_<fingerprint>``: per row, per token, the secrets the token overlaps. Calls with
    ``return_tensors`` or pre-split words are left unchanged (model inputs for generation and
    evaluation stay as they were). The copy is still an instance of the tokenizer's class, pickles, and
    saves exactly like the original. In a training script, one line after the tokenizer is built::

        tokenizer = hush_hf.mark_secrets(tokenizer, training_args.secrets_file)
    """
    from transformers import PreTrainedTokenizerBase

    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise ValueError(f"mark_secrets needs a transformers tokenizer, got a {type(tokenizer).__name__}")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"mark_secrets needs a fast tokenizer (offset mappings), got {type(tokenizer).__name__}; "
            "load it with use_fast=True"
        )
    if secrets is None:  # a training script run without --secrets_file (issue 29: "got a NoneType")
        raise ValueError(
            "mark_secrets got no secrets: give the secrets file (--secrets_file in a training script, "
            "SecretProtectionConfig.secrets_file) or a SecretSet"
        )
    marker = secrets if isinstance(secrets, SecretMarker) else SecretMarker(secrets, tagger=tagger)
    if isinstance(tokenizer, _MarkingTokenizer):
        tokenizer = tokenizer.__reduce_ex__(2)[1][0]  # the unmarked tokenizer
    return _remark(tokenizer, marker)


def secret_ids_from_marks(marks: Any) -> Any:
    """Per row, the sorted distinct secrets marked on any of its tokens (a pyarrow ``ListArray``).

    ``marks``: the marks column (a pyarrow list<list<int>> array, chunked or not, or Python lists).
    """
    import pyarrow as pa

    if isinstance(marks, pa.ChunkedArray):
        marks = marks.combine_chunks()
    if not isinstance(marks, (pa.ListArray, pa.LargeListArray)):
        marks = pa.array(list(marks), type=pa.list_(pa.list_(pa.int64())))
    if marks.null_count:
        raise ValueError(f"the secret marks column has {marks.null_count} null rows")
    row_offsets = np.asarray(marks.offsets, dtype=np.int64)
    row_offsets = row_offsets - row_offsets[0]
    tokens = marks.flatten()
    token_offsets = np.asarray(tokens.offsets, dtype=np.int64)
    token_offsets = token_offsets - token_offsets[0]
    values = np.asarray(tokens.flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
    rows = len(marks)
    token_row = np.repeat(np.arange(rows, dtype=np.int64), np.diff(row_offsets))
    value_row = np.repeat(token_row, np.diff(token_offsets))
    if values.size and values.min() < 0:
        raise ValueError("the secret marks column holds a negative secret index")
    width = int(values.max()) + 1 if values.size else 1
    pairs = np.unique(value_row * width + values)
    pair_rows, pair_values = pairs // width, pairs % width
    offsets = np.searchsorted(pair_rows, np.arange(rows + 1), side="left").astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(pair_values, pa.int64()))


def misaligned_marks(marks: Any, input_ids: Any) -> np.ndarray:
    """Rows whose marks column holds a different number of tokens than ``input_ids``.

    Marks are made together with the tokens, one list per token; a later step that changes
    ``input_ids`` but not the marks (a ``map`` that edits or truncates the tokens) leaves them out of
    step. Equal lengths are necessary, not sufficient: a token replaced in place is not seen.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths = []
    for column in (marks, input_ids):
        if not isinstance(column, (pa.Array, pa.ChunkedArray)):
            column = pa.array(list(column))
        lengths.append(np.asarray(pc.list_value_length(column).fill_null(-1).to_numpy(zero_copy_only=False)))
    return np.flatnonzero(lengths[0] != lengths[1])
