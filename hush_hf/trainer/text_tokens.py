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

from typing import Any

from hush_hf.secrets.words import normalize_text


def key(text: str) -> str:
    """The letters and digits of ``text``, normalised as the caseless matcher reads them."""
    return "".join(char for char in normalize_text(text) if char.isalnum())


def token_runs(ids: list[int], special: set[int]) -> list[list[int]]:
    """The maximal runs of ``ids`` holding no special token id (nor a negative one: -100 labels)."""
    runs: list[list[int]] = [[]]
    for token in ids:
        if token < 0 or token in special:
            runs.append([])
        else:
            runs[-1].append(token)
    return [run for run in runs if run]


def first_row_not_spelled(texts: list[Any], input_ids: list[Any], tokenizer: Any) -> int | None:
    """The first row whose tokens spell something its text does not (see the module docstring), or None."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    for row, (text, ids) in enumerate(zip(texts, input_ids, strict=True)):
        if not isinstance(text, str):
            return row
        flat = list(ids[0]) if ids and isinstance(ids[0], list) else list(ids)
        runs = token_runs([int(t) for t in flat], special)
        if not runs:
            continue
        whole = key(text)
        decoded = tokenizer.batch_decode(runs, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if any(key(piece) not in whole for piece in decoded):
            return row
    return None


TOKEN_COLUMNS = ("input_ids", "labels")
"""What the model reads and what it is trained to write (a seq2seq row's target is its ``labels``)."""


def check_tokens_spell_text(dataset: Any, tokenizer: Any, *, text_column: str, name: str) -> None:
    """ValueError naming the first row whose ``input_ids`` or ``labels`` spell what its ``text_column``
    does not."""
    for tokens in (c for c in TOKEN_COLUMNS if c in dataset.column_names):
        row = first_row_not_spelled(dataset[text_column], dataset[tokens], tokenizer)
        if row is None:
            continue
        raise ValueError(
            f"{name} row {row}: its {tokens} spell text that its {text_column!r} column does not hold, so "
            f"tagging {text_column!r} would miss secrets the model reads. Tokenize with the marking "
            "tokenizer (hush_hf.mark_secrets(tokenizer, secrets)), or tag the text the tokens were made from "
            "(hush_hf.secrets.tag_dataset) before tokenizing, or set secrets_text_column to it"
        )
