"""Loading text datasets from local files or the Hub, the same way in every CLI command and recipe;
reading a dataset's columns in its current row order."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text", ".csv": "csv"}


def load_text_dataset(name_or_path: str, *, split: str = "train") -> Any:
    """A ``datasets.Dataset`` from a local json/jsonl/parquet/csv/text file, a ``save_to_disk``
    folder, or a Hub dataset name (the Hub only when the user has it; nothing else downloads)."""
    import datasets

    path = Path(name_or_path)
    if path.is_dir() and (path / "dataset_info.json").exists():
        loaded = datasets.load_from_disk(str(path))
        return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
    if path.is_file():
        builder = LOCAL_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(
                f"dataset file {str(path)!r} has suffix {path.suffix!r}; supported: {sorted(LOCAL_BUILDERS)}"
            )
        if not path.read_bytes().strip():
            raise ValueError(f"dataset file {str(path)!r} is empty: it has no rows")
        try:
            loaded = datasets.load_dataset(builder, data_files={split: str(path)}, split=split)
        except StopIteration:  # datasets' json builder on a file without a single record
            raise ValueError(f"dataset file {str(path)!r} has no rows") from None
        if len(loaded) == 0:
            raise ValueError(f"dataset file {str(path)!r} has no rows")
        return loaded
    if path.suffix.lower() in LOCAL_BUILDERS or name_or_path.startswith((".", "/")):
        raise ValueError(f"dataset file {str(path)!r} does not exist")
    return datasets.load_dataset(name_or_path, split=split)


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
