"""Word tokenisation shared by term tagging and document-frequency selection.

A *word* is a maximal run of Unicode word characters (regex ``\\w+``: letters, digits and the
underscore), taken from the text after NFKC normalisation and, unless case-sensitive, after Unicode
case folding (``str.casefold``, the caseless-matching form of lower-casing), accent stripping
(combining marks, Unicode categories ``Mn``/``Mc``/``Me``, removed after canonical decomposition) and
removal of format characters (category ``Cf``: soft hyphen, zero-width space and joiners, byte-order
mark, bidi controls). These words name and count secrets (document frequencies); where a secret occurs
is decided by :mod:`hush_hf.secrets.matching`, which finds every spelling of the word, not only the word.

Why normalise: a secret written with a compatibility character (``"ﬁnance"`` with the ``fi``
ligature, full-width letters), in another case (``"STRASSE"`` vs ``"straße"``), with or without
accents (``"José"`` vs ``"Jose"``) or with an invisible soft hyphen inside it is the same secret to a
reader, and to an uncased tokenizer (BERT-uncased strips accents and drops format characters before
splitting words): missing it would leave its examples untagged and unprotected.

Known limit: a mark or format character *inside* a word used to split it (``\\w`` does not match
them); removing it joins the pieces, as an uncased tokenizer does, so a term that is only a piece of
such a word (``"ab"`` in ``"ab\\u00adcd"``) no longer matches it. The case-sensitive mode keeps the
text as written (NFKC only).
"""

from __future__ import annotations

import re
import unicodedata

WORD_PATTERN = re.compile(r"\w+")


def _is_dropped(char: str) -> bool:
    """Combining marks (M*) and format characters (Cf): not seen by an uncased tokenizer."""
    category = unicodedata.category(char)
    return category[0] == "M" or category == "Cf"


class _DroppedCharacters(dict):
    """A ``str.translate`` table that deletes what ``_is_dropped`` holds and keeps every other character:
    the same deletions as testing each character, at C speed once a character has been seen (each is
    classified on first sight, then looked up)."""

    def __missing__(self, code: int) -> int | None:
        kept = None if _is_dropped(chr(code)) else code
        self[code] = kept
        return kept


_DROPPED = _DroppedCharacters()


def normalize_text(text: str, *, case_sensitive: bool = False) -> str:
    """NFKC-normalise ``text`` and, unless ``case_sensitive``, case-fold it and strip marks and Cf.

    Caseless form: NFC(strip(NFD(casefold(NFKC(text))))), where strip removes combining marks and
    format characters. The result is stable when applied again: it has no marks left for NFC to
    compose, and case folding and NFKC leave it unchanged.
    """
    text = unicodedata.normalize("NFKC", text)
    if not case_sensitive:
        decomposed = unicodedata.normalize("NFD", text.casefold())
        text = unicodedata.normalize("NFC", decomposed.translate(_DROPPED))
    return text


def words(text: str, *, case_sensitive: bool = False) -> list[str]:
    """The words of ``text`` in order, with repeats: ``\\w+`` over :func:`normalize_text`."""
    return WORD_PATTERN.findall(normalize_text(text, case_sensitive=case_sensitive))
