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

from hush_hf.secrets.matching import (
    SecretSpan,
    TermIndex,
    compile_pattern,
    pattern_spans,
    text_variants,
)
from hush_hf.secrets.normalize import readings
from hush_hf.secrets.secret_set import SecretSet


def check_secret_index(owner: str, index: object) -> int:
    """``index`` as a non-negative int (the value is shown only when it is an integer)."""
    if isinstance(index, bool) or not isinstance(index, numbers.Integral):
        kind = type(index).__name__
        raise ValueError(f"{owner}: secret index must be a non-negative integer, got a {kind}")
    if index < 0:
        raise ValueError(f"{owner}: secret index must be a non-negative integer, got {int(index)}")
    return int(index)


class Tagger(ABC):
    """Maps a text to the indices of the secrets it contains (and, for most taggers, where)."""

    secret_set_fingerprint: str | None = None  # set by tagger_for; tag_dataset records it

    @abstractmethod
    def __call__(self, text: str) -> set[int]:
        """The indices of the secrets that ``text`` contains."""

    def spans(self, text: str) -> list[SecretSpan]:
        """Every occurrence ``(start, end, secret)`` in ``text``, sorted (character offsets of ``text``).

        Needed to carry secrets onto tokens (:func:`hush_hf.secrets.mark_secrets`); a tagger that only
        knows *which* secrets a text holds cannot do that.
        """
        raise ValueError(
            f"{type(self).__name__} gives no positions, so its secrets cannot be carried onto tokens; "
            "tag the text column with tag_dataset instead"
        )

    def batch_spans(self, texts: Sequence[str]) -> list[list[SecretSpan]]:
        """:meth:`spans` of each text, the texts read one after the other (as ``group_texts`` and
        packing concatenate a ``datasets.map`` batch): an occurrence spanning rows adds to each of them
        the part it holds. This base version finds occurrences within rows only."""
        return [self.spans(text) for text in texts]

    @property
    def secret_indices(self) -> frozenset[int] | None:
        """Every index this tagger can return, or ``None`` when unknown in advance."""
        return None

    def __repr__(self) -> str:
        known = self.secret_indices
        return f"{type(self).__name__}({'?' if known is None else len(known)} secrets)"


class TermTagger(Tagger):
    """Marks a text with secret j where one of j's terms occurs (rules: :mod:`hush_hf.secrets.matching`).

    A term occurs wherever a run of whole words of the text spells it once escapes, case (unless
    ``case_sensitive``), accents, digit scripts, TR39 confusables and every separator are set aside
    (``Project NightJar``, ``projectnightjar``, ``p r o j e c t``, ``7,741``, ``faIcon``), plural endings
    included. Cost per text is linear in its number of words, independent of the number of terms (dict
    look-ups, no alternation regex).
    """

    def __init__(self, terms: Mapping[int, Sequence[str]], *, case_sensitive: bool = False) -> None:
        if not isinstance(terms, Mapping):
            raise ValueError(
                f"TermTagger: terms must be a mapping secret index -> terms, got a {type(terms).__name__}"
            )
        checked: dict[int, list[str]] = {}
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
            checked[index] = secret_terms
        try:
            self._index = TermIndex(checked, case_sensitive=case_sensitive)
        except ValueError as error:
            raise ValueError(f"TermTagger: {error}") from None
        self.case_sensitive = case_sensitive
        self._indices = frozenset(checked)

    @property
    def secret_indices(self) -> frozenset[int]:
        return self._indices

    def spans(self, text: str) -> list[SecretSpan]:
        found: set[SecretSpan] = set()
        for reading in readings(text):
            self._index.spans(reading, found)
        return sorted(found)

    def batch_spans(self, texts: Sequence[str]) -> list[list[SecretSpan]]:
        """Terms read across rows too: the rows' words (decoded readings) are matched as one sequence;
        raw readings of rows with escapes are matched row by row."""
        found: list[set[SecretSpan]] = [set() for _ in texts]
        rows = [readings(text) for text in texts]
        self._index.joined_spans([variants[0] for variants in rows], found)
        for out, variants in zip(found, rows, strict=True):
            for variant in variants[1:]:
                self._index.spans(variant, out)
        return [sorted(out) for out in found]

    def __call__(self, text: str) -> set[int]:
        return {span.secret for span in self.spans(text)}


class RegexTagger(Tagger):
    """Marks a text with secret j where ``patterns[j]`` matches.

    Each pattern is searched in the raw text and, unless ``raw`` (for every pattern) or the secret's
    index is in ``raw_indices``, also in the normalised text (escapes decoded, NFKC, marks and format
    characters dropped, confusables replaced, line-break hyphenation joined: see
    :mod:`hush_hf.secrets.normalize`), so that ``Fal&shy;con`` or ``Fal%63on`` still match. ``flags``
    (e.g. ``re.IGNORECASE``) are added to every pattern. Cost is one search per pattern and variant
    per text: meant for a few structured secrets (keys, account numbers), not for word lists.
    """

    def __init__(
        self,
        patterns: Mapping[int, str | re.Pattern[str]],
        *,
        flags: int = 0,
        raw: bool = False,
        raw_indices: Iterable[int] = (),
    ) -> None:
        if not isinstance(patterns, Mapping):
            raise ValueError(
                "RegexTagger: patterns must be a mapping secret index -> pattern, "
                f"got a {type(patterns).__name__}"
            )
        raw_set = set(raw_indices)
        compiled = []
        for key, pattern in patterns.items():
            index = check_secret_index("RegexTagger", key)
            try:
                compiled.append((index, compile_pattern(index, pattern, flags), raw or index in raw_set))
            except ValueError as error:
                raise ValueError(f"RegexTagger: {error}") from None
        self._compiled = tuple(compiled)
        self._indices = frozenset(index for index, _, _ in compiled)
        self._normalises = not all(r for _, _, r in compiled)

    @property
    def secret_indices(self) -> frozenset[int]:
        return self._indices

    def spans(self, text: str) -> list[SecretSpan]:
        variants = text_variants(text) if self._normalises else []
        return sorted(pattern_spans(self._compiled, text, variants))

    def __call__(self, text: str) -> set[int]:
        return {span.secret for span in self.spans(text)}


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

    def spans(self, text: str) -> list[SecretSpan]:
        found: set[SecretSpan] = set()
        for tagger in self.taggers:
            found.update(tagger.spans(text))
        return sorted(found)

    def batch_spans(self, texts: Sequence[str]) -> list[list[SecretSpan]]:
        found: list[set[SecretSpan]] = [set() for _ in texts]
        for tagger in self.taggers:
            for out, spans in zip(found, tagger.batch_spans(texts), strict=True):
                out.update(spans)
        return [sorted(out) for out in found]


def tagger_for(secret_set: SecretSet, case_sensitive: bool = False) -> Tagger:
    """The tagger a :class:`SecretSet` describes: each secret's terms and pattern.

    A secret with neither terms nor pattern is marked by its name, taken as a term. With
    ``case_sensitive=False`` terms are matched after case folding and patterns with
    ``re.IGNORECASE`` (more matches, never fewer: see the module docstring). A secret with
    ``raw_pattern=True`` has its pattern searched in the raw text only.
    """
    if not isinstance(secret_set, SecretSet):
        raise ValueError(f"tagger_for: secret_set must be a SecretSet, got a {type(secret_set).__name__}")
    terms: dict[int, tuple[str, ...]] = {}
    patterns: dict[int, str] = {}
    raw = [j for j, secret in enumerate(secret_set) if secret.raw_pattern]
    for j, secret in enumerate(secret_set):
        if secret.terms:
            terms[j] = secret.terms
        elif secret.pattern is None:  # its name spells a word: checked by Secret
            terms[j] = (secret.name,)
        if secret.pattern is not None:
            patterns[j] = secret.pattern
    taggers: list[Tagger] = []
    if terms:
        taggers.append(TermTagger(terms, case_sensitive=case_sensitive))
    if patterns:
        taggers.append(RegexTagger(patterns, flags=0 if case_sensitive else re.IGNORECASE, raw_indices=raw))
    tagger = taggers[0] if len(taggers) == 1 else UnionTagger(taggers)
    tagger.secret_set_fingerprint = secret_set.fingerprint  # recorded by tag_dataset
    return tagger
