"""Package attributes imported on first use (PEP 562), so ``import hush_hf`` stays fast.

A package lists ``name -> module`` and gets ``__getattr__`` and ``__dir__`` from :func:`lazy_exports`;
a module path starting with ``hush_hf`` is absolute, any other is relative to the package.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name in ``exports`` is imported from its module on
    first access; any other name is an AttributeError naming the package."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        path = module if module.startswith("hush_hf") else f"{package}.{module}"
        return getattr(importlib.import_module(path), name)

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
