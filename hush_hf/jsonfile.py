"""Reading a JSON or text file a user points at, with errors that name the file and the line.

Messages never quote the file's content (a line of a secrets file, canary file or dataset may be a
secret): they give the file, the line and what is wrong. A key that appears twice in one JSON object is
an error (``json`` would silently keep the last value); its name is shown only if it is one of the
format's own field names.

:func:`first_difference` compares JSON content with what it should be (``hush verify``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any


class _DuplicateKey(Exception):
    """Raised from ``object_pairs_hook``; turned into a ValueError with the line by :func:`loads_json`."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey
        obj[key] = value
    return obj


def _string_end(text: str, start: int) -> int:
    """Index just past the JSON string literal opening at ``text[start] == '"'``."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return len(text)


def first_duplicate_key(text: str) -> tuple[str, int] | None:
    """(key, offset) of the first key that repeats within one object of the JSON ``text``, in document
    order; None if there is none. Written by hand because ``json`` reports no positions to its hooks;
    it only needs to track strings, nesting and which strings are keys (followed by ``:``)."""
    stack: list[set[str] | None] = []  # per open container: the keys seen (objects) or None (arrays)
    i = 0
    while i < len(text):
        char = text[i]
        if char == '"':
            end = _string_end(text, i)
            if stack and stack[-1] is not None:
                after = end
                while after < len(text) and text[after] in " \t\r\n":
                    after += 1
                if after < len(text) and text[after] == ":":
                    key = json.loads(text[i:end])
                    if key in stack[-1]:
                        return key, i
                    stack[-1].add(key)
            i = end
            continue
        if char == "{":
            stack.append(set())
        elif char == "[":
            stack.append(None)
        elif char in "}]" and stack:
            stack.pop()
        i += 1
    return None


def loads_json(text: str, *, source: str, shown_keys: Collection[str] = (), line: int | None = None) -> Any:
    """``json.loads(text)``; ValueError naming ``source`` and the line on a syntax error or a key given
    twice in one object. ``line``: ``text`` is that line of the file (JSON Lines)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey:
        found = first_duplicate_key(text)
        key, offset = found if found is not None else (None, 0)
        where = line if line is not None else text.count("\n", 0, offset) + 1
        name = repr(key) if key in shown_keys else "(name not shown: it may be secret)"
        raise ValueError(
            f"{source}: line {where}: one object has the field {name} twice; JSON would keep only the last "
            "value: remove one"
        ) from None
    except json.JSONDecodeError as err:
        if line is not None:
            raise ValueError(
                f"{source}: line {line} is not valid JSON (column {err.colno}: {err.msg})"
            ) from None
        hint = "" if text.rstrip().endswith(("}", "]")) else " (the file ends early: truncated?)"
        raise ValueError(
            f"{source} is not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}{hint}"
        ) from None


def decode_utf8(data: bytes, *, source: str) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped); ValueError naming ``source`` and the
    line of the first byte that is not UTF-8 (e.g. a Latin-1 or cp1252 file)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"{source}: line {line} is not UTF-8 text (byte {err.start} of the file; Latin-1 or Windows "
            "encoding?): save the file as UTF-8"
        ) from None


def read_text(path: str | Path, *, what: str = "file") -> str:
    """The UTF-8 text of ``path``; ValueError naming the file when it is missing, a folder, unreadable
    or not UTF-8 (with the line)."""
    path = Path(path)
    if not path.is_file():
        folder = " (it is a folder)" if path.is_dir() else ""
        raise ValueError(f"{what} {str(path)!r} does not exist{folder}")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ValueError(f"{what} {str(path)!r} cannot be read: {err.strerror}") from None
    return decode_utf8(data, source=f"{what} {str(path)!r}")


def read_json(path: str | Path, *, what: str = "file", shown_keys: Collection[str] = ()) -> Any:
    """The parsed content of ``path``; ValueError naming the file when it is missing, unreadable,
    not UTF-8, not valid JSON (with the line and column, e.g. of a truncated file) or has a key twice
    in one object."""
    return loads_json(read_text(path, what=what), source=f"{what} {str(path)!r}", shown_keys=shown_keys)


def first_difference(found: Any, expected: Any, *, rtol: float = 1e-9, path: str = "") -> str | None:
    """Where two JSON-like values first differ, as ``path: found X, expected Y`` (None if they agree).

    Floats agree within ``rtol`` (relative; recomputed numbers may differ in the last bits between
    machines); bools, strings, integers, keys and list lengths must be equal.
    """
    where = path or "(top)"
    if isinstance(expected, Mapping):
        if not isinstance(found, Mapping):
            return f"{where}: found {_short(found)}, expected an object"
        for key in sorted(set(found) | set(expected), key=str):
            if key not in expected:
                return f"{_join(path, key)}: not expected"
            if key not in found:
                return f"{_join(path, key)}: missing"
            difference = first_difference(found[key], expected[key], rtol=rtol, path=_join(path, key))
            if difference is not None:
                return difference
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(found, (list, tuple)) or len(found) != len(expected):
            return f"{where}: found {_short(found)}, expected {len(expected)} items"
        for k, (a, b) in enumerate(zip(found, expected, strict=True)):
            difference = first_difference(a, b, rtol=rtol, path=f"{path}[{k}]")
            if difference is not None:
                return difference
        return None
    if _is_number(expected) and _is_number(found):
        same = found == expected or (
            not (isinstance(found, int) and isinstance(expected, int))
            and abs(found - expected) <= rtol * max(abs(found), abs(expected))
        )
    else:
        same = type(found) is type(expected) and found == expected
    return None if same else f"{where}: found {_short(found)}, expected {_short(expected)}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, float) else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
