"""The fields of a saved plan, checked before a plan is built from them (a file edited by hand).

:meth:`ProtectionPlan.from_json` runs :func:`check_plan_fields` before it compares the digest, so a file
with a missing key, a wrong type (``"steps": 20.5``, ``"calibrated": "false"``), a bare ``NaN`` token or
a value out of range is refused in one line naming the file and the field; a well-formed file whose
numbers were changed is then refused by its digest. Nothing is converted: ``float("1.5")`` or
``int(20.5)`` would hand the trainer a number the file does not state. A plan holds no secret, so
messages show the values (except the secret-set fingerprint, a hash of the secrets).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

REQUIRED = (
    "format_version", "noise_multiplier", "accountant", "budget", "lp_c", "expected_batch_size", "steps",
    "secrets", "weights", "sampling_probs",
)
OPTIONAL = (
    "digest", "calibrated", "summary", "lp", "secret_set_fingerprint", "memberships", "training", "rows",
)
SECRET_COLUMNS = ("num_examples", "sum_rho", "prior", "target", "bound")
ROW_FIELDS = ("columns", "key", "digests")
MEMBERSHIP_FIELDS = ("indptr", "indices")


def check_plan_fields(data: Mapping[str, Any], source: str) -> None:
    """ValueError ``"<source>: <field> ..."`` for the first field that is missing, unknown, of the wrong
    type or out of range; the format version is checked before (``ProtectionPlan.from_json``)."""
    from hush_hf.accounting import ACCOUNTANTS, LP_BUDGET_KINDS

    def fail(message: str) -> None:
        raise ValueError(f"{source}: {message}")

    _keys(data, REQUIRED, OPTIONAL, "", fail)
    _number(data["noise_multiplier"], "noise_multiplier", fail, positive=False)
    _number(data["lp_c"], "lp_c", fail, positive=True)
    _number(data["expected_batch_size"], "expected_batch_size", fail, positive=True)
    steps = data["steps"]
    if type(steps) is not int or steps < 1:
        fail(f"steps must be an integer >= 1, got {steps!r}")
    for field, names in (("accountant", tuple(ACCOUNTANTS)), ("budget", tuple(LP_BUDGET_KINDS))):
        if not isinstance(data[field], str) or data[field] not in names:
            fail(f"{field} must be one of {names}, got {data[field]!r}")
    if "digest" in data and not isinstance(data["digest"], str):  # absent: check_digest explains
        fail(f"digest must be a string, got a {type(data['digest']).__name__}")
    if "calibrated" in data and not isinstance(data["calibrated"], bool):
        fail(f"calibrated must be true or false, got {data['calibrated']!r}")
    for field in ("summary", "lp"):
        if field in data and not isinstance(data[field], Mapping):
            fail(f"{field} must be an object, got a {type(data[field]).__name__}")
    fingerprint = data.get("secret_set_fingerprint")
    if "secret_set_fingerprint" in data and not isinstance(fingerprint, str):
        fail(f"secret_set_fingerprint must be a string, got a {type(fingerprint).__name__}")
    weights = _column(data["weights"], "weights", fail, low=0.0)
    _column(data["sampling_probs"], "sampling_probs", fail, low=0.0, high=1.0, like=("weights", weights.size))
    _secret_columns(data["secrets"], fail)
    if data.get("memberships") is not None:
        memberships = data["memberships"]
        _keys(memberships, MEMBERSHIP_FIELDS, (), "memberships.", fail)
        for field in MEMBERSHIP_FIELDS:
            _column(memberships[field], f"memberships.{field}", fail, low=0.0, integers=True)
    if "rows" in data:
        _keys(data["rows"], ROW_FIELDS, (), "rows.", fail)
        _row_fields(data["rows"], fail)


def _row_fields(rows: Mapping[str, Any], fail: Any) -> None:
    """The encodings of the row binding (its sizes: ``RowBinding.from_json``)."""
    import base64
    import binascii

    try:
        bytes.fromhex(rows["key"])
    except (TypeError, ValueError):
        fail("rows.key must be a string of hexadecimal digits")
    try:
        base64.b64decode(rows["digests"], validate=True)
    except (TypeError, ValueError, binascii.Error):
        fail("rows.digests must be a base64 string")


def _keys(data: Any, required: tuple[str, ...], optional: tuple[str, ...], prefix: str, fail: Any) -> None:
    where = prefix.rstrip(".") or "the plan"
    if not isinstance(data, Mapping):
        fail(f"{where} must be an object, got a {type(data).__name__}")
    missing = [key for key in required if key not in data]
    if missing:
        fail(f"missing field {prefix + missing[0]!r}")
    unknown = sorted(str(key) for key in data if key not in required and key not in optional)
    if unknown:
        fail(f"unknown field {prefix + unknown[0]!r} (hush_hf writes {', '.join(required + optional)})")


def _number(value: Any, field: str, fail: Any, *, positive: bool) -> None:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0 or (positive and value == 0):
        fail(f"{field} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")


def _column(value: Any, field: str, fail: Any, *, low: float, high: float = math.inf,
            like: tuple[str, int] | None = None, integers: bool = False) -> np.ndarray:
    """``value`` as an array after checking it is a list of JSON numbers (integers) in [low, high]."""
    if not isinstance(value, list):
        fail(f"{field} must be a list of numbers, got a {type(value).__name__}")
    kinds = (int,) if integers else (int, float)
    wrong = next((i for i, item in enumerate(value) if type(item) not in kinds), None)
    if wrong is not None:
        kind = "an integer" if integers else "a number"
        fail(f"{field}[{wrong}] must be {kind}, got {value[wrong]!r}")
    array = np.asarray(value, dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(array) & (array >= low) & (array <= high)))
    if bad.size:
        bounds = f">= {low:g}" if math.isinf(high) else f"in [{low:g}, {high:g}]"
        fail(f"{field}[{bad[0]}] must be a finite number {bounds}, got {value[bad[0]]!r}")
    if like is not None and array.size != like[1]:
        fail(f"{field} has {array.size} entries but {like[0]} has {like[1]}")
    return array


def _secret_columns(secrets: Any, fail: Any) -> None:
    _keys(secrets, SECRET_COLUMNS, (), "secrets.", fail)
    columns = {}
    for field in SECRET_COLUMNS:
        high = 1.0 if field in ("prior", "target", "bound") else math.inf
        columns[field] = _column(secrets[field], f"secrets.{field}", fail, low=0.0, high=high,
                                 like=None if field == "num_examples" else
                                 ("secrets.num_examples", columns["num_examples"].size),
                                 integers=field == "num_examples")
    prior, target = columns["prior"], columns["target"]
    bad = np.flatnonzero(~((prior > 0) & (prior < target) & (target < 1)))
    if bad.size:
        j = int(bad[0])
        fail(f"secrets.prior[{j}]={float(prior[j])!r} and secrets.target[{j}]={float(target[j])!r} must "
             "satisfy 0 < prior < target < 1")
