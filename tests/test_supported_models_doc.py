"""docs/supported_models.md is generated from the family test's cases and must be current."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "supported_models.py"


def test_supported_models_table_is_current() -> None:
    spec = importlib.util.spec_from_file_location("supported_models", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.DOC.read_text() == module.render(), "run python scripts/supported_models.py"
    from tests.model_families import FAMILIES, OPTIONS

    text = module.DOC.read_text()
    assert all(f"| {f.name} |" in text for f in FAMILIES)
    assert all(f"| {o.name} | {o.family} |" in text for o in OPTIONS)
