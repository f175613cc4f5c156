"""Shared helpers of the recipe tests: recipe modules, subprocess runs, checks for leaks (no tests here)."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
PYTHON = sys.executable
ACCELERATE = Path(sys.executable).with_name("accelerate")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def recipe_module(name: str) -> ModuleType:
    """A module of recipes/ (a folder of scripts, not a package: they import each other as the
    scripts do, e.g. ``from common import ...``, so the folder goes on ``sys.path``)."""
    if str(RECIPES) not in sys.path:
        sys.path.insert(0, str(RECIPES))
    return importlib.import_module(name)


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models run fastest on one thread; with pytest -n 2 on 2 cores more threads only contend.
    Autouse in every module that imports it; the previous setting is restored after each test."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def run_recipe(
    args: list[str], *, launcher: list[str] | None = None, timeout: float = 300.0
) -> subprocess.CompletedProcess:
    """Run ``python <args>`` (or ``launcher + args``) from the repository root, offline, one thread.

    Each smoke run takes 30-90 s of wall time on a 2-core machine, ~2-3x that when the machine is
    shared: the timeout only catches a hang, with room for a loaded machine."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    command = (launcher or [PYTHON]) + args
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-6000:]}")
    return done


def words_of(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.casefold()))


def template_words() -> set[str]:
    """Words the code itself writes (labels, notes, messages): no leak when a secret equals one."""
    sources = [*RECIPES.glob("*.py"), *(ROOT / "hush_hf").rglob("*.py")]
    return set().union(*(words_of(p.read_text(encoding="utf-8")) for p in sources))


def output_texts(folder: Path) -> str:
    """Every text file a recipe wrote (results, tables, plans, log)."""
    return "\n".join(
        p.read_text(encoding="utf-8", errors="replace")
        for p in folder.rglob("*")
        if p.is_file() and p.suffix in {".json", ".md", ".log", ".txt"}
    )


def whole_words_in(words: list[str], text: str) -> list[str]:
    """The ``words`` that occur in ``text`` as a whole word, not as digits inside a number: a canary
    value like 001869 is a word of its sentence, while a timing 0.99278937300186 merely contains it."""
    return [w for w in words if re.search(rf"(?<![\w.]){re.escape(w)}(?!\w)", text)]


def assert_files(folder: Path, names: list[str]) -> None:
    for name in names:
        path = folder / name
        assert path.is_file() and path.stat().st_size > 0, name
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == PNG_MAGIC, name


def strings_in(value) -> list[str]:
    """Every key and string value in parsed JSON (numbers left out)."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [str(k), *strings_in(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return [value] if isinstance(value, str) else []


def leak_check_texts(folder: Path) -> str:
    """``output_texts``, except that a protection plan contributes its strings only: a plan holds
    example and secret indices by the thousand, which a secret that is a number (``"63"``) would
    match without anything having leaked; a secret could reach a plan only as a string."""
    parts = []
    for p in folder.rglob("*"):
        if not (p.is_file() and p.suffix in {".json", ".md", ".log", ".txt"}):
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        if p.suffix == ".json":
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            if isinstance(data, dict) and "sampling_probs" in data and "digest" in data:
                text = "\n".join(strings_in(data))
        parts.append(text)
    return "\n".join(parts)


def assert_no_secret_leaks(folder: Path, secret_words: set[str]) -> None:
    """No secret word appears in the outputs, except words the code itself writes."""
    leaked = (words_of(leak_check_texts(folder)) & {w.casefold() for w in secret_words}) - template_words()
    assert not leaked, f"{len(leaked)} secret word(s) appear in the outputs"
