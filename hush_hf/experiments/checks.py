"""Checks of an experiment's arguments: a bad value is refused in one line naming the field and the value.

Every check runs before any work (a typo should not cost a planning that takes minutes).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any


def check_int(field: str, value: Any, *, minimum: int, allow_none: bool = False) -> None:
    """ValueError naming ``field`` and ``value`` unless it is an integer >= ``minimum`` (or allowed None)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")


def check_number(field: str, value: Any, *, low: float, high: float, allow_none: bool = False) -> None:
    """ValueError naming ``field`` and ``value`` unless it is a finite number in (low, high]."""
    if value is None and allow_none:
        return
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low < value <= high:
        raise ValueError(f"{field} must be a number in ({low:g}, {high:g}], got {value!r}")


def check_choice(field: str, value: Any, choices: Sequence[Any]) -> None:
    """ValueError naming ``field`` and ``value`` unless it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{field} must be one of {list(choices)}, got {value!r}")


def check_names(field: str, values: Any, choices: Sequence[str]) -> None:
    """ValueError unless ``values`` is a non-empty list of distinct names from ``choices``."""
    if not values or len(set(values)) != len(values) or set(values) - set(choices):
        raise ValueError(f"{field} must be distinct names from {list(choices)}, got {values!r}")


def check_pair(field: str, value: Any, *, kind: type, allow_none: bool = False) -> None:
    """ValueError unless ``value`` is two numbers of ``kind`` with lo <= hi (or an allowed None)."""
    if value is None and allow_none:
        return
    ok = (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
        and value[0] <= value[1]
    )
    if not ok:
        raise ValueError(f"{field} must be two {kind.__name__} values lo <= hi, got {value!r}")


def check_whole_batch_size(config: Any, why: str = "") -> None:
    """ValueError unless ``config.expected_batch_size`` is a whole number (a plain ``Trainer`` baseline
    trains with batches of exactly B); ``why`` is added to the message."""
    value = config.expected_batch_size
    if value is None or value != int(value):
        raise ValueError(f"expected_batch_size must be a whole number{why}, got {value!r}")
