"""Tags taken from a text column hold only if the tokens trained are that text's.

A tokenized dataset that kept a text column (and carries no secret marks or ``secret_ids``) is tagged from
that column. If its ``input_ids`` were made from other text (a prompt-only ``text`` beside tokens of prompt
and completion, a chat template's output, a cleaned copy), a secret the tokens spell but the column does not
is never tagged, and its examples train without protection; so is a secret only in a seq2seq row's
target (its ``labels``) beside a source-only text column. So each row's ``input_ids`` and ``labels`` are
decoded and checked to spell a part of its text: every run of non-special tokens, decoded, must occur in
the text, compared by ``key`` (NFKC, case folded, marks dropped, letters and digits only: what an uncased
WordPiece decode or a byte-level BPE decode leaves of the text). Special tokens (BOS/EOS, [CLS]/[SEP],
padding, [UNK]) and -100 labels split the runs, since they spell nothing of the text. Truncated rows and
strided windows pass: their tokens spell a part of the text.
"""

from __future__ import annotations

import re
import weakref
from typing import Any

from hush_hf.secrets.token_text import decode_runs, row_parts, special_ids, token_runs
from hush_hf.secrets.words import normalize_text

_NOT_ALNUM = re.compile(r"[\W_]+")
r"""What ``str.isalnum`` rejects: ``\w`` is exactly the alphanumeric characters and the underscore."""


def key(text: str) -> str:
    """The letters and digits of ``text``, normalised as the caseless matcher reads them."""
    return _NOT_ALNUM.sub("", normalize_text(text))


ROWS_PER_DECODE = 4096
"""Rows whose token runs are decoded in one ``batch_decode`` call (a fast tokenizer decodes a batch at
once; one call per row cost more than the decoding)."""

_decode = decode_runs  # the name the tests of the fast path call


def first_row_not_spelled(texts: list[Any], input_ids: list[Any], tokenizer: Any) -> int | None:
    """The first row whose tokens spell something its text does not (see the module docstring), or None."""
    special = special_ids(tokenizer)
    if len(texts) != len(input_ids):
        raise ValueError(f"{len(texts)} texts but {len(input_ids)} rows of tokens")
    for start in range(0, len(texts), ROWS_PER_DECODE):
        rows = range(start, min(start + ROWS_PER_DECODE, len(texts)))
        owners, runs, not_text = [], [], None
        for row in rows:
            if not isinstance(texts[row], str):
                not_text = row  # fails, after any earlier row that fails
                break
            for part in row_parts(input_ids[row]):  # every choice of a multiple-choice row
                for run in token_runs(part, special):
                    owners.append(row)
                    runs.append(run)
        decoded = decode_runs(tokenizer, runs)
        whole: dict[int, str] = {}
        for row, piece in zip(owners, decoded, strict=True):
            if row not in whole:
                whole[row] = key(texts[row])
            if key(piece) not in whole[row]:
                return row
        if not_text is not None:
            return not_text
    return None


TOKEN_COLUMNS = ("input_ids", "labels")
"""What the model reads and what it is trained to write (a seq2seq row's target is its ``labels``)."""


def can_decode(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` can decode ids back to text (what the checks here need)."""
    return callable(getattr(tokenizer, "batch_decode", None))


def column_rows(dataset: Any, name: str) -> list[Any]:
    """Column ``name`` of a ``datasets.Dataset`` as Python values in row order, whatever its format (a
    torch-formatted column would give tensors)."""
    from hush_hf.data import arrow_columns

    return arrow_columns(dataset, [name])[0][1].to_pylist()


def token_columns(dataset: Any) -> dict[str, list[Any]]:
    """The :data:`TOKEN_COLUMNS` of ``dataset`` that hold token ids per row (lists), by name: a sequence
    classifier's one class per row in ``labels`` spells no text."""
    found = {name: column_rows(dataset, name) for name in TOKEN_COLUMNS if name in dataset.column_names}
    return {name: rows for name, rows in found.items() if rows and isinstance(rows[0], list)}


def first_unspelled(dataset: Any, tokenizer: Any, *, text_column: str) -> tuple[str, int] | None:
    """(token column, row) of the first row whose ``input_ids`` or ``labels`` spell what its
    ``text_column`` does not (see the module docstring); None when every row passes. A pass is
    remembered for the dataset object and tokenizer (``_PassedChecks``)."""
    texts: list[Any] | None = None
    for tokens, rows in token_columns(dataset).items():
        passed = _PassedChecks.key(dataset, tokenizer, text_column, tokens)
        if passed in _PASSED:
            continue
        texts = column_rows(dataset, text_column) if texts is None else texts
        row = first_row_not_spelled(texts, rows, tokenizer)
        if row is not None:
            return tokens, row
        _PASSED.add(passed, dataset, tokenizer)
    return None


def check_tokens_spell_text(dataset: Any, tokenizer: Any, *, text_column: str, name: str) -> None:
    """ValueError naming the first row whose ``input_ids`` or ``labels`` spell what its ``text_column``
    does not."""
    found = first_unspelled(dataset, tokenizer, text_column=text_column)
    if found is not None:
        tokens, row = found
        raise ValueError(
            f"{name} row {row}: its {tokens} spell text that its {text_column!r} column does not hold, so "
            f"tagging {text_column!r} would miss secrets the model reads. Tokenize with the marking "
            "tokenizer (hush_hf.mark_secrets(tokenizer, secrets)), or tag the text the tokens were made from "
            "(hush_hf.secrets.tag_dataset) before tokenizing, or set secrets_text_column to it"
        )


class _PassedChecks:
    """The (dataset, tokenizer, columns) checks that passed in this process, so that trainers built again
    on the same dataset object (a sweep's runs) do not decode it again. A ``datasets.Dataset`` cannot
    change its rows in place, so the same object holds the same rows; the entries hold weak references,
    and one whose dataset or tokenizer is gone (its id may be reused) never matches. The tokenizer's size
    is part of the key (``add_tokens`` changes what its ids decode to)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[weakref.ref, weakref.ref]] = {}

    @staticmethod
    def key(dataset: Any, tokenizer: Any, text_column: str, tokens: str) -> tuple:
        return (id(dataset), id(tokenizer), len(tokenizer), text_column, tokens)

    def __contains__(self, key: tuple) -> bool:
        refs = self._entries.get(key)
        return refs is not None and refs[0]() is not None and refs[1]() is not None

    def add(self, key: tuple, dataset: Any, tokenizer: Any) -> None:
        try:
            refs = (weakref.ref(dataset), weakref.ref(tokenizer))
        except TypeError:  # an object without weak references: not remembered, checked every time
            return
        self._entries = {k: r for k, r in self._entries.items() if r[0]() is not None and r[1]() is not None}
        self._entries[key] = refs


_PASSED = _PassedChecks()
