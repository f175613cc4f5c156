"""Text as a model reads it: escapes decoded, and every character reduced to the letters it spells.

Secrets are searched in a *decoded* copy of each text and reported as character spans of the *original*
text (so that a fast tokenizer's ``offset_mapping`` can carry them onto the tokens, see
:mod:`hush_hf.secrets.marks`):

1. **Layers** are decoded, to a fixed point (:mod:`hush_hf.secrets.layers`): HTML references with or
   without ``;``, URL percent-escapes, backslash escapes (C octal and CSS included), quoted-printable and
   markup inside words, pass after pass (``&amp;#110;`` -> ``&#110;`` -> ``n``), each decoded character
   mapped back to the whole stretch it came from. :func:`readings` gives every layer and the raw text:
   ``C:\\new`` reads ``new`` raw and a newline decoded.
2. **Characters** are reduced to *keys*, the letters and digits they spell (:class:`CharTable`): NFKC
   (full-width letters, ligatures, superscripts), decimal digits of any script as ASCII digits (``٧`` ->
   ``7``), letters drawn as glyphs NFKC keeps read as the letter their name gives (small capitals,
   negative circled letters, regional indicators: :mod:`hush_hf.secrets.glyph_letters`), transparent
   characters dropped (accents, a combining overlay, soft hyphens, zero-width joiners, Hangul fillers,
   tatweel), then each character replaced by its Unicode TR39 prototype
   (:mod:`hush_hf.secrets.confusables`: Cyrillic ``а`` -> ``a``, ``0`` -> ``o``, ``1`` and ``|`` -> ``l``,
   ``m`` -> ``rn``) and case-folded (``str.casefold``: final sigma, ``ß``). What is neither letter nor digit
   after that (punctuation, spaces, symbols) has an empty key: a separator.

A character can be read two ways, as a letter in another case or as the glyph it looks like: ``I`` is
``i`` in ``Icon`` and ``l`` in ``faIcon``; Greek ``Η`` is ``η`` or ``H``. The *case reading* folds case
first (``I`` -> ``i``), the *glyph reading* takes the prototype first (``I`` -> ``l``); both are kept
where they differ (:data:`GLYPHS`), and a word mixing scripts is also read with its Latin letters as
letters and its other letters as glyphs (:func:`mixed_reading`: ``КIM`` with Cyrillic ``К`` is
``kim``). Folding case before taking prototypes everywhere would merge whole alphabets through Greek and
Cyrillic case pairs (``r``, ``t``, ``u``, ``y`` and ``z`` would become one letter); several readings keep
each exact.

For regular expressions, :func:`normalize` decodes escapes and replaces non-ASCII look-alikes by the
ASCII characters they imitate, keeping case and every other character (offsets mapped back as above);
:func:`dehyphenate` joins words hyphenated across a line break (``Fal-\\ncon``).
"""

from __future__ import annotations

import re
import unicodedata

import regex

from hush_hf.secrets.confusables import prototypes
from hush_hf.secrets.glyph_letters import glyph_letter, is_transparent
from hush_hf.secrets.layers import decoded, layers
from hush_hf.secrets.offsets import Normalized, from_pieces

__all__ = ["Normalized", "decode_escapes", "dehyphenate", "normalize", "readings"]

_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_NON_ASCII_SPLIT = re.compile(r"([^\x00-\x7f]+)")
# A hyphen ending a line inside a word: "Fal-\ncon" (spaces and a carriage return allowed).
_LINE_BREAK_HYPHEN = re.compile(r"(?<=\w)[-\u2010\u2011][ \t]*\r?\n[ \t]*(?=\w)")
# Scripts written without spaces between words: each character is a word of its own.
_NON_LATIN_LETTER = regex.compile(r"(?=\p{L})\P{Latin}")
_UNSPACED = regex.compile(
    r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}\p{Tibetan}]"
)


def decode_escapes(text: str) -> Normalized:
    """Step 1: every layer of markup and escapes decoded, to a fixed point (:mod:`hush_hf.secrets.layers`);
    each decoded character maps back to the whole stretch of ``text`` it came from."""
    return decoded(text)


def readings(text: str) -> list[Normalized]:
    """Every layer of ``text`` a reader decodes (:func:`hush_hf.secrets.layers.layers`, deepest first),
    then the raw text (offsets into ``text``): ``C:\\new`` reads ``new`` raw and a newline decoded."""
    found = layers(text)
    return [*found, Normalized(text)] if found else [Normalized(text)]


# -- characters -> keys ---------------------------------------------------------------------------------


def _stripped(text: str) -> str:
    """NFD with transparent characters dropped (marks, format characters, default-ignorables, kashida:
    :func:`~hush_hf.secrets.glyph_letters.is_transparent`); decimal digits made ASCII."""
    out = []
    for char in unicodedata.normalize("NFD", text):
        if is_transparent(char):
            continue
        out.append(str(unicodedata.decimal(char)) if unicodedata.category(char) == "Nd" else char)
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


def _drawn(char: str) -> str:
    """``char``, or the Latin letter it is drawn as where NFKC does not say so (small capitals, negative
    circled letters, regional indicators: :mod:`hush_hf.secrets.glyph_letters`)."""
    drawn = glyph_letter(char)
    if drawn is None and not char.isascii():  # a modifier form of a small capital: NFKC first
        folded = unicodedata.normalize("NFKC", char)
        drawn = glyph_letter(folded) if len(folded) == 1 and folded != char else None
    return drawn or char


def _folded(char: str) -> str:
    char = _drawn(char)
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
    """The key of ``char`` read as the glyph it looks like: TR39 prototypes, then case folded. The
    prototype of the character itself comes first, before NFKC (which turns the lunate sigma ``ϲ``, drawn
    as ``c``, into ``σ``)."""
    char = _drawn(char)
    if char in prototypes():
        return _settled(_prototype(char), fold=True)
    return _settled("".join(map(_prototype, _stripped(unicodedata.normalize("NFKC", char)))), fold=True)


def mixed_reading(char: str) -> str:
    """The key of ``char`` in a word mixing scripts: a Latin letter (or digit, or symbol) read as a letter
    (:func:`case_reading`), a letter of another script as the Latin glyph it looks like
    (:func:`glyph_reading`): ``КIM`` with Cyrillic ``К`` reads ``kim``."""
    return glyph_reading(char) if _NON_LATIN_LETTER.match(char) else case_reading(char)


def exact_reading(char: str) -> str:
    """The case-sensitive key of ``char``: TR39 prototypes, case kept."""
    return _settled(_stripped(unicodedata.normalize("NFKC", _drawn(char))), fold=False)


def plain_reading(char: str) -> str:
    """The key of ``char`` without TR39 prototypes (case folded): what short terms are matched by."""
    return _letters(_folded(char))


def plain_exact_reading(char: str) -> str:
    """The case-sensitive key of ``char`` without TR39 prototypes."""
    return _letters(_stripped(unicodedata.normalize("NFKC", _drawn(char))))


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
        return TRANSPARENT if is_transparent(char) else SEPARATOR
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
MIXED = CharTable(mixed_reading)
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
    return from_pieces(text, pieces)


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
    return normalized.then(from_pieces(text, pieces))
