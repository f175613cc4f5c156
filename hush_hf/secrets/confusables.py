"""Unicode TR39 confusables: the prototype each look-alike character stands for.

Unicode's ``confusables.txt`` (UTS #39, Sec. 4) maps every character that can be mistaken for another to
a *prototype* (``Ａ``, ``А`` and ``Α`` to ``A``, ``I``, ``1`` and ``|`` to ``l``, ``m`` to ``rn``); the
*skeleton* of a string is the string of its prototypes, and two strings are confusable when their
skeletons are equal. The data is the ``confusables.txt`` that the ``confusable-homoglyphs`` package
ships (generated from Unicode's file, as a symmetric table of look-alike pairs). In that file every source
is one code point and no prototype is itself a source, so the single-character pairs form stars around
their prototype: the prototype of a character is the centre of its star (the one member linked to all
others; of a pair, the ASCII member, else the lower code point, which gives the same equalities).
Sources whose prototype has several characters (``m`` -> ``rn``) are kept as such.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

_BIDI_MARKS = str.maketrans("", "", "\u200e\u200f")  # the table shows right-to-left characters between marks


@cache
def prototypes() -> dict[str, str]:
    """``{character: prototype}`` for every source character of ``confusables.txt`` (never identity)."""
    path = resources.files("confusable_homoglyphs") / "confusables.json"
    table = json.loads(path.read_text(encoding="utf-8"))
    neighbours: dict[str, set[str]] = {}
    longer: dict[str, str] = {}
    for key, entries in table.items():
        first = key.translate(_BIDI_MARKS)
        for entry in entries:
            second = entry["c"].translate(_BIDI_MARKS)
            if first == second or not first or not second:
                continue
            if len(first) == 1 and len(second) == 1:
                neighbours.setdefault(first, set()).add(second)
                neighbours.setdefault(second, set()).add(first)
            elif len(first) == 1:  # sources are single code points: the longer side is the prototype
                longer[first] = second
            elif len(second) == 1:
                longer[second] = first
    out: dict[str, str] = dict(longer)
    for char, linked in neighbours.items():
        if len(linked) > 1:  # the centre of a star is its prototype
            continue
        (other,) = linked
        if len(neighbours[other]) > 1 or _rank(other) < _rank(char):
            out[char] = other
    return out


def _rank(char: str) -> tuple[bool, int]:
    return (not char.isascii(), ord(char))
