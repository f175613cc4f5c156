"""An ordered, validated collection of secrets; secret j is index j everywhere downstream."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from hush_hf.secrets.records import read_csv, read_json, read_jsonl, secret_from_record, source_name
from hush_hf.secrets.secret import Secret


class SecretSet(Sequence[Secret]):
    """Secrets s_0..s_{m-1} with priors p_j and target posteriors r_j (Hush, Sec. 3).

    Validated when built: at least one secret, each with 0 < p_j < r_j < 1 and finite values
    (see :class:`Secret`), and names unique. Errors name the secret by index (``secret #j``), the
    field and the value, never the name. Plans and outputs downstream refer to secrets by index only.
    """

    def __init__(self, secrets: Iterable[Secret]) -> None:
        items = tuple(secrets)
        if not items:
            raise ValueError("a SecretSet needs at least one secret, got none")
        first_index: dict[str, int] = {}
        for j, secret in enumerate(items):
            if not isinstance(secret, Secret):
                raise ValueError(
                    f"secret #{j}: expected a Secret, got a {type(secret).__name__} "
                    "(use SecretSet.from_records for dicts and tuples)"
                )
            if secret.name in first_index:
                raise ValueError(
                    f"secret #{j}: name duplicates the name of secret #{first_index[secret.name]}"
                )
            first_index[secret.name] = j
        self._secrets = items
        self._priors = np.array([s.prior for s in items], dtype=np.float64)
        self._targets = np.array([s.target_posterior for s in items], dtype=np.float64)
        self._priors.flags.writeable = False
        self._targets.flags.writeable = False

    # -- sequence ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._secrets)

    @overload
    def __getitem__(self, index: int) -> Secret: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Secret, ...]: ...

    def __getitem__(self, index: int | slice) -> Secret | tuple[Secret, ...]:
        return self._secrets[index]

    def __iter__(self) -> Iterator[Secret]:
        return iter(self._secrets)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretSet) and self._secrets == other._secrets

    def __hash__(self) -> int:
        return hash(self._secrets)

    def __repr__(self) -> str:
        return f"SecretSet({len(self)} secrets)"

    __str__ = __repr__

    # -- arrays -----------------------------------------------------------------------------------
    @property
    def priors(self) -> np.ndarray:
        """p_j for every secret (read-only float64 array)."""
        return self._priors

    @property
    def targets(self) -> np.ndarray:
        """r_j for every secret (read-only float64 array)."""
        return self._targets

    @property
    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over the whole set (names, terms, patterns, p_j, r_j, in order).

        Stored with tagged datasets, token marks and plans so that data tagged with one secret set is
        never planned or trained with another. It is a hash of the secrets: keep it out of anything
        published (``ProtectionPlan.save`` writes it only when asked), since a short, guessable
        secret could be confirmed by hashing candidates.
        """
        records = [
            [s.name, repr(s.prior), repr(s.target_posterior), list(s.terms), s.pattern, s.raw_pattern]
            for s in self._secrets
        ]
        payload = json.dumps(["hush_hf.SecretSet.v1", records], ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]

    # -- construction -----------------------------------------------------------------------------
    @classmethod
    def from_records(cls, records: Iterable[Any]) -> SecretSet:
        """Build from ``Secret`` objects, mappings or tuples (formats: :mod:`hush_hf.secrets.records`)."""
        if isinstance(records, (str, bytes, Mapping)):
            raise ValueError(f"records must be an iterable of records, got a single {type(records).__name__}")
        secrets = []
        for j, record in enumerate(records):
            try:
                secrets.append(secret_from_record(record))
            except ValueError as error:
                raise ValueError(f"secret #{j}: {error}") from None
        return cls(secrets)

    @classmethod
    def from_json(cls, path: str | Path) -> SecretSet:
        """Build from a JSON file: a list of records, or ``{"secrets": [...]}``."""
        return cls.from_records(read_json(path))

    @classmethod
    def from_jsonl(cls, path: str | Path) -> SecretSet:
        """Build from a JSON Lines file, one record per line."""
        return cls.from_records(read_jsonl(path))

    @classmethod
    def from_csv(cls, path: str | Path) -> SecretSet:
        """Build from a CSV file whose header names the record fields (``terms`` split on ``;``).

        Errors give the line number (never the row): see :func:`hush_hf.secrets.records.read_csv`.
        """
        secrets = []
        for line, record in read_csv(path):
            try:
                secrets.append(secret_from_record(record))
            except ValueError as error:
                raise ValueError(f"{source_name(path)}: line {line}: {error}") from None
        return cls(secrets)

    @classmethod
    def load(cls, path: str | Path) -> SecretSet:
        """Build from a ``.json``, ``.jsonl`` or ``.csv`` file, chosen by suffix."""
        readers = {".json": cls.from_json, ".jsonl": cls.from_jsonl, ".csv": cls.from_csv}
        suffix = Path(path).suffix.lower()
        if suffix not in readers:
            raise ValueError(f"path suffix {suffix!r} is not supported; use one of {', '.join(readers)}")
        return readers[suffix](path)

    def to_json(self, path: str | Path) -> None:
        """Write ``{"secrets": [...]}`` with names, terms and patterns: it is the user's own file.

        ``SecretSet.from_json`` reads it back exactly (floats are written with full precision).
        """
        records = [
            {
                "name": s.name,
                "prior": s.prior,
                "target_posterior": s.target_posterior,
                "terms": list(s.terms),
                "pattern": s.pattern,
                **({"raw_pattern": True} if s.raw_pattern else {}),
            }
            for s in self._secrets
        ]
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"secrets": records}, handle, indent=2, ensure_ascii=False, allow_nan=False)
            handle.write("\n")
