"""Where in a text do secrets occur? Character spans ``(start, end, secret)`` of the original text.

Texts are normalised first (:mod:`hush_hf.secrets.normalize`: escapes decoded, NFKC, marks and format
characters dropped, confusables replaced), then matched as follows; terms go through the same steps.

- **Words.** Text and terms are split into *sub-words*: identifiers are split at case changes,
  digits and underscores (``ProjectFalcon``, ``project_falcon``, ``Falcon9`` give ``project``,
  ``falcon``, ``9``), other non-word characters separate words, and every sub-word is case-folded
  (``str.casefold``). A term of n sub-words matches n consecutive sub-words of the text, whatever
  separates them (``project falcon`` matches ``project-falcon``, ``projectFalcon``,
  ``project%20falcon``). A one-word term also matches a whole identifier (``projectfalcon`` matches
  ``ProjectFalcon`` and ``project_falcon``).
- **Inflections.** A text word also matches in its singular forms (``falcons`` -> ``falcon``,
  ``companies`` -> ``company``, ``boxes`` -> ``box``); possessives split off as their own word.
- **Line-break hyphenation.** ``Fal-`` + line break + ``con`` matches ``falcon`` (and, read as two
  words, ``fal con``).
- **Scripts without spaces** (Han, Hiragana, Katakana, Hangul, Thai, Lao, Khmer, Myanmar, Tibetan):
  a term written in them matches as a substring of a run of such letters.
- **Patterns.** A regular expression is searched in the raw text and, unless ``raw``, also in the
  normalised text (with ``re.IGNORECASE`` unless case-sensitive).

Matching errs towards finding more (a word like ``new`` matches ``news``): an example wrongly marked
costs a little utility, one left out voids a guarantee. Cost per text is linear in its length and
independent of the number of terms (dict look-ups), except patterns (one search each).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import regex

from hush_hf.secrets.normalize import Normalized, dehyphenate, normalize

# Sub-words: an acronym before a capitalised word ("HTML" in "HTMLParser"), a capitalised or lower-case
# word, an all-caps word, a number, or a run of letters without case (CJK, Thai, Arabic, ...).
_SUBWORD = regex.compile(
    r"\p{Lu}+(?=\p{Lu}[\p{Ll}\p{Lt}])|[\p{Lu}\p{Lt}]?[\p{Ll}\p{Lt}]+|\p{Lu}+|\p{N}+|[\p{Lo}\p{Lm}]+"
)
_WORD = regex.compile(r"\w+")
_UNSPACED = regex.compile(
    r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}\p{Tibetan}]"
)


class SecretSpan(NamedTuple):
    """An occurrence of secret ``secret`` at characters ``[start, end)`` of the original text."""

    start: int
    end: int
    secret: int


def singular_forms(word: str) -> tuple[str, ...]:
    """``word`` and the singulars it could be the plural of (English ``-s``, ``-es``, ``-ies``)."""
    if len(word) < 3 or word[-1] != "s":
        return (word,)
    forms = [word, word[:-1]]
    if word.endswith("es"):
        forms.append(word[:-2])
        if word.endswith("ies"):
            forms.append(word[:-3] + "y")
    return tuple(forms)


def term_words(term: str, *, case_sensitive: bool = False) -> tuple[str, ...]:
    """The sub-words a term is matched by (normalised, split, case-folded unless case-sensitive)."""
    text = normalize(term).text
    found = _SUBWORD.findall(text)
    return tuple(found if case_sensitive else (w.casefold() for w in found))


def is_unspaced(word: str) -> bool:
    """Whether ``word`` is written in a script without spaces (matched as a substring)."""
    return _UNSPACED.search(word) is not None


class TermIndex:
    """Dict indexes of terms: one-word terms, phrases by first word, and unspaced-script substrings."""

    def __init__(self, terms: Mapping[int, Sequence[str]], *, case_sensitive: bool = False) -> None:
        single: dict[str, set[int]] = {}
        phrases: dict[str, dict[tuple[str, ...], set[int]]] = {}
        substrings: dict[str, set[int]] = {}
        for index, secret_terms in terms.items():
            for k, term in enumerate(secret_terms):
                words = term_words(term, case_sensitive=case_sensitive)
                if not words:
                    raise ValueError(f"term {k} of secret #{index} contains no word characters")
                if len(words) == 1 and is_unspaced(words[0]):
                    substrings.setdefault(words[0], set()).add(index)
                elif len(words) == 1:
                    single.setdefault(words[0], set()).add(index)
                else:
                    phrases.setdefault(words[0], {}).setdefault(words[1:], set()).add(index)
        self.case_sensitive = case_sensitive
        self.single = {w: tuple(sorted(ids)) for w, ids in single.items()}
        self.phrases = {
            first: tuple((rest, tuple(sorted(ids))) for rest, ids in tails.items())
            for first, tails in phrases.items()
        }
        self.substrings = {w: tuple(sorted(ids)) for w, ids in substrings.items()}
        self.substring_lengths = tuple(sorted({len(w) for w in substrings}))
        self.substring_firsts = frozenset(w[0] for w in substrings)
        self.keys = frozenset(self.single) | frozenset(self.phrases)

    def _fold(self, word: str) -> str:
        return word if self.case_sensitive else word.casefold()

    def spans(self, normalized: Normalized, out: set[SecretSpan]) -> None:
        """Add every term occurrence in ``normalized`` (original offsets) to ``out``."""
        text = normalized.text
        tokens = [(m.start(), m.end(), self._fold(m.group())) for m in _SUBWORD.finditer(text)]
        if self.keys:
            self._word_spans(normalized, tokens, out)
        if self.substrings and not text.isascii():
            self._substring_spans(normalized, tokens, out)

    def _word_spans(self, normalized: Normalized, tokens: list, out: set[SecretSpan]) -> None:
        forms = {word: singular_forms(word) for word in {t[2] for t in tokens}}
        hits = {word for word, fs in forms.items() if not self.keys.isdisjoint(fs)}
        for k, (start, end, word) in enumerate(tokens):
            if word not in hits:
                continue
            for form in forms[word]:
                for j in self.single.get(form, ()):
                    out.add(SecretSpan(*normalized.original_span(start, end), j))
                for rest, ids in self.phrases.get(form, ()):
                    last = k + len(rest)
                    if last < len(tokens) and all(
                        w in singular_forms(tokens[k + 1 + i][2]) for i, w in enumerate(rest)
                    ):
                        span = normalized.original_span(start, tokens[last][1])
                        out.update(SecretSpan(*span, j) for j in ids)
        if not self.single:
            return
        # A one-word term against whole identifiers: "projectfalcon" in "ProjectFalcon", "project_falcon".
        for match in _WORD.finditer(normalized.text):
            whole = self._fold(match.group())
            for form in {whole, whole.replace("_", "")}:
                for j in self.single.get(form, ()):
                    out.add(SecretSpan(*normalized.original_span(match.start(), match.end()), j))

    def _substring_spans(self, normalized: Normalized, tokens: list, out: set[SecretSpan]) -> None:
        for start, _, word in tokens:
            if word.isascii():
                continue
            for i, char in enumerate(word):
                if char not in self.substring_firsts:
                    continue
                for n in self.substring_lengths:
                    ids = self.substrings.get(word[i : i + n])
                    if ids:
                        span = normalized.original_span(start + i, start + i + n)
                        out.update(SecretSpan(*span, j) for j in ids)


def compile_pattern(index: int, pattern: str | re.Pattern[str], flags: int) -> re.Pattern[str]:
    """``pattern`` compiled with ``flags``; errors name the secret, never the pattern."""
    if isinstance(pattern, re.Pattern):
        flags, pattern = pattern.flags | flags, pattern.pattern
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"pattern of secret #{index} must be a non-empty string")
    try:
        return re.compile(pattern, flags)
    except re.error as error:
        # error.msg and error.pos only: str(error) could be extended to quote the pattern.
        raise ValueError(
            f"pattern of secret #{index} is not a valid regular expression: "
            f"{error.msg} at position {error.pos}"
        ) from None


def pattern_spans(
    patterns: Sequence[tuple[int, re.Pattern[str], bool]], text: str, variants: Sequence[Normalized]
) -> set[SecretSpan]:
    """Matches of ``(index, compiled, raw)`` in ``text`` and, unless raw, in its normalised ``variants``."""
    out: set[SecretSpan] = set()
    for index, compiled, raw in patterns:
        for match in compiled.finditer(text):
            if match.end() > match.start():
                out.add(SecretSpan(match.start(), match.end(), index))
        if raw:
            continue
        for variant in variants:
            if variant.text == text and variant.starts is None:
                continue
            for match in compiled.finditer(variant.text):
                if match.end() > match.start():
                    out.add(SecretSpan(*variant.original_span(match.start(), match.end()), index))
    return out


def text_variants(text: str) -> list[Normalized]:
    """The normalised text and, if it has words hyphenated across line breaks, the joined variant."""
    normalized = normalize(text)
    joined = dehyphenate(normalized)
    return [normalized] if joined is None else [normalized, joined]
