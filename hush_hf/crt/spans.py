"""Character spans of tagged secrets: the one adapter between ``hush_hf.secrets`` and redaction.

The secrets' taggers answer *which* secrets a text contains, not *where*. Until ``hush_hf.secrets``
exposes spans itself, this module finds them with the taggers' own matching rules, so redaction
masks what tagging marks:

- a term matches whole words after :func:`hush_hf.secrets.words.normalize_text` (case folding,
  NFKC, marks and format characters removed); each raw ``\\w+`` word of the text is normalised on its
  own and keeps its raw character span, a phrase spans from its first to its last word;
- a pattern is searched on the raw text (``re.IGNORECASE`` unless case-sensitive), every match.

Normalising word by word can differ from normalising the whole text (a soft hyphen splits a raw word
but joins the normalised one), so :func:`secret_spans` is checked by re-tagging: redaction masks a
whole text when the tagger still finds a secret after its spans are masked (never a silent miss).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from hush_hf.secrets import SecretSet
from hush_hf.secrets.words import WORD_PATTERN, normalize_text, words


class Span(NamedTuple):
    """Characters ``text[start:end]`` found by ``source`` (a policy name; never the matched text)."""

    start: int
    end: int
    source: str


class SecretSpanFinder:
    """``finder(text) -> list[Span]``: where the secrets of ``secret_set`` occur in ``text``."""

    def __init__(self, secret_set: SecretSet, *, case_sensitive: bool = False) -> None:
        if not isinstance(secret_set, SecretSet):
            raise ValueError(f"secret_set must be a SecretSet, got a {type(secret_set).__name__}")
        self.case_sensitive = case_sensitive
        phrases: dict[tuple[str, ...], None] = {}
        patterns: list[re.Pattern[str]] = []
        flags = 0 if case_sensitive else re.IGNORECASE
        for secret in secret_set:
            terms = secret.terms or (() if secret.pattern is not None else (secret.name,))
            for term in terms:
                tokens = tuple(words(term, case_sensitive=case_sensitive))
                if tokens:
                    phrases[tokens] = None
            if secret.pattern is not None:
                patterns.append(re.compile(secret.pattern, flags))
        self._by_first: dict[str, set[int]] = {}
        self._phrases = set(phrases)
        for phrase in self._phrases:
            self._by_first.setdefault(phrase[0], set()).add(len(phrase))
        self._patterns = tuple(patterns)

    def _words(self, text: str) -> list[tuple[str, int, int]]:
        """Normalised words with the raw span of the word they come from."""
        out = []
        for match in WORD_PATTERN.finditer(text):
            for token in WORD_PATTERN.findall(
                normalize_text(match.group(), case_sensitive=self.case_sensitive)
            ):
                out.append((token, match.start(), match.end()))
        return out

    def __call__(self, text: str) -> list[Span]:
        spans: list[Span] = []
        tokens = self._words(text)
        names = [t for t, _, _ in tokens]
        for k, (token, start, _) in enumerate(tokens):
            for n in self._by_first.get(token, ()):
                if tuple(names[k : k + n]) in self._phrases:
                    spans.append(Span(start, tokens[k + n - 1][2], "secrets"))
        for pattern in self._patterns:
            spans.extend(
                Span(m.start(), m.end(), "secrets") for m in pattern.finditer(text) if m.end() > m.start()
            )
        return spans


def merge_spans(spans: list[Span]) -> list[tuple[int, int]]:
    """Overlapping or touching spans merged into disjoint ``(start, end)`` intervals, in order."""
    merged: list[list[int]] = []
    for start, end, _ in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]
