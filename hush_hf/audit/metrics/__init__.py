"""``evaluate`` metric modules for the audit, loadable offline: ``evaluate.load(metric_path("exposure"))``.

Each module is a thin wrapper over the plain functions of :mod:`hush_hf.audit` (which need no
``evaluate``; importing ``evaluate`` takes seconds, so nothing here imports it).
"""

from __future__ import annotations

from pathlib import Path

METRICS = ("exposure", "extraction", "membership", "reconstruction")


def metric_path(name: str) -> str:
    """The directory of metric module ``name``, for ``evaluate.load(path)`` (no Hub access)."""
    if name not in METRICS:
        raise ValueError(f"metric name must be one of {METRICS}, got {name!r}")
    return str(Path(__file__).resolve().parent / name)


__all__ = ["METRICS", "metric_path"]
