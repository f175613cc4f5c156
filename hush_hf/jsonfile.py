"""Reading a JSON file a user points at, with errors that name the file (and the line), and comparing
JSON content with what it should be."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def read_json(path: str | Path, *, what: str = "file") -> Any:
    """The parsed content of ``path``; ValueError naming the file when it is missing, unreadable,
    empty or not valid JSON (with the line and column, e.g. of a truncated file)."""
    path = Path(path)
    if not path.is_file():
        folder = " (it is a folder)" if path.is_dir() else ""
        raise ValueError(f"{what} {str(path)!r} does not exist{folder}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{what} {str(path)!r} cannot be read: {err}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        hint = "" if text.rstrip().endswith(("}", "]")) else " (the file ends early: truncated?)"
        raise ValueError(
            f"{what} {str(path)!r} is not valid JSON at line {err.lineno}, column {err.colno}: "
            f"{err.msg}{hint}"
        ) from None


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
