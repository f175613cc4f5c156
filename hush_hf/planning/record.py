"""The training record: what a run actually did, carried by the plan it publishes beside the weights.

A plan states an intention (sigma and T it was calibrated for). A certificate is about released
weights, so the plan published with them carries what those weights went through:

- ``noise_multiplier``: the sigma every DP step used (in units of the clip norm C);
- ``dp_steps``: the DP steps the weights went through, the ones the bounds are computed at. A run
  stopped early or resumed counts the steps behind the saved weights; CRT public steps (no clipping,
  no noise, no tagged secret) are not DP steps and are counted apart in ``public_steps``;
- ``clip_norm``: C (the bounds are in units of C and do not depend on it; the noise std is sigma * C);
- ``weights``: the SHA-256 of every weight file saved (full, sharded with their index, adapters), so
  that the certificate names the files it certifies;
- ``dp_seed_source``: where the secret seed of the sampling and the noise came from: ``"drawn"`` (128
  bits from the OS, drawn by hush_hf at train start) or ``"user"`` (``dp_seed=`` was given). Whoever
  knows the seed reproduces every batch and noise draw and subtracts the noise, so the bounds hold only
  against an attacker who does not know it, and a chosen seed may be guessable. ``None`` (written as no
  field: records written before the field existed keep their digest) means unknown, stated as such and
  never taken for ``"drawn"``. A resumed run keeps its first run's source (kept in the seed file,
  :mod:`hush_hf.trainer.seed_store`).

B, the accountant and the planned T are the plan's own fields (the trainer refuses to train a plan at
another B or T), so they are not repeated here. The plan's digest covers the record.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import numbers
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Top-level files holding a model's weights, as transformers and PEFT name them (full and sharded
#: checkpoints with their index, adapters): the weight files ``push_to_hub`` publishes
#: (``hush_hf.trainer.publishing.PUBLISHABLE``), and the ones ``from_pretrained`` loads.
WEIGHT_FILE_PATTERNS = (
    "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
    "pytorch_model.bin", "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json",
    "adapter_model.safetensors", "adapter_model.bin",
)
DIGEST_PREFIX = "sha256:"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_CHUNK = 1 << 20
#: The values of ``TrainingRecord.dp_seed_source``; what a record without the field is stated as.
DP_SEED_SOURCES = ("drawn", "user")
UNKNOWN_SEED_SOURCE = "unknown"


def is_weight_file(name: str) -> bool:
    """Whether a top-level file name is one of ``WEIGHT_FILE_PATTERNS``."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in WEIGHT_FILE_PATTERNS)


def file_digest(path: str | Path) -> str:
    """``sha256:<hex>`` of a file's bytes (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return DIGEST_PREFIX + digest.hexdigest()


def weight_digests(folder: str | Path) -> dict[str, str]:
    """File name -> digest of every weight file directly in ``folder`` (sorted by name)."""
    folder = Path(folder)
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and is_weight_file(p.name))
    return {name: file_digest(folder / name) for name in names}


def compare_weights(recorded: Mapping[str, str], folder: str | Path, *,
                    among: Collection[str] | None = None) -> list[str]:
    """What differs between the recorded weight digests and the weight files in ``folder``, one
    sentence per file (empty: the same files with the same bytes). Besides the top-level weight files
    (``WEIGHT_FILE_PATTERNS``), any weight-like file at any depth
    (:mod:`hush_hf.planning.weight_files`) that the record does not name is a difference. ``among``:
    only these files (relative POSIX paths, e.g. what ``push_to_hub`` uploads) are looked at."""
    from hush_hf.planning.weight_files import weight_like_files

    found = weight_digests(folder)
    if among is not None:
        found = {name: digest for name, digest in found.items() if name in set(among)}
    problems = []
    for name in sorted(set(recorded) | set(found)):
        if name not in found:
            problems.append(f"{name} is recorded in the plan but missing")
        elif name not in recorded:
            problems.append(f"{name} is not certified by the plan (a weight file the plan does not name)")
        elif found[name] != recorded[name]:
            problems.append(f"{name} differs from the digest recorded in the plan")
    for name in weight_like_files(folder):
        if name not in recorded and name not in found and (among is None or name in set(among)):
            problems.append(f"{name} is a weight-like file the plan does not name: it is not certified "
                            "(remove it from what you publish)")
    return problems


@dataclass(frozen=True)
class TrainingRecord:
    """What the released weights went through (see the module docstring)."""

    noise_multiplier: float
    dp_steps: int
    clip_norm: float
    public_steps: int = 0
    weights: Mapping[str, str] = field(default_factory=dict)
    dp_seed_source: str | None = None

    def __post_init__(self) -> None:
        _check_record(self.noise_multiplier, self.dp_steps, self.clip_norm, self.public_steps, self.weights)
        check_seed_source(self.dp_seed_source, "training.dp_seed_source")

    @property
    def stated_seed_source(self) -> str:
        """``dp_seed_source`` as cards and reports state it: ``"unknown"`` for a record without one."""
        return self.dp_seed_source or UNKNOWN_SEED_SOURCE

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "noise_multiplier": float(self.noise_multiplier),
            "dp_steps": int(self.dp_steps),
            "public_steps": int(self.public_steps),
            "clip_norm": float(self.clip_norm),
            "weights": dict(sorted(self.weights.items())),
        }
        if self.dp_seed_source is not None:
            data["dp_seed_source"] = self.dp_seed_source
        return data

    @classmethod
    def from_json(cls, data: Any) -> TrainingRecord:
        """A record from :meth:`to_json` data; ValueError naming the field if it is malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"training: expected an object, got {type(data).__name__}")
        missing = [k for k in ("noise_multiplier", "dp_steps", "public_steps", "clip_norm", "weights")
                   if k not in data]
        if missing:
            raise ValueError(f"training: missing field {missing[0]!r}")
        if "dp_seed_source" in data and data["dp_seed_source"] not in DP_SEED_SOURCES:  # null included
            raise ValueError(f"training.dp_seed_source must be one of {list(DP_SEED_SOURCES)} (or absent: "
                             f"unknown), got {data['dp_seed_source']!r}")
        return cls(
            noise_multiplier=data["noise_multiplier"],
            dp_steps=data["dp_steps"],
            clip_norm=data["clip_norm"],
            public_steps=data["public_steps"],
            weights=data["weights"],
            dp_seed_source=data.get("dp_seed_source"),  # absent in records written before it: unknown
        )


def check_seed_source(source: Any, where: str) -> str | None:
    """``source`` if it is one of ``DP_SEED_SOURCES`` or None (unknown); a one-line ValueError otherwise."""
    if source is not None and source not in DP_SEED_SOURCES:
        raise ValueError(f"{where} must be one of {list(DP_SEED_SOURCES)} (or absent: unknown), got "
                         f"{source!r}")
    return source


def _check_record(sigma: Any, dp_steps: Any, clip_norm: Any, public_steps: Any, weights: Any) -> None:
    def number(value: Any) -> bool:
        return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)

    def count(value: Any) -> bool:
        return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= 0

    if not (number(sigma) and sigma >= 0):
        raise ValueError(f"training.noise_multiplier must be a finite number >= 0, got {sigma!r}")
    if not count(dp_steps):
        raise ValueError(f"training.dp_steps must be an integer >= 0, got {dp_steps!r}")
    if not count(public_steps):
        raise ValueError(f"training.public_steps must be an integer >= 0, got {public_steps!r}")
    if not (number(clip_norm) and clip_norm > 0):
        raise ValueError(f"training.clip_norm must be a positive finite number, got {clip_norm!r}")
    if not isinstance(weights, Mapping):
        raise ValueError(f"training.weights must map file names to digests, got {type(weights).__name__}")
    for name, digest in weights.items():
        if not isinstance(name, str) or "/" in name or "\\" in name or not is_weight_file(name):
            raise ValueError(f"training.weights: {name!r} is not a top-level weight file name")
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise ValueError(
                f"training.weights[{name!r}] must be 'sha256:' and 64 hex digits, got {digest!r}"
            )
