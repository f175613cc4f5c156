"""Reading a JSON file a user points at, with errors that name the file (and the line)."""

from __future__ import annotations

import json
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
