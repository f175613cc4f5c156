"""Text as a model sees it, with every character mapped back to the original text's offsets.

Secrets are searched in a *normalised* copy of each text and the matches are reported as character
spans of the *original* text (so that a fast tokenizer's ``offset_mapping`` can carry them onto the
tokens, see :mod:`hush_hf.secrets.marks`). The normalisation errs towards finding more: an example
wrongly marked costs a little utility, one wrongly left out voids its secret's guarantee.

Steps (each keeps, for every output character, the span of original characters it came from):

1. Escapes are decoded: HTML entities (``&shy;``, ``&amp;``, ``&#233;``) and runs of URL
   percent-escapes (``project%20falcon``, UTF-8 sequences included).
2. Each character is NFKC-normalised (full-width letters, ligatures), decomposed, and stripped of
   combining marks (``M*``) and format characters (``Cf``: soft hyphen, zero-width joiners, bidi
   controls), as an uncased tokenizer does. Case is kept here: identifiers are split at case
   changes afterwards (:mod:`hush_hf.secrets.matching`) and case is folded per word.
3. Unicode confusables are replaced by the Latin letter they imitate (Cyrillic ``а`` -> ``a``,
   Greek ``Ο`` -> ``O``): one character for one, so offsets are unchanged by this step.

:func:`dehyphenate` gives a second variant with words hyphenated across a line break joined
(``Fal-\\ncon`` -> ``Falcon``); matching runs on both, so ``project-\\nfalcon`` still matches as two
words. The confusables table is written here (not taken from a library) because what is needed is
small and one-to-one: look-alikes of the 26 Latin letters from Cyrillic, Greek, Armenian, Cherokee and
Latin extensions; Unicode's full TR39 skeleton maps many characters to several and is not in the
standard library.
"""

from __future__ import annotations

import html
import re
import unicodedata
from urllib.parse import unquote

import numpy as np

# HTML entities (named, decimal, hex) and runs of percent-escapes (a UTF-8 sequence spans several).
_ESCAPE = re.compile(
    r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});|(?:%[0-9A-Fa-f]{2})+"
)
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
# A hyphen ending a line inside a word: "Fal-\ncon" (spaces and a carriage return allowed).
_LINE_BREAK_HYPHEN = re.compile(r"(?<=\w)[-\u2010\u2011][ \t]*\r?\n[ \t]*(?=\w)")

_CONFUSABLES = {
    # Cyrillic
    "а": "a", "А": "A", "в": "b", "В": "B", "с": "c", "С": "C", "ԁ": "d", "е": "e", "Е": "E",
    "ё": "e", "Ё": "E", "һ": "h", "Н": "H", "і": "i", "І": "I", "ї": "i", "Ї": "I", "ј": "j",
    "Ј": "J", "к": "k", "К": "K", "ӏ": "l", "Ӏ": "I", "м": "m", "М": "M", "о": "o", "О": "O",
    "р": "p", "Р": "P", "ԛ": "q", "ѕ": "s", "Ѕ": "S", "т": "t", "Т": "T", "υ": "u", "ν": "v",
    "ԝ": "w", "Ԝ": "W", "х": "x", "Х": "X", "у": "y", "У": "Y", "ү": "y", "Ү": "Y", "ʏ": "y",
    # Greek
    "α": "a", "Α": "A", "β": "b", "Β": "B", "ε": "e", "Ε": "E", "Ζ": "Z", "η": "n", "Η": "H",
    "ι": "i", "Ι": "I", "κ": "k", "Κ": "K", "Μ": "M", "Ν": "N", "ο": "o", "Ο": "O", "ρ": "p",
    "Ρ": "P", "τ": "t", "Τ": "T", "Υ": "Y", "χ": "x", "Χ": "X", "ϲ": "c", "Ϲ": "C", "ϳ": "j",
    # Armenian, Cherokee, Latin extensions
    "օ": "o", "ս": "u", "ց": "g", "հ": "h", "ո": "n", "Ꭺ": "A", "Ᏼ": "B", "Ꮯ": "C", "Ꭼ": "E",
    "Ꮋ": "H", "Ꮶ": "K", "Ꮇ": "M", "Ꮲ": "P", "Ꮪ": "S", "Ꭲ": "T", "ɑ": "a", "ɡ": "g", "ı": "i",
    "ȷ": "j", "ſ": "s", "ℓ": "l",
}  # fmt: skip
_CONFUSABLE_TABLE = str.maketrans(_CONFUSABLES)


class Normalized:
    """A normalised text and, per character k, the original span ``[starts[k], ends[k])`` it came from.

    ``starts``/``ends`` are ``None`` when the text is unchanged in length and position (the common,
    ASCII case): then character k came from original character k.
    """

    __slots__ = ("ends", "starts", "text")

    def __init__(self, text: str, starts: np.ndarray | None = None, ends: np.ndarray | None = None) -> None:
        self.text = text
        self.starts = starts
        self.ends = ends

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """The original span behind normalised characters ``[start, end)`` (``end > start``)."""
        if self.starts is None or self.ends is None:
            return start, end
        return int(self.starts[start]), int(self.ends[end - 1])

    def then(self, later: Normalized) -> Normalized:
        """``later`` (a normalisation of ``self.text``) with offsets into the original text."""
        if later.starts is None or later.ends is None:
            return Normalized(later.text, self.starts, self.ends)
        if self.starts is None or self.ends is None:
            return later
        if later.starts.size == 0:
            return Normalized(later.text, later.starts, later.ends)
        return Normalized(later.text, self.starts[later.starts], self.ends[later.ends - 1])


def _from_pieces(text: str, pieces: list[tuple[int, int, str]]) -> Normalized:
    """``text`` with the non-overlapping, sorted replacements ``(start, end, new)`` applied."""
    if not pieces:
        return Normalized(text)
    out: list[str] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    position = 0
    for start, end, new in pieces:
        if start > position:
            out.append(text[position:start])
            kept = np.arange(position, start)
            starts.append(kept)
            ends.append(kept + 1)
        out.append(new)
        starts.append(np.full(len(new), start))
        ends.append(np.full(len(new), end))
        position = end
    if position < len(text):
        out.append(text[position:])
        kept = np.arange(position, len(text))
        starts.append(kept)
        ends.append(kept + 1)
    return Normalized(
        "".join(out), np.concatenate(starts).astype(np.int64), np.concatenate(ends).astype(np.int64)
    )


def _decode_escape(escape: str) -> str:
    if escape.startswith("&"):
        return html.unescape(escape)
    return unquote(escape, errors="replace")


def decode_escapes(text: str) -> Normalized:
    """Step 1: HTML entities and URL percent-escapes decoded (each decoded character maps to its escape)."""
    if "&" not in text and "%" not in text:
        return Normalized(text)
    pieces = []
    for match in _ESCAPE.finditer(text):
        decoded = _decode_escape(match.group())
        if decoded != match.group():
            pieces.append((match.start(), match.end(), decoded))
    return _from_pieces(text, pieces)


_CHAR_CACHE: dict[str, str] = {}


def _fold_char(char: str) -> str:
    """Step 2 and 3 for one non-ASCII character: NFKC, marks and format characters dropped, confusables."""
    folded = _CHAR_CACHE.get(char)
    if folded is None:
        decomposed = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", char))
        kept = "".join(
            c for c in decomposed if unicodedata.category(c)[0] != "M" and unicodedata.category(c) != "Cf"
        )
        folded = unicodedata.normalize("NFC", kept).translate(_CONFUSABLE_TABLE)
        if len(_CHAR_CACHE) < 1_000_000:
            _CHAR_CACHE[char] = folded
    return folded


def fold_characters(text: str) -> Normalized:
    """Steps 2 and 3 (ASCII characters are unchanged; only non-ASCII runs are visited)."""
    if text.isascii():
        return Normalized(text)
    pieces = []
    same_length = True
    for run in _NON_ASCII.finditer(text):
        for k, char in enumerate(run.group()):
            folded = _fold_char(char)
            if folded != char:
                pieces.append((run.start() + k, run.start() + k + 1, folded))
                same_length = same_length and len(folded) == 1
    if same_length:  # one-for-one replacements: positions unchanged
        chars = list(text)
        for start, _, new in pieces:
            chars[start] = new
        return Normalized("".join(chars))
    return _from_pieces(text, pieces)


def normalize(text: str) -> Normalized:
    """Steps 1-3: the text secrets are searched in, with offsets into ``text``."""
    decoded = decode_escapes(text)
    return decoded.then(fold_characters(decoded.text))


def dehyphenate(normalized: Normalized) -> Normalized | None:
    """``normalized`` with words hyphenated across a line break joined, or ``None`` if it has none."""
    text = normalized.text
    if "\n" not in text:
        return None
    pieces = [(m.start(), m.end(), "") for m in _LINE_BREAK_HYPHEN.finditer(text)]
    if not pieces:
        return None
    return normalized.then(_from_pieces(text, pieces))
