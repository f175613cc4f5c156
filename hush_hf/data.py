"""Loading text datasets from local files or the Hub, the same way in every CLI command and recipe."""

from __future__ import annotations

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
