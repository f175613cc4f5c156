"""Reading secrets from plain records (dicts, tuples) and from JSON, JSON Lines and CSV files.

A record names one secret with the keys ``id`` or ``name``; ``prior`` or ``p``;
``target_posterior``, ``target`` or ``r``; and optionally ``terms`` (a list, or one string with
``;`` between terms) and ``pattern``. Values from CSV arrive as text and are parsed here. Messages
never repeat a name, term, pattern, unknown key or unparsable text (any of them could be a secret,
e.g. in a CSV without a header row); they give field names and positions.
"""

from __future__ import annotations

import csv
import io
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hush_hf.jsonfile import loads_json, read_text
from hush_hf.secrets.secret import Secret

NAME_KEYS = ("name", "id")
PRIOR_KEYS = ("prior", "p")
TARGET_KEYS = ("target_posterior", "target", "r")
OPTIONAL_KEYS = ("terms", "pattern", "raw_pattern")
KNOWN_KEYS = frozenset(NAME_KEYS + PRIOR_KEYS + TARGET_KEYS + OPTIONAL_KEYS)
SHOWN_KEYS = KNOWN_KEYS | {"secrets"}  # field names a message may show (any other key may be a secret)
TERM_SEPARATOR = ";"
ID_IS_TERM = "@id"  # a CSV terms cell saying explicitly that the id itself is the term


def _pick(record: Mapping[Any, Any], keys: tuple[str, ...], required: bool) -> Any:
    present = [key for key in keys if key in record]
    if len(present) > 1:
        raise ValueError(f"give only one of the fields {' / '.join(map(repr, present))}")
    if not present:
        if required:
            raise ValueError(f"missing field {keys[0]!r} (also accepted: {', '.join(map(repr, keys[1:]))})")
        return None
    return record[present[0]]


def _name(value: Any) -> str:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    if not isinstance(value, str):
        raise ValueError(f"name must be a string, got a {type(value).__name__}")
    return value


def _number(field: str, value: Any) -> Any:
    """Parse text as a float; numbers pass through to :class:`Secret`'s checks."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{field} is empty")
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise ValueError(f"{field} is not a number (its text does not parse as a float)") from None
    return value


def _terms(value: Any) -> Any:
    """``None``/empty -> no terms; a string -> its ``;``-separated pieces, stripped, empty ones skipped."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(piece.strip() for piece in value.split(TERM_SEPARATOR) if piece.strip())
    return value


def _pattern(value: Any) -> Any:
    return None if value is None or value == "" else value


def _flag(field: str, value: Any) -> bool:
    """A boolean, or its CSV text (``true``/``false``/``1``/``0``/empty)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("", "false", "0", "no"):
        return False
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"):
        return True
    raise ValueError(f"{field} must be true or false")


def secret_from_record(record: Any) -> Secret:
    """A :class:`Secret` from a Secret, a mapping, or a tuple (name, prior, target[, terms[, pattern]])."""
    if isinstance(record, Secret):
        return record
    if isinstance(record, Mapping):
        unknown = [key for key in record if key not in KNOWN_KEYS]
        if unknown:
            raise ValueError(
                f"{len(unknown)} unrecognised field(s); accepted fields are {', '.join(sorted(KNOWN_KEYS))}"
            )
        fields = (
            _pick(record, NAME_KEYS, True),
            _pick(record, PRIOR_KEYS, True),
            _pick(record, TARGET_KEYS, True),
            _pick(record, ("terms",), False),
            _pick(record, ("pattern",), False),
            _pick(record, ("raw_pattern",), False),
        )
    elif isinstance(record, (tuple, list)):
        if not 3 <= len(record) <= 5:
            raise ValueError(
                "a tuple record is (name, prior, target_posterior[, terms[, pattern]]), "
                f"got {len(record)} items"
            )
        fields = (*record, *(None,) * (6 - len(record)))
    else:
        raise ValueError(f"a record must be a Secret, a mapping or a tuple, got a {type(record).__name__}")
    name, prior, target, terms, pattern, raw_pattern = fields
    if isinstance(terms, str) and not _terms(terms) and _pattern(pattern) is None:
        # "" or " ; " is a terms field written empty: the id is its term only when terms is left out
        raise ValueError(
            "terms is empty (only ';' and spaces) and there is no pattern; leave terms out (or write "
            f"{ID_IS_TERM} in a CSV terms cell) to use the id itself as the term"
        )
    return Secret(
        name=_name(name),
        prior=_number("prior", prior),
        target_posterior=_number("target_posterior", target),
        terms=_terms(terms),
        pattern=_pattern(pattern),
        raw_pattern=_flag("raw_pattern", raw_pattern),
    )


def source_name(path: str | Path) -> str:
    """How messages name a secrets file."""
    return f"secrets file {str(path)!r}"


def read_json(path: str | Path) -> list[Any]:
    """Records from a JSON file holding a list of records or ``{"secrets": [...]}`` (UTF-8; a field
    given twice in one record is an error with its line)."""
    source = source_name(path)
    data = loads_json(read_text(path, what="secrets file"), source=source, shown_keys=SHOWN_KEYS)
    if isinstance(data, dict):
        if set(data) != {"secrets"}:
            # Keys are not echoed: a file mapping names to records would print the names.
            raise ValueError(
                f"{source}: a JSON object must have exactly one key 'secrets', found {len(data)} key(s)"
            )
        data = data["secrets"]
    if not isinstance(data, list):
        raise ValueError(f"{source}: expected a JSON list of records, got a {type(data).__name__}")
    return data


def read_jsonl(path: str | Path) -> list[tuple[int, Any]]:
    """``(line, record)`` for each non-blank line of a JSON Lines file (one JSON record per line)."""
    source = source_name(path)
    records = []
    # split on "\n" only: str.splitlines() would also cut at U+2028 and others, valid inside JSON strings
    for line_number, line in enumerate(read_text(path, what="secrets file").split("\n"), start=1):
        if line.strip():
            records.append(
                (line_number, loads_json(line, source=source, shown_keys=SHOWN_KEYS, line=line_number))
            )
    return records


def read_csv(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line, record)`` for each data row of a CSV file with a header row (UTF-8, optional BOM).

    Refused with the line number, never the row's text: a header naming a field twice (a record would
    keep only the last cell), a quoted field that runs over a line break (an unterminated quote would
    swallow the next secrets), a row with more or fewer fields than the header, a ``terms`` cell with
    commas but no ``;`` (terms are separated by ``;``), and an empty ``terms`` cell on a row without a
    pattern (write ``@id`` to make the id the term; a file without a ``terms`` column uses every id as
    its term).
    """
    source = source_name(path)
    rows = []
    text = read_text(path, what="secrets file")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    line = 0
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as error:
            # error text is the csv module's own (e.g. "unexpected end of data"), never the row
            raise ValueError(
                f"{source}: line {start}: malformed CSV ({error}); unterminated quote?"
            ) from None
        line = reader.line_num
        if line != start:
            raise ValueError(
                f"{source}: line {start}: a quoted field runs over {line - start + 1} lines; "
                "is a quote unterminated?"
            )
        if not row or not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = [cell.strip() for cell in row]
            _check_header(source, line, header)
            continue
        if len(row) != len(header):
            raise ValueError(
                f"{source}: line {line}: {len(row)} fields but the header has {len(header)}; "
                "quote fields that contain commas"
            )
        rows.append((line, dict(zip(header, row, strict=True))))
    if header is not None and "terms" in header:
        for line, record in rows:
            _check_csv_terms(source, line, record)
    return rows


def _check_header(source: str, line: int, header: list[str]) -> None:
    """ValueError if a field is unknown or named twice (the name is shown only if it is a known field: a
    file without a header row has a secret where the header should be)."""
    seen: set[str] = set()
    for name in header:
        if name in seen:
            shown = repr(name) if name in KNOWN_KEYS else "(name not shown: it may be secret)"
            raise ValueError(
                f"{source}: line {line}: the header names the field {shown} twice; a record would keep only "
                "its last cell: merge the columns (terms are separated by ';')"
            )
        seen.add(name)
    unknown = [name for name in header if name not in KNOWN_KEYS]
    if unknown:
        hint = ""
        if any(name.lower() in KNOWN_KEYS for name in unknown):
            hint = "; field names are lower case"
        elif len(header) == 1 and TERM_SEPARATOR in header[0]:
            hint = "; fields are separated by commas, not ';'"
        raise ValueError(
            f"{source}: line {line}: the header has {len(unknown)} unrecognised field name(s) (not shown: "
            f"without a header row this line is a secret){hint}; accepted fields are "
            f"{', '.join(sorted(KNOWN_KEYS))}"
        )


def _check_csv_terms(source: str, line: int, record: dict[str, Any]) -> None:
    terms = record["terms"].strip()
    if terms == ID_IS_TERM:
        record["terms"] = None  # as if the row had no terms cell
        return
    if "," in terms and TERM_SEPARATOR not in terms:
        raise ValueError(
            f"{source}: line {line}: the terms cell holds commas but no ';': terms are separated by ';'"
        )
    if not terms and not (record.get("pattern") or "").strip():
        raise ValueError(
            f"{source}: line {line}: terms is empty and there is no pattern; write {ID_IS_TERM} in the terms "
            "cell to use the id itself as the term"
        )
