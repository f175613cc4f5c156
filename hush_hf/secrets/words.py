"""Word tokenisation shared by term tagging and document-frequency selection.

A *word* is a maximal run of Unicode word characters (regex ``\\w+``: letters, digits and the
underscore), taken from the text after NFKC normalisation and, unless case-sensitive, after Unicode
case folding (``str.casefold``, the caseless-matching form of lower-casing). A phrase term matches a
whole-word token sequence, so ``"cat"`` never matches ``"catalog"`` or ``"cat_food"``, and
``"new york"`` matches ``"New-York"`` and ``"new, york"`` alike.

Why normalise: a secret written with a compatibility character (``"ﬁnance"`` with the ``fi``
ligature, full-width letters) or in another case (``"STRASSE"`` vs ``"straße"``) is the same secret;
missing it would leave its examples untagged and unprotected. Normalising can only make more examples
match (costing utility, never privacy).

Known limit: in scripts that use combining marks (e.g. Devanagari) ``\\w+`` splits a word at each
mark, so a term becomes a phrase of its pieces. Text and terms are split the same way, so this
over-matches rather than under-matches.
"""

from __future__ import annotations

import re
import unicodedata

WORD_PATTERN = re.compile(r"\w+")


def normalize_text(text: str, *, case_sensitive: bool = False) -> str:
    """NFKC-normalise ``text`` and, unless ``case_sensitive``, case-fold it.

    Folding is done as NFKC(casefold(NFKC(text))) so that the result is stable when applied again
    (case folding can produce characters that NFKC composes).
    """
    text = unicodedata.normalize("NFKC", text)
    if not case_sensitive:
        text = unicodedata.normalize("NFKC", text.casefold())
    return text


def words(text: str, *, case_sensitive: bool = False) -> list[str]:
    """The words of ``text`` in order, with repeats: ``\\w+`` over :func:`normalize_text`."""
    return WORD_PATTERN.findall(normalize_text(text, case_sensitive=case_sensitive))
