"""A text as words: keys, glyph readings, plain keys and original offsets of each word.

The rules (what a word is, what its keys are) are :mod:`hush_hf.secrets.matching`'s; this module applies
them. :class:`PieceWords` gives the same words as :func:`split_words` faster on texts read as written:
a space is a separator that no rule looks across (the word patterns' look-aheads see a space as they see
the end of the text), so a text's words are the words of its space-separated pieces, and each distinct
piece is split once.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate, chain
from operator import itemgetter
from typing import NamedTuple

from hush_hf.secrets.normalize import EXACT, GLYPHS, KEYS, KINDS, MIXED, PLAIN, PLAIN_EXACT, Normalized

# Words on the string of character kinds (normalize.KINDS: u upper, l lower, s the letter s, d digit,
# o caseless letter, x a word alone, m transparent, space separator): an acronym's plural (KBs), an
# acronym before a capitalised word (HTML|Parser), a capitalised or lower-case word, an all-caps word, a
# number, a caseless run, a lone character.
_WORD_SPLIT = re.compile(
    r"((?:um*){2,}sm*(?![lsm])|(?:um*)+(?=um*[ls])|(?:um*)?(?:[ls]m*)+|(?:um*)+|(?:dm*)+|(?:om*)+|xm*)"
)
_WORD_SPLIT_NO_MARKS = re.compile(r"(u{2,}s(?![ls])|u+(?=u[ls])|u?[ls]+|u+|d+|o+|x)")  # the same, no m
# The same on ASCII text itself (KINDS of ASCII: A-Z u, a-z l but s, 0-9 d, | x, the rest separators).
_WORD_WITH_I = re.compile(r"[^\0]*I[^\0]*")  # in words joined by \0: a word holding a capital I
_SQL_CONCATENATION = re.compile(r"\|{2,}")  # || joins strings (SQL): an operator, not the letters ll
_ASCII_WORD_SPLIT = re.compile(r"([A-Z]{2,}s(?![a-z])|[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+|\|)")

class Words(NamedTuple):
    """A text split into words: their keys (case reading), their other readings where different (else
    ``None``: the glyph reading, and for a word mixing scripts the mixed reading, see
    :func:`hush_hf.secrets.normalize.mixed_reading`), plain keys (no prototypes; only when asked), and
    original spans ``[starts[k], ends[k])``."""

    keys: list[str]
    glyphs: list[tuple[str, ...] | None] | None
    plain: list[str] | None
    starts: Sequence[int]
    ends: Sequence[int]


def split_words(normalized: Normalized, *, case_sensitive: bool = False, plain: bool = False) -> Words:
    """The words of ``normalized.text`` with their keys and original offsets (rules: module docstring)."""
    text = normalized.text
    if "||" in text:  # same length: offsets unchanged
        text = _SQL_CONCATENATION.sub(lambda m: " " * len(m.group()), text)
    if text.isascii():
        parts = _ASCII_WORD_SPLIT.split(text)
        pieces = "\0".join(parts[1::2])  # \0 is a separator: never in a word
    else:
        kinds = KINDS.translate(text)
        parts = (_WORD_SPLIT if "m" in kinds else _WORD_SPLIT_NO_MARKS).split(kinds)
        pieces = None
    if len(parts) == 1:
        return Words([], None, [] if plain else None, [], [])
    bounds = list(accumulate(map(len, parts)))
    starts = bounds[0:-1:2]
    ends = bounds[1::2]
    if pieces is None:
        pieces = "\0".join([text[s:e] for s, e in zip(starts, ends, strict=True)])
    keyed = (EXACT if case_sensitive else KEYS).translate(pieces)
    keys = keyed.split("\0")
    glyphs = None
    if case_sensitive:
        pass
    elif pieces.isascii():  # only words with a capital I read two ways: visit those alone
        if "I" in pieces:
            glyphs = [None] * len(keys)
            for match in _WORD_WITH_I.finditer(pieces):
                k = pieces.count("\0", 0, match.start())
                glyph = GLYPHS.translate(match.group())
                glyphs[k] = (glyph,) if glyph != keys[k] else None
    else:
        alternatives = GLYPHS.translate(pieces)
        if alternatives != keyed:
            mixed = MIXED.translate(pieces).split("\0")
            glyphs = [
                tuple(dict.fromkeys(r for r in (g, m) if r != k)) or None
                for k, g, m in zip(keys, alternatives.split("\0"), mixed, strict=True)
            ]
    plain_keys = (PLAIN_EXACT if case_sensitive else PLAIN).translate(pieces).split("\0") if plain else None
    if normalized.starts is not None and normalized.ends is not None:
        starts = normalized.starts[starts].tolist()
        ends = normalized.ends[[e - 1 for e in ends]].tolist()
    return Words(keys, glyphs, plain_keys, starts, ends)


def join_words(rows: Sequence[Words]) -> tuple[Words, list[int]]:
    """The words of several texts read one after the other, and the first word of each text (plus the
    end); the offsets of a word stay those into its own text."""
    firsts = [0, *accumulate(len(words.keys) for words in rows)]
    keys = list(chain.from_iterable(words.keys for words in rows))
    glyphs = None
    if any(words.glyphs is not None for words in rows):
        glyphs = [g for words in rows for g in (words.glyphs or [None] * len(words.keys))]
    plain = None if any(words.plain is None for words in rows) else [p for w in rows for p in w.plain]
    starts = _Joined([words.starts for words in rows], firsts)
    ends = _Joined([words.ends for words in rows], firsts)
    return Words(keys, glyphs, plain, starts, ends), firsts


class _Joined(Sequence[int]):
    """The offsets of the words of several texts read one after the other: word k is word
    ``k - firsts[r]`` of text ``r = bisect_right(firsts, k) - 1``, its offset one into text r."""

    __slots__ = ("_firsts", "_rows")

    def __init__(self, rows: list[Sequence[int]], firsts: list[int]) -> None:
        self._rows, self._firsts = rows, firsts

    def __len__(self) -> int:
        return self._firsts[-1]

    def __getitem__(self, k):  # noqa: ANN001, ANN204 (an int or a slice, as for a list)
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if not 0 <= k < len(self):
            k = range(len(self))[k]  # a negative index counted from the end, or IndexError
        row = bisect_right(self._firsts, k) - 1
        return self._rows[row][k - self._firsts[row]]


# The words of one space-separated piece, as a plain tuple (the garbage collector stops tracking a
# tuple of strings, numbers and such tuples; a NamedTuple it tracks for ever): its keys, its glyph
# readings (None for each word when no word of it reads two ways), whether one does, its plain keys
# (or None), the words' starts and ends in the piece, and len(keys) << SHIFT | len(piece) + 1 (the piece
# and its space; see PieceOffsets).
_Piece = tuple
_KEYS, _GLYPHS, _TWO_WAYS, _PLAIN, _STARTS, _ENDS, _PACKED = range(7)
_KEYS_OF, _GLYPHS_OF, _TWO_WAYS_OF, _PLAIN_OF = map(itemgetter, (_KEYS, _GLYPHS, _TWO_WAYS, _PLAIN))
_PACKED_OF = itemgetter(_PACKED)
SHIFT = 48  # a text of fewer than 2**48 characters: word counts and character counts summed as one int
MASK = (1 << SHIFT) - 1


class PieceWords(dict):
    """:func:`split_words` of texts read as written (no offsets to map back), from a cache of the words
    of each space-separated piece (``dict`` piece -> its words, filled on first use).

    The cache holds at most ``size`` pieces of at most ``longest`` characters; others are split each time
    (the words are the same, only slower). Per text the work left is a few C-level passes over its
    pieces: no regular expression and no translation of characters already seen; word offsets are worked
    out only for the words asked for (:class:`PieceOffsets`).
    """

    def __init__(self, *, case_sensitive: bool, plain: bool, size: int = 100_000, longest: int = 64) -> None:
        super().__init__()
        self.case_sensitive, self.plain, self.size, self.longest = case_sensitive, plain, size, longest

    def __missing__(self, piece: str) -> _Piece:
        words = split_words(Normalized(piece), case_sensitive=self.case_sensitive, plain=self.plain)
        glyphs = words.glyphs or [None] * len(words.keys)
        value = (
            tuple(words.keys),
            tuple(glyphs),
            any(g is not None for g in glyphs),
            None if words.plain is None else tuple(words.plain),
            tuple(words.starts),
            tuple(words.ends),
            len(words.keys) << SHIFT | len(piece) + 1,
        )
        if len(self) < self.size and len(piece) <= self.longest:
            self[piece] = value
        return value

    def split(self, text: str) -> Words:
        """The words of ``text`` (offsets into ``text``), as ``split_words(Normalized(text))`` gives them."""
        found = list(map(self.__getitem__, text.split(" ")))
        keys = list(chain.from_iterable(map(_KEYS_OF, found)))
        # of ASCII characters only the capital I reads two ways (see split_words)
        two_ways = "I" in text if text.isascii() else any(map(_TWO_WAYS_OF, found))
        glyphs = list(chain.from_iterable(map(_GLYPHS_OF, found))) if two_ways else None
        plain = list(chain.from_iterable(map(_PLAIN_OF, found))) if self.plain else None
        offsets = PieceOffsets(found, len(keys))
        return Words(keys, glyphs, plain, offsets, offsets.ends)


def occurrences(words: Words, runs: list[tuple[int, int, tuple[int, ...]]]) -> list[tuple[int, int, int]]:
    """``(start, end, secret)`` of each run ``(a, b, secrets)`` of ``words`` and each of its secrets:
    from the start of word a to the end of word b."""
    if isinstance(words.starts, PieceOffsets):
        return words.starts.occurrences(runs)
    starts, ends = words.starts, words.ends
    return [(starts[a], ends[b], j) for a, b, ids in runs for j in ids]


class PieceOffsets(Sequence[int]):
    """Where each word of a text split into pieces starts (this sequence) and ends (:attr:`ends`) in
    the text, worked out per word asked for.

    One running sum over the pieces says, before each piece p, how many words and how many characters
    (pieces and their spaces) come first: ``before[p] = words << SHIFT | characters``, increasing in
    both. Word k lies in the last piece with at most k words before it, ``p = bisect_left(before,
    (k + 1) << SHIFT) - 1``, as its word ``k - (before[p] >> SHIFT)``; the piece starts at character
    ``before[p] & MASK``. The sums are filled in on first use, in a list :attr:`ends` shares (no
    reference cycle: a text's offsets are freed with it, not left to the garbage collector).
    """

    __slots__ = ("_before", "_found", "_size", "ends")

    def __init__(self, found: list[_Piece], size: int) -> None:
        self._found, self._size = found, size
        self._before: list[int] = []
        self.ends = _Ends(found, size, self._before)

    def __len__(self) -> int:
        return self._size

    def locate(self, k: int) -> tuple[int, _Piece, int]:
        """Where the piece holding word ``k`` starts, the piece, and the index of the word in it."""
        return _locate(self._found, self._before, k)

    def _sums(self) -> list[int]:
        return _sums(self._found, self._before)

    def __getitem__(self, k):  # noqa: ANN001, ANN204 (an int or a slice, as for a list)
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._size))]
        if not 0 <= k < self._size:
            k = range(self._size)[k]  # a negative index counted from the end, or IndexError
        first, piece, within = self.locate(k)
        return first + piece[_STARTS][within]

    def occurrences(self, runs: list[tuple[int, int, tuple[int, ...]]]) -> list[tuple[int, int, int]]:
        """:func:`occurrences` of ``runs`` (what :meth:`locate` does, inlined)."""
        before, found = self._before or self._sums(), self._found
        out: list[tuple[int, int, int]] = []
        add = out.append
        for a, b, ids in runs:
            p = bisect_left(before, (a + 1) << SHIFT) - 1
            first = before[p]
            start = (first & MASK) + found[p][_STARTS][a - (first >> SHIFT)]
            if b != a:
                p = bisect_left(before, (b + 1) << SHIFT) - 1
                first = before[p]
            end = (first & MASK) + found[p][_ENDS][b - (first >> SHIFT)]
            for j in ids:
                add((start, end, j))
        return out


def _sums(found: list[_Piece], before: list[int]) -> list[int]:
    """``before`` (see :class:`PieceOffsets`), filled in place if still empty."""
    if not before:
        before += accumulate(map(_PACKED_OF, found), initial=0)
    return before


def _locate(found: list[_Piece], before: list[int], k: int) -> tuple[int, _Piece, int]:
    before = _sums(found, before)
    p = bisect_left(before, (k + 1) << SHIFT) - 1
    return before[p] & MASK, found[p], k - (before[p] >> SHIFT)


class _Ends(Sequence[int]):
    """The ends of the words of :class:`PieceOffsets`."""

    __slots__ = ("_before", "_found", "_size")

    def __init__(self, found: list[_Piece], size: int, before: list[int]) -> None:
        self._found, self._size, self._before = found, size, before

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, k):  # noqa: ANN001, ANN204
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if not 0 <= k < len(self):
            k = range(len(self))[k]
        first, piece, within = _locate(self._found, self._before, k)
        return first + piece[_ENDS][within]
