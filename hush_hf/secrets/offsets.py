"""Texts derived from a text, and where each of their characters came from in it."""

from __future__ import annotations

import numpy as np


class Normalized:
    """A normalised text and, per character k, the original span ``[starts[k], ends[k])`` it came from.

    ``starts``/``ends`` are ``None`` when the text is unchanged in length and position (the common,
    ASCII case): then character k came from original character k.
    """

    __slots__ = ("ends", "starts", "text")

    def __init__(self, text: str, starts: np.ndarray | None = None, ends: np.ndarray | None = None) -> None:
        self.text = text
        self.starts = starts
        self.ends = ends

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """The original span behind normalised characters ``[start, end)`` (``end > start``)."""
        if self.starts is None or self.ends is None:
            return start, end
        return int(self.starts[start]), int(self.ends[end - 1])

    def then(self, later: Normalized) -> Normalized:
        """``later`` (a normalisation of ``self.text``) with offsets into the original text."""
        if later.starts is None or later.ends is None:
            return Normalized(later.text, self.starts, self.ends)
        if self.starts is None or self.ends is None:
            return later
        if later.starts.size == 0:
            return Normalized(later.text, later.starts, later.ends)
        return Normalized(later.text, self.starts[later.starts], self.ends[later.ends - 1])


def from_pieces(text: str, pieces: list[tuple[int, int, str]]) -> Normalized:
    """``text`` with the non-overlapping, sorted replacements ``(start, end, new)`` applied."""
    if not pieces:
        return Normalized(text)
    out: list[str] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    position = 0
    for start, end, new in pieces:
        if start > position:
            out.append(text[position:start])
            kept = np.arange(position, start)
            starts.append(kept)
            ends.append(kept + 1)
        out.append(new)
        starts.append(np.full(len(new), start))
        ends.append(np.full(len(new), end))
        position = end
    if position < len(text):
        out.append(text[position:])
        kept = np.arange(position, len(text))
        starts.append(kept)
        ends.append(kept + 1)
    return Normalized(
        "".join(out), np.concatenate(starts).astype(np.int64), np.concatenate(ends).astype(np.int64)
    )
