"""Taggers: which secrets does a text contain? (Hush, Sec. 3: the examples D_j of secret j.)

A tagger maps one text to the set of secret indices it contains. Tagging errs towards marking
*more* examples: an example wrongly marked costs some utility, an example wrongly left out
leaves its secret unprotected.
"""

from __future__ import annotations

import numbers
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain

from hush_hf.secrets.secret_set import SecretSet
from hush_hf.secrets.words import words


def check_secret_index(owner: str, index: object) -> int:
    """``index`` as a non-negative int (the value is shown only when it is an integer)."""
    if isinstance(index, bool) or not isinstance(index, numbers.Integral):
        kind = type(index).__name__
        raise ValueError(f"{owner}: secret index must be a non-negative integer, got a {kind}")
    if index < 0:
        raise ValueError(f"{owner}: secret index must be a non-negative integer, got {int(index)}")
    return int(index)


class Tagger(ABC):
    """Maps a text to the indices of the secrets it contains."""

    @abstractmethod
    def __call__(self, text: str) -> set[int]:
        """The indices of the secrets that ``text`` contains."""

    @property
    def secret_indices(self) -> frozenset[int] | None:
        """Every index this tagger can return, or ``None`` when unknown in advance."""
        return None

    def __repr__(self) -> str:
        known = self.secret_indices
        return f"{type(self).__name__}({'?' if known is None else len(known)} secrets)"


class TermTagger(Tagger):
    """Marks a text with secret j when one of j's terms occurs in it as whole words.

    Text and terms are split by :func:`hush_hf.secrets.words.words`. A one-word term is a dict
    lookup of the text's distinct words; a phrase of n words is looked up as the n-gram starting at
    each occurrence of its first word. Cost per text is linear in its length, independent of the
    number of terms (an alternation regex of 100k terms would try each at every position).
    """

    def __init__(self, terms: Mapping[int, Sequence[str]], *, case_sensitive: bool = False) -> None:
        if not isinstance(terms, Mapping):
            raise ValueError(
                f"TermTagger: terms must be a mapping secret index -> terms, got a {type(terms).__name__}"
            )
        single: dict[str, set[int]] = {}
        phrases: dict[tuple[str, ...], set[int]] = {}
        for key, secret_terms in terms.items():
            index = check_secret_index("TermTagger", key)
            if isinstance(secret_terms, str) or not isinstance(secret_terms, Iterable):
                raise ValueError(
                    f"TermTagger: terms of secret #{index} must be a list of strings, "
                    f"got a {type(secret_terms).__name__}"
                )
            secret_terms = list(secret_terms)
            if not secret_terms:
                raise ValueError(f"TermTagger: secret #{index} has no terms")
            for k, term in enumerate(secret_terms):
                if not isinstance(term, str):
                    raise ValueError(
                        f"TermTagger: term {k} of secret #{index} must be a string, "
                        f"got a {type(term).__name__}"
                    )
                tokens = words(term, case_sensitive=case_sensitive)
                if not tokens:
                    raise ValueError(f"TermTagger: term {k} of secret #{index} contains no word characters")
                if len(tokens) == 1:
                    single.setdefault(tokens[0], set()).add(index)
                else:
                    phrases.setdefault(tuple(tokens), set()).add(index)
        self.case_sensitive = case_sensitive
        self._single = {word: tuple(sorted(ids)) for word, ids in single.items()}
        self._phrases = {phrase: tuple(sorted(ids)) for phrase, ids in phrases.items()}
        lengths: dict[str, set[int]] = {}
        for phrase in phrases:
            lengths.setdefault(phrase[0], set()).add(len(phrase))
        self._phrase_lengths = {first: tuple(sorted(n)) for first, n in lengths.items()}
        self._indices = frozenset(check_secret_index("TermTagger", key) for key in terms)

    @property
    def secret_indices(self) -> frozenset[int]:
        return self._indices

    def __call__(self, text: str) -> set[int]:
        tokens = words(text, case_sensitive=self.case_sensitive)
        distinct = set(tokens)
        # One dict probe per distinct word, all at C speed.
        found = set(chain.from_iterable(filter(None, map(self._single.get, distinct))))
        if self._phrase_lengths and not self._phrase_lengths.keys().isdisjoint(distinct):
            for start, word in enumerate(tokens):
                for n in self._phrase_lengths.get(word, ()):
                    hit = self._phrases.get(tuple(tokens[start : start + n]))
                    if hit:
                        found.update(hit)
        return found


class RegexTagger(Tagger):
    """Marks a text with secret j when ``re.search(patterns[j], text)`` finds a match.

    Patterns apply to the raw text (no normalisation); ``flags`` (e.g. ``re.IGNORECASE``) are added
    to every pattern. Cost is one search per pattern per text: meant for a few structured secrets
    (keys, account numbers), not for large word lists (use :class:`TermTagger`).
    """

    def __init__(self, patterns: Mapping[int, str | re.Pattern[str]], *, flags: int = 0) -> None:
        if not isinstance(patterns, Mapping):
            raise ValueError(
                "RegexTagger: patterns must be a mapping secret index -> pattern, "
                f"got a {type(patterns).__name__}"
            )
        compiled = []
        for key, pattern in patterns.items():
            index = check_secret_index("RegexTagger", key)
            if isinstance(pattern, re.Pattern):
                pattern_flags, pattern = pattern.flags, pattern.pattern
            else:
                pattern_flags = 0
            if not isinstance(pattern, str) or not pattern:
                raise ValueError(f"RegexTagger: pattern of secret #{index} must be a non-empty string")
            try:
                compiled.append((index, re.compile(pattern, pattern_flags | flags)))
            except re.error as error:
                # error.msg and error.pos only: str(error) could be extended to quote the pattern.
                raise ValueError(
                    f"RegexTagger: pattern of secret #{index} is not a valid regular expression: "
                    f"{error.msg} at position {error.pos}"
                ) from None
        self._compiled = tuple(compiled)
        self._indices = frozenset(index for index, _ in compiled)

    @property
    def secret_indices(self) -> frozenset[int]:
        return self._indices

    def __call__(self, text: str) -> set[int]:
        return {index for index, pattern in self._compiled if pattern.search(text)}


class CallableTagger(Tagger):
    """Wraps ``fn(text) -> Iterable[int]``; each returned id must be a non-negative integer.

    ``fn`` must be picklable to run with ``tag_dataset(num_proc=...)`` (datasets uses dill, so
    lambdas and closures work).
    """

    def __init__(self, fn: Callable[[str], Iterable[int]]) -> None:
        if not callable(fn):
            raise ValueError(f"CallableTagger: fn must be callable, got a {type(fn).__name__}")
        self.fn = fn

    def __call__(self, text: str) -> set[int]:
        ids = self.fn(text)
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise ValueError(
                f"CallableTagger: fn must return an iterable of secret indices, got a {type(ids).__name__}"
            )
        return {check_secret_index("CallableTagger", index) for index in ids}


class UnionTagger(Tagger):
    """Marks a text with every secret that any of its taggers finds."""

    def __init__(self, taggers: Iterable[Tagger]) -> None:
        flat: list[Tagger] = []
        for k, tagger in enumerate(taggers):
            if not isinstance(tagger, Tagger):
                raise ValueError(
                    f"UnionTagger: tagger {k} must be a Tagger (wrap functions in CallableTagger), "
                    f"got a {type(tagger).__name__}"
                )
            flat.extend(tagger.taggers if isinstance(tagger, UnionTagger) else [tagger])
        if not flat:
            raise ValueError("UnionTagger: needs at least one tagger, got none")
        self.taggers = tuple(flat)

    @property
    def secret_indices(self) -> frozenset[int] | None:
        known = [tagger.secret_indices for tagger in self.taggers]
        return None if any(k is None for k in known) else frozenset().union(*known)

    def __call__(self, text: str) -> set[int]:
        found: set[int] = set()
        for tagger in self.taggers:
            found |= tagger(text)
        return found


def tagger_for(secret_set: SecretSet, case_sensitive: bool = False) -> Tagger:
    """The tagger a :class:`SecretSet` describes: each secret's terms and pattern.

    A secret with neither terms nor pattern is marked by its name, taken as a term. With
    ``case_sensitive=False`` terms are matched after case folding and patterns with
    ``re.IGNORECASE`` (more matches, never fewer: see the module docstring).
    """
    if not isinstance(secret_set, SecretSet):
        raise ValueError(f"tagger_for: secret_set must be a SecretSet, got a {type(secret_set).__name__}")
    terms: dict[int, tuple[str, ...]] = {}
    patterns: dict[int, str] = {}
    for j, secret in enumerate(secret_set):
        if secret.terms:
            terms[j] = secret.terms
        elif secret.pattern is None:
            if not words(secret.name, case_sensitive=True):
                raise ValueError(
                    f"tagger_for: secret #{j} has no terms or pattern and its name contains no word "
                    "characters, so no example could ever be marked with it"
                )
            terms[j] = (secret.name,)
        if secret.pattern is not None:
            patterns[j] = secret.pattern
    taggers: list[Tagger] = []
    if terms:
        taggers.append(TermTagger(terms, case_sensitive=case_sensitive))
    if patterns:
        taggers.append(RegexTagger(patterns, flags=0 if case_sensitive else re.IGNORECASE))
    return taggers[0] if len(taggers) == 1 else UnionTagger(taggers)
