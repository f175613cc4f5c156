"""Checks of the file and folder arguments of the ``hush`` commands, made before any work.

A command must not find out after tagging a corpus or solving the LP that its output cannot be written
(``--output data.jsonl/plan.json``), nor read a folder given where a file is meant.
"""

from __future__ import annotations

import math
from pathlib import Path


def check_input_file(flag: str, value: str | None, *, hint: str = "") -> None:
    """ValueError unless ``value`` (if given) is an existing file: ``<flag> file '<value>' does not
    exist`` or ``... is a folder``."""
    if value is None:
        return
    path = Path(value)
    if path.is_dir():
        raise ValueError(f"{flag} file {value!r} is a folder; give a file{hint}")
    if not path.is_file():
        raise ValueError(f"{flag} file {value!r} does not exist{hint}")


def check_output_file(flag: str, value: str | None) -> None:
    """ValueError unless a file can be created at ``value``: it is not a folder and the nearest existing
    folder above it is a folder (not a file standing where a folder of the path should be)."""
    if value is None:
        return
    path = Path(value)
    if path.is_dir():
        raise ValueError(f"{flag} {value!r} is a folder; give the file's path")
    check_parent(flag, path)


def check_parent(flag: str, path: Path) -> None:
    """ValueError if a file stands where a folder above ``path`` should be."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(
                    f"{flag} {str(path)!r} cannot be written: {str(parent)!r} is a file, not a folder"
                )
            return


def check_share(flag: str, value: float | None, *, low_open: bool = False, high_open: bool = False) -> None:
    """ValueError unless ``value`` (if given) is a number in [0, 1] (ends open as asked)."""
    if value is None:
        return
    low_ok = value > 0 if low_open else value >= 0
    high_ok = value < 1 if high_open else value <= 1
    if not (math.isfinite(value) and low_ok and high_ok):
        interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise ValueError(f"{flag} must be a number in {interval}, got {value!r}")
