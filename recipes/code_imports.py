"""Which modules each Python file of a codebase defines or imports: the secrets of ``code_completion.py``.

A file *contains* module M if it defines M (it is M's source) or imports M (``import M``, ``from M import
x``, relative imports resolved against the file's package), found with ``ast`` so that names in comments
or strings do not count; files ``ast`` cannot parse (another Python version's syntax) fall back to a regex
over import lines, which may over-match (safe: more protection, never less).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from pathlib import PurePosixPath

IMPORT_LINE = re.compile(r"^\s*(?:from\s+([.\w]+)\s+import\s+(.+)|import\s+(.+))$", re.MULTILINE)


def module_of(path: str) -> tuple[str, bool]:
    """(dotted module name, is a package) of a source path relative to the code root."""
    parts = list(PurePosixPath(path).with_suffix("").parts)
    is_package = parts[-1] == "__init__" and len(parts) > 1
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _with_prefixes(name: str) -> list[str]:
    """``a.b.c`` -> a, a.b, a.b.c: importing a submodule imports its packages."""
    parts = name.split(".")
    return [".".join(parts[: k + 1]) for k in range(len(parts))]


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str | None:
    """The absolute name of ``from <level dots><target> import ...`` inside ``module``."""
    if level == 0:
        return target
    package = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 > len(package) or (level - 1 == len(package) and not target):
        return None  # beyond the top-level package: not importable
    base = package[: len(package) - (level - 1)]
    return ".".join(base + ([target] if target else [])) or None


def referenced_modules(source: str, module: str, is_package: bool) -> tuple[set[str], bool]:
    """(every module name the file defines or imports, with parent packages; whether ast parsed it).

    ``from P import x`` also lists ``P.x`` (x may be a submodule: over-listing is safe, the caller
    keeps only real modules). Files ast cannot parse fall back to a regex over import lines.
    """
    names = {module}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return names | _regex_imports(source, module, is_package), False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            if base:
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return {prefix for name in names for prefix in _with_prefixes(name)}, True


def _regex_imports(source: str, module: str, is_package: bool) -> set[str]:
    names: set[str] = set()
    for match in IMPORT_LINE.finditer(source):
        if match.group(3):
            names.update(part.split(" as ")[0].strip() for part in match.group(3).split(","))
        else:
            dots = len(match.group(1)) - len(match.group(1).lstrip("."))
            base = _resolve(module, is_package, dots, match.group(1).lstrip(".") or None)
            if base:
                names.add(base)
                names.update(f"{base}.{n.split(' as ')[0].strip(' ()')}" for n in match.group(2).split(","))
    return {prefix for name in names if name for prefix in _with_prefixes(name)}


def import_graph(paths: Sequence[str], texts: Sequence[str]) -> tuple[list[str], list[list[str]], int]:
    """(each file's module, the corpus modules each file defines or imports, files parsed by the regex)."""
    defined = [module_of(path) for path in paths]
    known = {name for name, _ in defined}
    contains, unparsed = [], 0
    for (name, is_package), text in zip(defined, texts, strict=True):
        names, parsed = referenced_modules(text, name, is_package)
        unparsed += not parsed
        contains.append(sorted(names & known))
    return [name for name, _ in defined], contains, unparsed
