"""Glyph classes a reader reads as plain letters, and characters a reader does not see.

NFKC folds many styled letters to plain ones (full-width, mathematical, circled, squared), and TR39 maps
look-alikes to prototypes; some classes fall through both, yet every reader reads them as the letter
they draw:

- small capitals (``ɴɪɢʜᴛᴊᴀʀ``, ``LATIN LETTER SMALL CAPITAL N``), negative circled and negative squared
  letters (``🅝``, ``🅽``), regional indicator symbols (``🇳``) and circled digits NFKC keeps (``❶``):
  each is the Latin letter (or digit) its Unicode
  name ends with (:func:`glyph_letter`, read from the character's name: the names are the Unicode
  standard's statement of which letter a glyph is);
- characters that draw nothing inside a word (:func:`is_transparent`): combining marks, format
  characters, every default-ignorable code point (Hangul fillers, variation selectors, the combining
  grapheme joiner) and the kashida that stretches Arabic words (tatweel ``ـ``, NKo lajanyalan).
"""

from __future__ import annotations

import re
import unicodedata

import regex

# The tail of a character's name that says which Latin letter it is drawn as.
_LETTER_NAME = re.compile(
    r"^(?:LATIN LETTER SMALL CAPITAL|NEGATIVE CIRCLED LATIN CAPITAL LETTER|NEGATIVE SQUARED LATIN CAPITAL "
    r"LETTER|REGIONAL INDICATOR SYMBOL LETTER|CIRCLED LATIN (?:CAPITAL|SMALL) LETTER|SQUARED LATIN CAPITAL "
    r"LETTER|PARENTHESIZED LATIN SMALL LETTER|TAG LATIN (?:CAPITAL|SMALL) LETTER) ([A-Z])$"
)
# Digits drawn in circles that NFKC leaves alone (DINGBAT NEGATIVE CIRCLED DIGIT ONE, ...).
_DIGIT_NAME = re.compile(r"^(?:DINGBAT )?(?:NEGATIVE |DOUBLE )?CIRCLED (?:SANS-SERIF )?DIGIT ([A-Z]+)$")
_DIGIT_NAMES = ("ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE")
_DIGITS = {name: str(value) for value, name in enumerate(_DIGIT_NAMES)}
_IGNORABLE = regex.compile(r"\p{Default_Ignorable_Code_Point}")
_KASHIDA = frozenset("\u0640\u07fa")  # Arabic tatweel, NKo lajanyalan: lengthen a word, spell nothing


def glyph_letter(char: str) -> str | None:
    """The ASCII letter (or digit) ``char`` is drawn as when NFKC does not say so (module docstring),
    lower case for a lower-case character (small capitals), else upper case; ``None`` for any other."""
    if char.isascii():
        return None
    name = unicodedata.name(char, "")
    match = _LETTER_NAME.match(name)
    if match is None:
        digit = _DIGIT_NAME.match(name)
        return _DIGITS.get(digit.group(1)) if digit else None
    letter = match.group(1)
    lower = unicodedata.category(char) == "Ll" or " SMALL LETTER" in match.group()
    return letter.lower() if lower else letter


def is_transparent(char: str) -> bool:
    """A mark, format character, default-ignorable code point or kashida: part of the word it is in,
    spelling nothing."""
    category = unicodedata.category(char)
    return category[0] == "M" or category == "Cf" or char in _KASHIDA or bool(_IGNORABLE.match(char))
