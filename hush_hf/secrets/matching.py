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
from itertools import accumulate
from typing import NamedTuple

import regex

from hush_hf.secrets.normalize import Normalized, dehyphenate, normalize

# Sub-words: an acronym before a capitalised word ("HTML" in "HTMLParser"), a capitalised or lower-case
# word, an all-caps word, a number, or a run of letters without case (CJK, Thai, Arabic, ...).
_SUBWORD_PATTERN = (
    r"\p{Lu}+(?=\p{Lu}[\p{Ll}\p{Lt}])|[\p{Lu}\p{Lt}]?[\p{Ll}\p{Lt}]+|\p{Lu}+|\p{N}+|[\p{Lo}\p{Lm}]+"
)
_SUBWORD = regex.compile(_SUBWORD_PATTERN)
# split() with one capturing group gives separators and sub-words alternately: offsets by prefix sums.
_SUBWORD_SPLIT = regex.compile(f"({_SUBWORD_PATTERN})")
# The same on ASCII text with the standard library's re (faster there; \p{Lu} is A-Z, \p{Ll} a-z).
_ASCII_SUBWORD_SPLIT = re.compile(r"([A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+)")
MAX_IDENTIFIER_PARTS = 8  # one-word terms are matched against runs of up to this many joined sub-words
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


def plural_forms(word: str) -> tuple[str, ...]:
    """``word`` and the text words whose singular forms include it (the inverse of :func:`singular_forms`)."""
    forms = [word, word + "s", word + "es"]
    if word.endswith("y"):
        forms.append(word[:-1] + "ies")
    return tuple(f for f in forms if f == word or len(f) >= 3)


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
        # Text words are looked up as they are: a term's plural forms are indexed with it.
        self.single: dict[str, tuple[int, ...]] = {}
        for word, ids in single.items():
            for form in plural_forms(word):
                self.single[form] = tuple(sorted(set(self.single.get(form, ())) | ids))
        self.words = frozenset(single)  # the one-word terms themselves (matched against identifiers)
        self.phrases: dict[str, tuple[tuple[tuple[str, ...], tuple[int, ...]], ...]] = {}
        for first, tails in phrases.items():
            entries = tuple((rest, tuple(sorted(ids))) for rest, ids in tails.items())
            for form in plural_forms(first):
                self.phrases[form] = self.phrases.get(form, ()) + entries
        self.substrings = {w: tuple(sorted(ids)) for w, ids in substrings.items()}
        self.substring_lengths = tuple(sorted({len(w) for w in substrings}))
        self.substring_firsts = frozenset(w[0] for w in substrings)
        self.keys = frozenset(self.single) | frozenset(self.phrases)

    def spans(self, normalized: Normalized, out: set[SecretSpan]) -> None:
        """Add every term occurrence in ``normalized`` (original offsets) to ``out``."""
        text = normalized.text
        ascii_text = text.isascii()
        parts = (_ASCII_SUBWORD_SPLIT if ascii_text else _SUBWORD_SPLIT).split(text)
        raw = parts[1::2]
        folded = raw if self.case_sensitive else list(map(str.casefold, raw))
        hits = self.keys.intersection(folded)
        separators = parts[2:-1:2]  # separators[k] lies between sub-words k and k + 1
        joined = self.words and ("" in separators or "_" in text)
        if not (hits or joined or (self.substrings and not ascii_text)):
            return
        bounds = list(accumulate(map(len, parts)))  # sub-word k is text[bounds[2k] : bounds[2k + 1]]
        if hits:
            self._word_spans(normalized, folded, bounds, hits, out)
        if joined:
            self._identifier_spans(normalized, folded, bounds, separators, out)
        if self.substrings and not ascii_text:
            self._substring_spans(normalized, folded, bounds, out)

    def _word_spans(
        self,
        normalized: Normalized,
        folded: list[str],
        bounds: list[int],
        hits: set[str],
        out: set[SecretSpan],
    ) -> None:
        for k in [k for k, word in enumerate(folded) if word in hits]:
            word = folded[k]
            start = bounds[2 * k]
            for j in self.single.get(word, ()):
                out.add(SecretSpan(*normalized.original_span(start, bounds[2 * k + 1]), j))
            for rest, ids in self.phrases.get(word, ()):
                last = k + len(rest)
                if last < len(folded) and all(
                    w in singular_forms(folded[k + 1 + i]) for i, w in enumerate(rest)
                ):
                    span = normalized.original_span(start, bounds[2 * last + 1])
                    out.update(SecretSpan(*span, j) for j in ids)

    def _identifier_spans(
        self,
        normalized: Normalized,
        folded: list[str],
        bounds: list[int],
        separators: list[str],
        out: set[SecretSpan],
    ) -> None:
        """One-word terms against runs of joined sub-words: "projectfalcon" in "myProjectFalcon",
        "project_falcon" (sub-words separated by nothing or by underscores only)."""
        glued = [not sep or not sep.strip("_") for sep in separators]
        k = 0
        while k < len(folded):
            end = k
            while end < len(glued) and glued[end]:
                end += 1
            if end > k:  # sub-words k..end form one identifier: try each joined sub-run
                for a in range(k, end + 1):
                    for b in range(a + 1, min(end, a + MAX_IDENTIFIER_PARTS - 1) + 1):
                        for j in self.single.get("".join(folded[a : b + 1]), ()):
                            span = normalized.original_span(bounds[2 * a], bounds[2 * b + 1])
                            out.add(SecretSpan(*span, j))
            k = end + 1

    def _substring_spans(
        self, normalized: Normalized, folded: list[str], bounds: list[int], out: set[SecretSpan]
    ) -> None:
        for k, word in enumerate(folded):
            if word.isascii():
                continue
            start = bounds[2 * k]
            for i, char in enumerate(word):
                if char not in self.substring_firsts:
                    continue
                for n in self.substring_lengths:
                    ids = self.substrings.get(word[i : i + n])
                    if ids:
                        span = normalized.original_span(start + i, start + i + n)
                        out.update(SecretSpan(*span, j) for j in ids)


#: The kinds of ``re.error`` messages, without what follows them: ``error.msg`` quotes parts of the
#: pattern (group names, escapes, character ranges), i.e. of the secret.
REGEX_ERROR_KINDS = (
    "redefinition of group name", "unknown group name", "bad character in group name", "missing group name",
    "bad escape", "bad character range", "unterminated character set", "unterminated name",
    "unterminated subpattern", "unbalanced parenthesis", "nothing to repeat", "multiple repeat",
    "unknown extension", "look-behind requires fixed-width pattern", "cannot refer to an open group",
    "invalid group reference", "global flags not at the start", "bad inline flags", "unknown flag",
    "missing flag", "missing -, : or )", "missing )", "missing :", "missing ), unterminated comment",
    "the repetition number is too large", "min repeat greater than max repeat", "octal escape value",
    "incomplete escape", "cannot refer to group defined in the same lookbehind subpattern",
    "conditional backref with more than two branches", "expected",
)


def regex_error_kind(error: re.error) -> str:
    """What kind of syntax error ``error`` is, in words that never quote the pattern."""
    message = str(error.msg)
    for kind in REGEX_ERROR_KINDS:
        if message.startswith(kind):
            return kind
    return "invalid syntax"


def compile_pattern(index: int, pattern: str | re.Pattern[str], flags: int) -> re.Pattern[str]:
    """``pattern`` compiled with ``flags``; errors name the secret, never the pattern."""
    if isinstance(pattern, re.Pattern):
        flags, pattern = pattern.flags | flags, pattern.pattern
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"pattern of secret #{index} must be a non-empty string")
    try:
        return re.compile(pattern, flags)
    except re.error as error:
        raise ValueError(
            f"pattern of secret #{index} is not a valid regular expression: "
            f"{regex_error_kind(error)} at position {error.pos}"
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
