"""Character spans of tagged secrets: the one adapter between ``hush_hf.secrets`` and redaction.

Redaction masks exactly what tagging marks: spans come from the secrets' own tagger
(:meth:`hush_hf.secrets.Tagger.spans`, the rules of :mod:`hush_hf.secrets.matching`: every run of words
that spells a term, whatever separates or disguises them), with offsets into the original text.
Redaction still re-tags every masked text and masks it whole if a secret is found again (never a
silent miss).
"""

from __future__ import annotations

from typing import NamedTuple

from hush_hf.secrets import SecretSet
from hush_hf.secrets.taggers import tagger_for


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
        self._tagger = tagger_for(secret_set, case_sensitive=case_sensitive)

    def __call__(self, text: str) -> list[Span]:
        return [Span(span.start, span.end, "secrets") for span in self._tagger.spans(text)]


def merge_spans(spans: list[Span]) -> list[tuple[int, int]]:
    """Overlapping or touching spans merged into disjoint ``(start, end)`` intervals, in order."""
    merged: list[list[int]] = []
    for start, end, _ in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]
