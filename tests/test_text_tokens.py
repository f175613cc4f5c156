"""The tokens-spell-their-text check (hush_hf.trainer.text_tokens): its fast paths against the plain ones."""

from __future__ import annotations

import importlib
import unicodedata

import datasets
import pytest

from hush_hf.assets.tokenizer_assets import bert_uncased_tokenizer, gpt2_tokenizer
from hush_hf.trainer import text_tokens

words = importlib.import_module("hush_hf.secrets.words")  # the package re-exports a function of that name

EVERY_CHARACTER = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)


def _normalized_character_by_character(text: str) -> str:
    decomposed = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text).casefold())
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not words._is_dropped(c)))


def test_normalize_text_drops_what_the_per_character_test_drops_on_every_code_point() -> None:
    for start in range(0, len(EVERY_CHARACTER), 4096):
        chunk = EVERY_CHARACTER[start : start + 4096]
        assert words.normalize_text(chunk) == _normalized_character_by_character(chunk), hex(ord(chunk[0]))


def test_key_keeps_exactly_the_alphanumeric_characters() -> None:
    for start in range(0, len(EVERY_CHARACTER), 4096):
        chunk = EVERY_CHARACTER[start : start + 4096]
        expected = "".join(c for c in words.normalize_text(chunk) if c.isalnum())
        assert text_tokens.key(chunk) == expected, hex(ord(chunk[0]))


TEXTS = ["Café Ünïcode, naïve résumé: 7,741 items!", "emoji 🦜 and 中文 mixed", "ﬁ ligature ＦＵＬＬ width"]


@pytest.mark.parametrize("make", [bert_uncased_tokenizer, gpt2_tokenizer], ids=["bert", "gpt2"])
def test_the_backend_decodes_runs_as_batch_decode_does(make) -> None:
    tokenizer = make()
    runs = [ids[1:-1] or ids for ids in tokenizer(TEXTS * 3, truncation=True, max_length=7)["input_ids"]]
    plain = tokenizer.batch_decode(runs, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert text_tokens._decode(tokenizer, runs) == plain


def test_the_first_failing_row_is_named_across_decode_batches(monkeypatch) -> None:
    tokenizer = gpt2_tokenizer()
    monkeypatch.setattr(text_tokens, "ROWS_PER_DECODE", 2)
    texts = ["alpha beta", "gamma delta", "epsilon", "zeta eta", "theta"]
    ids = tokenizer(texts)["input_ids"]
    assert text_tokens.first_row_not_spelled(texts, ids, tokenizer) is None
    wrong = list(ids)
    wrong[3] = tokenizer("zeta nightjar")["input_ids"]
    assert text_tokens.first_row_not_spelled(texts, wrong, tokenizer) == 3
    # a failing row before a row without text, in one decode batch: the earlier one is named
    assert text_tokens.first_row_not_spelled([*texts[:3], "zeta eta", None], wrong, tokenizer) == 3
    assert text_tokens.first_row_not_spelled([*texts[:4], None], ids, tokenizer) == 4


def test_a_passed_check_is_not_repeated_for_the_same_dataset_object(monkeypatch) -> None:
    tokenizer = gpt2_tokenizer()
    rows = datasets.Dataset.from_dict({"text": TEXTS, "input_ids": tokenizer(TEXTS)["input_ids"]})
    calls = []
    checked = text_tokens.first_row_not_spelled
    monkeypatch.setattr(text_tokens, "first_row_not_spelled", lambda *a: calls.append(1) or checked(*a))
    for _ in range(3):
        text_tokens.check_tokens_spell_text(rows, tokenizer, text_column="text", name="train_dataset")
    assert len(calls) == 1
    copy = rows.map(lambda row: row)  # another object with the same rows: checked again
    text_tokens.check_tokens_spell_text(copy, tokenizer, text_column="text", name="train_dataset")
    assert len(calls) == 2
    tokenizer.add_tokens(["nightjar"])  # the ids may decode to other text now
    text_tokens.check_tokens_spell_text(rows, tokenizer, text_column="text", name="train_dataset")
    assert len(calls) == 3


def test_a_class_label_per_row_is_no_token_column_and_a_torch_format_is_read_as_lists() -> None:
    # A sequence classifier's labels (one class per row) spell no text: skipped, where they used to reach
    # the decoder as ints (a TypeError). A torch-formatted set is read as lists, as the eval check did.
    tokenizer = gpt2_tokenizer()
    ids = tokenizer(TEXTS, padding=False)["input_ids"]
    classes = datasets.Dataset.from_dict({"text": TEXTS, "input_ids": ids, "labels": [0, 1, 1]})
    text_tokens.check_tokens_spell_text(classes, tokenizer, text_column="text", name="train_dataset")
    assert list(text_tokens.token_columns(classes)) == ["input_ids"]
    wrong = datasets.Dataset.from_dict({"text": TEXTS, "input_ids": ids, "labels": [ids[0], ids[0], ids[2]]})
    wrong = wrong.with_format("torch")
    assert text_tokens.first_unspelled(wrong, tokenizer, text_column="text") == ("labels", 1)
    with pytest.raises(ValueError, match="^train_dataset row 1: its labels spell text"):
        text_tokens.check_tokens_spell_text(wrong, tokenizer, text_column="text", name="train_dataset")
