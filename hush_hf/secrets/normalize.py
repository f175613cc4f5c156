"""Text as a model reads it: escapes decoded, and every character reduced to the letters it spells.

Secrets are searched in a *decoded* copy of each text and reported as character spans of the *original*
text (so that a fast tokenizer's ``offset_mapping`` can carry them onto the tokens, see
:mod:`hush_hf.secrets.marks`):

1. **Escapes** are decoded, each decoded character mapped back to its whole escape: HTML entities
   (``&shy;``, ``&#233;``), runs of URL percent-escapes (``project%20falcon``, UTF-8 sequences included)
   and backslash escapes of code and JSON strings (``\\n``, ``\\t``, ``\\"``, ``\\x41``, ``\\u00e9``,
   surrogate pairs). :func:`readings` gives the decoded text and, when it differs, the raw text too:
   ``C:\\new`` reads ``new`` raw and a newline decoded.
2. **Characters** are reduced to *keys*, the letters and digits they spell (:class:`CharTable`): NFKC
   (full-width letters, ligatures, superscripts), decimal digits of any script as ASCII digits (``٧`` ->
   ``7``), combining marks and format characters dropped (accents, a combining overlay, soft hyphens,
   zero-width joiners), then each character replaced by its Unicode TR39 prototype
   (:mod:`hush_hf.secrets.confusables`: Cyrillic ``а`` -> ``a``, ``0`` -> ``o``, ``1`` and ``|`` -> ``l``,
   ``m`` -> ``rn``) and case-folded (``str.casefold``: final sigma, ``ß``). What is neither letter nor digit
   after that (punctuation, spaces, symbols) has an empty key: a separator.

A character can be read two ways, as a letter in another case or as the glyph it looks like: ``I`` is
``i`` in ``Icon`` and ``l`` in ``faIcon``; Greek ``Η`` is ``η`` or ``H``. The *case reading* folds case
first (``I`` -> ``i``), the *glyph reading* takes the prototype first (``I`` -> ``l``); both are kept
where they differ (:attr:`CharTable.glyph`). Folding case before taking prototypes everywhere would merge
whole alphabets through Greek and Cyrillic case pairs (``r``, ``t``, ``u``, ``y`` and ``z`` would become
one letter); two readings keep each exact.

For regular expressions, :func:`normalize` decodes escapes and replaces non-ASCII look-alikes by the
ASCII characters they imitate, keeping case and every other character (offsets mapped back as above);
:func:`dehyphenate` joins words hyphenated across a line break (``Fal-\\ncon``).
"""

from __future__ import annotations

import html
import re
import unicodedata
from urllib.parse import unquote

import numpy as np
import regex

from hush_hf.secrets.confusables import prototypes

# HTML entities (named, decimal, hex) and runs of percent-escapes (a UTF-8 sequence spans several).
_ESCAPE = re.compile(
    r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});|(?:%[0-9A-Fa-f]{2})+"
    r"|\\(?:[ntrfvab0\\'\"/]|x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|u\{[0-9A-Fa-f]{1,6}\})"
)
_BACKSLASH = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "b": "\b", "0": "\0"}
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_NON_ASCII_SPLIT = re.compile(r"([^\x00-\x7f]+)")
# A hyphen ending a line inside a word: "Fal-\ncon" (spaces and a carriage return allowed).
_LINE_BREAK_HYPHEN = re.compile(r"(?<=\w)[-\u2010\u2011][ \t]*\r?\n[ \t]*(?=\w)")
# Scripts written without spaces between words: each character is a word of its own.
_UNSPACED = regex.compile(
    r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}\p{Tibetan}]"
)


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
    if escape[0] == "&":
        return html.unescape(escape)
    if escape[0] == "%":
        return unquote(escape, errors="replace")
    kind = escape[1]
    if kind in _BACKSLASH:
        return _BACKSLASH[kind]
    if kind in "xuU":
        return chr(int(escape[2:].strip("{}"), 16))
    return kind  # \\ \' \" \/


def decode_escapes(text: str) -> Normalized:
    """Step 1: escapes decoded (each decoded character maps to its whole escape); surrogate pairs written
    as two ``\\u`` escapes (JSON) become one character."""
    if "&" not in text and "%" not in text and "\\" not in text:  # no escape can start: a fast scan
        return Normalized(text)
    pieces: list[tuple[int, int, str]] = []
    for match in _ESCAPE.finditer(text):
        decoded = _decode_escape(match.group())
        if decoded == match.group():
            continue
        if pieces and pieces[-1][1] == match.start() and _is_surrogate_pair(pieces[-1][2], decoded):
            start, _, high = pieces.pop()
            decoded = (high + decoded).encode("utf-16-le", "surrogatepass").decode("utf-16-le")
            pieces.append((start, match.end(), decoded))
            continue
        pieces.append((match.start(), match.end(), decoded))
    return _from_pieces(text, pieces)


def _is_surrogate_pair(high: str, low: str) -> bool:
    return len(high) == 1 and len(low) == 1 and "\ud800" <= high <= "\udbff" and "\udc00" <= low <= "\udfff"


def readings(text: str) -> list[Normalized]:
    """The decoded text and, when decoding changed it, the raw text (offsets into ``text``)."""
    decoded = decode_escapes(text)
    return [decoded] if decoded.starts is None else [decoded, Normalized(text)]


# -- characters -> keys ---------------------------------------------------------------------------------


def _stripped(text: str) -> str:
    """NFD with combining marks (M*) and format characters (Cf) dropped; decimal digits made ASCII."""
    out = []
    for char in unicodedata.normalize("NFD", text):
        category = unicodedata.category(char)
        if category[0] == "M" or category == "Cf":
            continue
        out.append(str(unicodedata.decimal(char)) if category == "Nd" else char)
    return "".join(out)


def _prototype(char: str) -> str:
    """The TR39 prototype of ``char`` (NFKC, marks dropped): a letter or digit reads as the letters and
    digits of its prototype (``Ɓ`` -> ``B``), another character only when its prototype is made of
    letters and digits alone (``|`` -> ``l``; ``%``, whose prototype is ``º/₀``, stays a separator)."""
    prototype = prototypes().get(char)
    if prototype is None:
        return char
    prototype = _stripped(unicodedata.normalize("NFKC", prototype))
    if char.isalnum():
        return _letters(prototype)
    return prototype if prototype.isalnum() else char


def _letters(text: str) -> str:
    return "".join(char for char in text if char.isalnum())


def _folded(char: str) -> str:
    return _stripped(unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", char).casefold()))


def _settled(text: str, *, fold: bool) -> str:
    """Letters and digits of ``text`` after prototypes (and case folding) until nothing changes
    (``M`` -> ``m`` -> ``rn``)."""
    for _ in range(4):
        changed = "".join(map(_prototype, text))
        if fold:
            changed = changed.casefold()
        if changed == text:
            break
        text = changed
    return _letters(text)


def case_reading(char: str) -> str:
    """The key of ``char`` read as a letter in another case: case folded, then TR39 prototypes."""
    return _settled(_folded(char), fold=True)


def glyph_reading(char: str) -> str:
    """The key of ``char`` read as the glyph it looks like: TR39 prototypes, then case folded."""
    return _settled("".join(map(_prototype, _stripped(unicodedata.normalize("NFKC", char)))), fold=True)


def exact_reading(char: str) -> str:
    """The case-sensitive key of ``char``: TR39 prototypes, case kept."""
    return _settled(_stripped(unicodedata.normalize("NFKC", char)), fold=False)


def plain_reading(char: str) -> str:
    """The key of ``char`` without TR39 prototypes (case folded): what short terms are matched by."""
    return _letters(_folded(char))


def plain_exact_reading(char: str) -> str:
    """The case-sensitive key of ``char`` without TR39 prototypes."""
    return _letters(_stripped(unicodedata.normalize("NFKC", char)))


#: Kinds of characters, for splitting words (:mod:`hush_hf.secrets.matching`): upper-case letter,
#: lower-case letter (``s`` apart, for plurals of acronyms: ``KBs``), digit, letter without case, a
#: character that is a word alone (scripts without spaces, symbols that spell a letter such as ``|``),
#: a transparent character (a combining mark or format character: part of the word around it, spelling
#: nothing), and a separator.
UPPER, LOWER, LOWER_S, DIGIT, CASELESS, ALONE, TRANSPARENT, SEPARATOR = "ulsdoxm "


def char_kind(char: str) -> str:
    """The kind of ``char`` (see :data:`UPPER` ...)."""
    category = unicodedata.category(char)
    if not case_reading(char) and not glyph_reading(char):
        return TRANSPARENT if category[0] == "M" or category == "Cf" else SEPARATOR
    if category in ("Lu", "Lt"):
        return UPPER
    if category == "Ll":
        return LOWER_S if char == "s" else LOWER
    if category[0] == "N":
        return DIGIT
    if category[0] == "L":
        return ALONE if _UNSPACED.match(char) else CASELESS
    return ALONE


class CharTable(dict):
    """A ``str.translate`` table computed per character on first use (``fn(char)``), kept afterwards.

    :data:`KINDS`, :data:`KEYS` (case reading), :data:`GLYPHS` (glyph reading), :data:`EXACT`
    (case-sensitive) and :data:`PLAIN` / :data:`PLAIN_EXACT` (without prototypes) are the tables texts
    are split and keyed with; the key tables keep ``\0`` (a separator, never in a word) as itself, to
    translate many words joined by it in one call. :meth:`translate` is ``text.translate(table)``, faster
    on ASCII text.
    """

    def __init__(self, fn, *, keep_nul: bool = True) -> None:
        super().__init__()
        self.fn = fn
        self.keep_nul = keep_nul
        if keep_nul:
            self[0] = "\0"
        self._ascii: tuple[dict[int, str | None], tuple[tuple[str, str], ...]] | None = None

    def __missing__(self, code: int) -> str:
        value = self.fn(chr(code))
        if len(self) < 1_000_000:
            self[code] = value
        return value

    def translate(self, text: str) -> str:
        """``text.translate(self)``; ASCII runs through CPython's one-to-one fast path, the few ASCII
        characters that become several (``m`` -> ``rn``) put in afterwards."""
        single, several = self._ascii or self._build_ascii()
        if text.isascii():
            out = text.translate(single)
        else:
            chunks = _NON_ASCII_SPLIT.split(text)  # ASCII, non-ASCII, ASCII, ...
            if len(chunks) > 64:  # mostly non-ASCII: one pass through the table
                return text.translate(self)
            chunks[0::2] = [chunk.translate(single) for chunk in chunks[0::2]]
            chunks[1::2] = [chunk.translate(self) for chunk in chunks[1::2]]
            out = "".join(chunks)
        for placeholder, value in several:
            out = out.replace(placeholder, value)
        return out

    def _build_ascii(self) -> tuple[dict[int, str | None], tuple[tuple[str, str], ...]]:
        if self._ascii is None:
            single: dict[int, str | None] = {}
            several: dict[str, str] = {}  # value -> a control character (never in a word) standing for it
            for code in range(1, 128):
                value = self[code]
                if len(value) == 1:
                    single[code] = value
                elif not value:
                    single[code] = None
                else:
                    single[code] = several.setdefault(value, chr(len(several) + 1))
            single[0] = "\0" if self.keep_nul else self[0]
            self._ascii = (single, tuple((placeholder, value) for value, placeholder in several.items()))
        return self._ascii


KINDS = CharTable(char_kind, keep_nul=False)
KEYS = CharTable(case_reading)
GLYPHS = CharTable(glyph_reading)
EXACT = CharTable(exact_reading)
PLAIN = CharTable(plain_reading)
PLAIN_EXACT = CharTable(plain_exact_reading)


# -- regular expressions: look-alikes replaced, case and punctuation kept ------------------------------


def _look_alike(char: str) -> str:
    """``char`` (non-ASCII) as the ASCII characters it imitates where TR39 says so, else itself
    (NFKC-normalised, marks and format characters dropped); the case of ``char`` is kept."""
    base = _stripped(unicodedata.normalize("NFKC", char))
    mapped = "".join(map(_prototype, base))
    if not mapped.isascii():
        return base
    if char.isupper() and mapped.islower():
        return mapped.upper()
    if char.islower() and mapped.isupper():
        return mapped.lower()
    return mapped


_LOOK_ALIKES: dict[str, str] = {}


def fold_characters(text: str) -> Normalized:
    """Non-ASCII characters replaced by :func:`_look_alike` (offsets kept; only non-ASCII runs visited)."""
    if text.isascii():
        return Normalized(text)
    pieces = []
    for run in _NON_ASCII.finditer(text):
        for k, char in enumerate(run.group()):
            folded = _LOOK_ALIKES.get(char)
            if folded is None:
                folded = _LOOK_ALIKES[char] = _look_alike(char)
            if folded != char:
                pieces.append((run.start() + k, run.start() + k + 1, folded))
    return _from_pieces(text, pieces)


def normalize(text: str) -> Normalized:
    """Escapes decoded and look-alikes replaced: the text regular expressions are searched in."""
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
