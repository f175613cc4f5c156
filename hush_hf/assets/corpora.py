"""Offline text corpora for the recipes (scientific prose, dialogue, code), as ``datasets.Dataset``.

Every loader reads local files only, returns examples in a fixed order (the same on every call and
machine for the same package version) and builds the dataset in memory (nothing is written to the
``datasets`` cache).
"""

from __future__ import annotations

import json
import keyword
import numbers
import os
import sysconfig
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from hush_hf.assets.packages import ACLSUM_PACKAGE, CHITCHAT_PACKAGE, AssetPackage, asset_path

if TYPE_CHECKING:
    from datasets import Dataset

TEST_FOLDERS = frozenset({"test", "tests", "idle_test"})
"""Folders of the standard library that hold its own test suite (``test/`` alone is ~800 files)."""


def _check_count(field: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{field} must be an integer, got a {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{field}={value!r} must be >= {minimum}")
    return int(value)


def _string_dataset(columns: dict[str, list[str]]) -> Dataset:
    from datasets import Dataset, Features, Value

    return Dataset.from_dict(columns, features=Features({name: Value("string") for name in columns}))


def _unexpected_layout(package: AssetPackage, where: str) -> ValueError:
    return ValueError(
        f"{where} of {package.distribution!r} does not have the layout of version {package.version}; "
        f"reinstall it with: {package.pip_line} --force-reinstall"
    )


def aclsum_paragraphs(min_words: int = 20) -> Dataset:
    """Paragraphs of the 250 ACL papers of ACLSum (Takeshita et al. 2024), one example each.

    Columns: ``text`` (a paragraph of the abstract or body, as parsed by S2ORC) and ``doc_id`` (the
    paper's ACL Anthology id, e.g. ``"P13-1116"``). Paragraphs with fewer than ``min_words``
    whitespace-separated words (headings, captions, parse debris) are left out; back matter
    (acknowledgements, appendices) is not included. Order: papers by id, paragraphs in reading order.
    The default keeps 12,840 paragraphs of 86 words on average.

    ``doc_id`` comes from the file name: the ``paper_id`` field inside the parses is truncated for
    the 2020+ papers (57 read just ``"2020"``, ``"2021"``, ...), so it cannot tell papers apart.
    """
    min_words = _check_count("min_words", min_words, minimum=1)
    folder = asset_path(ACLSUM_PACKAGE, "dataset/paper_jsons")
    texts: list[str] = []
    doc_ids: list[str] = []
    for path in sorted(folder.glob("*.json")):
        with path.open(encoding="utf-8") as file:
            parse = json.load(file)
        try:
            paragraphs = parse["pdf_parse"]["abstract"] + parse["pdf_parse"]["body_text"]
            paragraph_texts = [paragraph["text"] for paragraph in paragraphs]
        except (KeyError, TypeError) as error:
            raise _unexpected_layout(ACLSUM_PACKAGE, f"paper {path.stem}") from error
        for text in paragraph_texts:
            if len(text.split()) >= min_words:
                texts.append(text)
                doc_ids.append(path.stem)
    if not doc_ids:
        raise _unexpected_layout(ACLSUM_PACKAGE, "dataset/paper_jsons")
    return _string_dataset({"text": texts, "doc_id": doc_ids})


def chitchat_dialogues() -> Dataset:
    """The 7,168 chats of the Chit Chat Challenge dataset (Myers et al. 2018), one example each.

    Columns: ``text`` (one line per turn, speakers alternating: a turn's messages joined by a
    space, runs of whitespace collapsed to one space) and ``chat_id`` (the dataset's UUID).
    Order: as in the package's ``dataset.json``. 3,150 chats have a single turn; 12 turns are empty
    and kept as empty lines so that lines still alternate between the two speakers.
    """
    path = asset_path(CHITCHAT_PACKAGE, "dataset.json")
    with path.open(encoding="utf-8") as file:
        chats = json.load(file)
    texts: list[str] = []
    chat_ids: list[str] = []
    try:
        for chat_id, chat in chats.items():
            turns = [" ".join(message["text"] for message in turn) for turn in chat["messages"]]
            texts.append("\n".join(" ".join(turn.split()) for turn in turns))
            chat_ids.append(chat_id)
    except (AttributeError, KeyError, TypeError) as error:
        raise _unexpected_layout(CHITCHAT_PACKAGE, "dataset.json") from error
    if not chat_ids:
        raise _unexpected_layout(CHITCHAT_PACKAGE, "dataset.json")
    return _string_dataset({"text": texts, "chat_id": chat_ids})


def _is_module_name(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _module_name(relative: PurePosixPath) -> str:
    """Dotted module name of a stdlib file: ``a/b.py`` is ``a.b`` and ``a/__init__.py`` is ``a``."""
    parts = [*relative.parts[:-1], relative.stem]
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def stdlib_root() -> Path:
    """The folder of the running interpreter's standard library (``sysconfig`` "stdlib")."""
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files(root: Path, include_tests: bool) -> list[PurePosixPath]:
    """Importable ``.py`` files under ``root``, relative to it, sorted.

    Folders and files whose names are not identifiers are not modules of the library and are not
    entered: ``site-packages`` (third-party code, ~11K files on some installs),
    ``config-3.11-x86_64-linux-gnu``, ``_sysconfigdata__linux_x86_64-linux-gnu.py``, test fixtures.
    """
    found: list[PurePosixPath] = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [
            name
            for name in subfolders
            if _is_module_name(name) and (include_tests or name not in TEST_FOLDERS)
        ]
        relative_folder = PurePosixPath(Path(folder).relative_to(root).as_posix())
        found.extend(
            relative_folder / name for name in files if name.endswith(".py") and _is_module_name(name[:-3])
        )
    return sorted(found)


def stdlib_sources(max_files: int | None = None, *, include_tests: bool = False) -> Dataset:
    """The Python source files of the running interpreter's standard library, one example each.

    Columns: ``path`` (POSIX path relative to the stdlib folder), ``module`` (dotted name) and
    ``text`` (the file decoded as UTF-8; undecodable bytes become U+FFFD). Only importable modules
    count (``site-packages`` and build files are skipped). The library's own tests (folders named
    ``test``, ``tests`` or ``idle_test``: ~1,050 of ~1,790 files on CPython 3.11, many of them
    fixtures) are left out unless ``include_tests``. Order: by path; ``max_files`` keeps the first
    ones. The content depends on the Python version.
    """
    if max_files is not None:
        max_files = _check_count("max_files", max_files, minimum=1)
    if not isinstance(include_tests, bool):
        raise ValueError(f"include_tests must be a bool, got a {type(include_tests).__name__}")
    root = stdlib_root()
    files = _stdlib_files(root, include_tests)[:max_files]
    if not files:
        raise FileNotFoundError(f"no Python source files in the standard library folder {str(root)!r}")
    return _string_dataset(
        {
            "path": [str(path) for path in files],
            "module": [_module_name(path) for path in files],
            "text": [(root / path).read_text(encoding="utf-8", errors="replace") for path in files],
        }
    )
