"""Loading text datasets from local files or the Hub, the same way in every CLI command and recipe;
reading a dataset's columns in its current row order."""

from __future__ import annotations

import codecs
import csv
import functools
import io
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hush_hf.jsonfile import decode_utf8

#: The column of a tagged dataset holding each row's secret indices (one list per row).
SECRET_IDS_COLUMN = "secret_ids"
LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text", ".csv": "csv"}


def load_text_dataset(name_or_path: str, *, split: str = "train") -> Any:
    """A ``datasets.Dataset`` from a local json/jsonl/parquet/csv/text file, a ``save_to_disk``
    folder, or a Hub dataset name (the Hub only when the user has it; nothing else downloads)."""
    import datasets

    path = Path(name_or_path)
    if path.is_dir() and any((path / name).exists() for name in ("dataset_info.json", "dataset_dict.json")):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(
                    f"dataset folder {str(path)!r} has no split {split!r}; its splits: {sorted(loaded)}"
                )
            return loaded[split]
        return loaded
    if path.is_file():
        builder = LOCAL_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(
                f"dataset file {str(path)!r} has suffix {path.suffix!r}; supported: {sorted(LOCAL_BUILDERS)}"
            )
        if not _has_content(path, text=builder != "parquet"):
            raise ValueError(f"dataset file {str(path)!r} is empty: it has no rows")
        try:
            loaded = datasets.load_dataset(builder, data_files={split: str(path)}, split=split)
        except StopIteration:  # datasets' json builder on a file without a single record
            raise ValueError(f"dataset file {str(path)!r} has no rows") from None
        except (datasets.exceptions.DatasetGenerationError, ValueError) as error:  # Arrow/pandas errors too
            raise ValueError(load_error(path, builder, error)) from None
        if len(loaded) == 0:
            raise ValueError(f"dataset file {str(path)!r} has no rows")
        return loaded
    if not path.is_dir() and (path.suffix.lower() in LOCAL_BUILDERS or name_or_path.startswith((".", "/"))):
        raise ValueError(f"dataset file {str(path)!r} does not exist")  # a folder: its data files, below
    return datasets.load_dataset(name_or_path, split=split)



def _has_content(path: Path, *, text: bool) -> bool:
    """Whether the file holds a non-whitespace byte, read 1 MiB at a time. A ``text`` file must be UTF-8:
    a ValueError naming the line otherwise (pyarrow loads Latin-1 JSON into string columns unchecked,
    and the first read of such a row fails far from here, without the file's name)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    found = False
    with open(path, "rb") as handle:
        for chunk in iter(functools.partial(handle.read, 1 << 20), b""):
            found = found or bool(chunk.strip())
            if not text:
                if found:
                    return True
                continue
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError:
                decode_utf8(path.read_bytes(), source=f"dataset file {str(path)!r}")  # raises, with the line
        if text:
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                decode_utf8(path.read_bytes(), source=f"dataset file {str(path)!r}")
    return found


def load_error(path: Path, builder: str, error: BaseException) -> str:
    """One line naming the file and, where it can be found, the line that broke ``datasets``' builder.

    datasets wraps a parse error in ``DatasetGenerationError`` (a traceback, no file or line); so the file
    is read again here: not UTF-8 (the line of the first bad byte), JSON / JSON Lines syntax (the line),
    a CSV row with a different number of fields than the header (the line). Otherwise the builder's
    exception types are named; their messages are not repeated, since some quote the offending row.
    """
    source = f"dataset file {str(path)!r}"
    if builder in ("json", "csv", "text"):
        text = decode_utf8(path.read_bytes(), source=source)
        problem = {"json": _json_problem, "csv": _csv_problem}.get(builder, lambda _: None)(text)
        if problem is not None:
            return f"{source}: {problem}"
    kinds, cause = [], error
    while cause is not None and len(kinds) < 4:
        kinds.append(type(cause).__name__)
        cause = cause.__cause__ or cause.__context__
    return (
        f"{source} could not be loaded by datasets' {builder!r} builder ({' <- '.join(kinds)}); "
        f"check that it is a valid {builder} file"
    )


def _json_problem(text: str) -> str | None:
    """Where a JSON document (``[...]``) or a JSON Lines file stops being valid, or None."""
    if text.lstrip().startswith("["):
        try:
            json.loads(text)
        except json.JSONDecodeError as err:
            return f"line {err.lineno}, column {err.colno}: not valid JSON ({err.msg})"
        return None
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines(): U+2028 is valid JSON
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            return (f"line {number} is not valid JSON (column {err.colno}: {err.msg}); JSON Lines holds one "
                    "object per line")
        if not isinstance(row, dict):
            kind = type(row).__name__
            return f"line {number} is a JSON {kind}, not an object: a row is {{\"column\": value}}"
    return None


def _csv_problem(text: str) -> str | None:
    """The first CSV line whose field count differs from the header's, or that does not parse, or None."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return None
        except csv.Error as err:  # the csv module's own words, never the row
            return f"line {start}: malformed CSV ({err})"
        if header is None:
            header = row
        elif row and len(row) != len(header):
            return (f"line {reader.line_num}: {len(row)} fields but the header has {len(header)}; quote "
                    "fields that contain commas")


def column_names(dataset: Any) -> list[str]:
    """A ``datasets.Dataset``'s columns; for another map-style dataset of dict rows, its first row's keys."""
    names = getattr(dataset, "column_names", None)
    if names:
        return list(names)
    if names is None and hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__") and len(dataset):
        first = dataset[0]
        if isinstance(first, Mapping):
            return list(first.keys())
    return []


def arrow_columns(dataset: Any, names: Sequence[str]) -> list[tuple[str, Any]]:
    """The named columns as Arrow arrays in the dataset's current row order (shuffles and selections
    applied); a map-style dataset of dict rows is read row by row."""
    datasets = sys.modules.get("datasets")
    if datasets is not None and isinstance(dataset, datasets.Dataset):
        indices = getattr(dataset, "_indices", None)  # the index mapping of shuffle/select/filter
        if indices is None:
            return [(name, dataset.data.column(name)) for name in names]
        # One take per column: with_format("arrow") gathers row by row (a chunk per row, ~20x slower).
        order = indices.column(0)
        return [(name, dataset.data.column(name).take(order)) for name in names]
    import pyarrow as pa

    rows = [dataset[i] for i in range(len(dataset))]
    try:
        return [(name, pa.array([_plain(row[name]) for row in rows])) for name in names]
    except (KeyError, TypeError, pa.ArrowException) as error:
        raise ValueError(
            f"the dataset's rows cannot be read as columns {list(names)} ({error}); pass a datasets.Dataset"
        ) from None


def _plain(value: Any) -> Any:
    """Tensors and arrays as Python lists (what Arrow can read)."""
    return value.tolist() if hasattr(value, "tolist") else value
