"""The cached split of texts into words (PieceWords) against the plain split_words it stands in for."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from hush_hf.secrets.normalize import Normalized
from hush_hf.secrets.word_split import PieceWords, join_words, split_words

TEXTS = [
    "",
    " ",
    "plain words of a sentence, with punctuation (e.g. this).",
    "  leading, trailing and  doubled  spaces  ",
    "tabs\tand\nnew lines\r\nare not pieces' edges",
    "NightJar HTMLParser KBs faIcon Falcon9 I In It II 1,000 p r o j e c t",
    "mmm Mm rn |l| a|b x_y",
    "Ｆａｌｃｏｎ ﬁnance Ⅻ café cafe\u0301 Σίσυφος ΟΑ страна ٧٧٤١ 猎鹰 word猎鹰word",
    "soft\u00adhyphen zero\u200bwidth over\u0338lay",
    "a" * 70 + " " + "Ab" * 40 + " short",
]


def _as_lists(words) -> tuple:
    glyphs = words.glyphs or [None] * len(words.keys)
    return (
        list(words.keys),
        list(glyphs),
        None if words.plain is None else list(words.plain),
        list(words.starts),
        list(words.ends),
    )


def _random_texts(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    alphabet = list("abcsI lmMKB0179|_-. \t\n")
    alphabet += ["\u0391", "\u0430", "\u0301", "\u00ad", "\u732b", "\uff21", "  "]
    return ["".join(rng.choice(alphabet, size=int(rng.integers(0, 60)))) for _ in range(count)]


@pytest.mark.parametrize("case_sensitive", [False, True])
@pytest.mark.parametrize("plain", [False, True])
def test_piece_words_are_split_words(case_sensitive: bool, plain: bool) -> None:
    cached = PieceWords(case_sensitive=case_sensitive, plain=plain)
    uncached = PieceWords(case_sensitive=case_sensitive, plain=plain, size=0)
    for text in TEXTS + _random_texts(300, seed=3):
        expected = _as_lists(split_words(Normalized(text), case_sensitive=case_sensitive, plain=plain))
        for words in (cached.split(text), cached.split(text), uncached.split(text)):  # miss, hit, never kept
            assert _as_lists(words) == expected, repr(text)
    assert len(cached) > 0 and len(uncached) == 0
    assert all(len(piece) <= cached.longest and " " not in piece for piece in cached)


def test_piece_offsets_index_like_lists() -> None:
    text = TEXTS[5]
    words = PieceWords(case_sensitive=False, plain=False).split(text)
    starts = split_words(Normalized(text)).starts
    assert words.starts[-1] == starts[-1] and words.starts[2:5] == starts[2:5]
    assert [text[s:e] for s, e in zip(words.starts, words.ends, strict=True)][:3] == ["Night", "Jar", "HTML"]
    with pytest.raises(IndexError):
        words.starts[len(starts)]


def test_joined_words_keep_offsets_into_their_own_text() -> None:
    rows = ["first row", "", "second  row here", "x"]
    pieces = PieceWords(case_sensitive=False, plain=True)
    words, firsts = join_words([pieces.split(row) for row in rows])
    assert firsts == [0, 2, 2, 5, 6]
    expected = []  # (row, start, end) of each word, from splitting each row alone
    for row in rows:
        alone = split_words(Normalized(row))
        expected += [(row, start, end) for start, end in zip(alone.starts, alone.ends, strict=True)]
    row_of = [rows[r] for r in range(len(rows)) for _ in range(firsts[r], firsts[r + 1])]
    assert list(zip(row_of, words.starts, words.ends, strict=True)) == expected
    assert words.keys == ["first", "row", "second", "row", "here", "x"]


def test_split_words_leave_no_garbage_cycles() -> None:
    """A text's words and offsets are freed by reference counting when dropped: a reference cycle per
    text left them to the garbage collector (full collections then cost most of the tagging time)."""
    pieces = PieceWords(case_sensitive=False, plain=True)
    texts = TEXTS + _random_texts(50, seed=5)
    gc.disable()
    try:
        gc.collect()
        for text in texts:
            words = pieces.split(text)
            words.starts[len(words.keys) // 2] if words.keys else None  # noqa: B018 (fills the sums)
            join_words([words, pieces.split(text)])
        assert gc.collect() == 0
    finally:
        gc.enable()
