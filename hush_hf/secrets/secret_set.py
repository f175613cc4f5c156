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
from hush_hf.secrets.words import words


class Located:
    """How messages name secret j: ``secret #j``, or the line of its file."""

    def __init__(self, source: str | None, lines: Sequence[int] | None) -> None:
        self.source, self.lines = source, lines

    def at(self, j: int) -> str:
        """The prefix of a message about secret j."""
        return f"secret #{j}: " if self.lines is None else f"{self.source}: line {self.lines[j]}: "

    def other(self, j: int) -> str:
        """Secret j named inside a message about another."""
        return f"secret #{j}" if self.lines is None else f"the secret on line {self.lines[j]}"


def check_distinct(items: Sequence[Secret], located: Located) -> None:
    """ValueError if two secrets share a name (spaces around it aside), a term (the same words once case,
    accents and the spacing between words are set aside: :func:`hush_hf.secrets.words.words`) or a
    pattern. A shared term marks both secrets wherever it occurs: the usual cause is a copied row whose
    terms were not changed, which leaves the second secret's own words unmarked. Terms that are different
    words but match alike (``fa1con``, ``falcon``) are not refused: document-frequency selection makes
    such secrets on purpose."""
    names: dict[str, int] = {}
    terms: dict[str, tuple[int, str]] = {}
    patterns: dict[tuple[str, bool], int] = {}
    for j, secret in enumerate(items):
        name = secret.name.strip()
        if name in names:
            i = names[name]
            spaces = "" if items[i].name == secret.name else " (apart from spaces around it)"
            raise ValueError(f"{located.at(j)}name duplicates the name of {located.other(i)}{spaces}")
        names[name] = j
        marking = [(f"terms[{k}]", term) for k, term in enumerate(secret.terms)]
        if not marking and secret.pattern is None:
            marking = [("its name (its only term)", secret.name)]
        for what, term in marking:
            i, other = terms.setdefault(" ".join(words(term)), (j, what))
            if i != j:
                raise ValueError(
                    f"{located.at(j)}{what} is the same term as {other} of {located.other(i)} (case and "
                    "spacing aside), so each would mark the other's examples: give each secret its own terms"
                )
        if secret.pattern is not None:
            i = patterns.setdefault((secret.pattern, secret.raw_pattern), j)
            if i != j:
                raise ValueError(f"{located.at(j)}pattern is the same as the pattern of {located.other(i)}")


class SecretSet(Sequence[Secret]):
    """Secrets s_0..s_{m-1} with priors p_j and target posteriors r_j (Hush, Sec. 3).

    Validated when built: at least one secret, each with 0 < p_j < r_j < 1 and finite values
    (see :class:`Secret`), and no name, term or pattern shared by two secrets (:func:`check_distinct`).
    Errors name the secret by index (``secret #j``, or its file and line), the field and the value, never
    the name. Plans and outputs downstream refer to secrets by index only.
    """

    def __init__(self, secrets: Iterable[Secret]) -> None:
        self._build(tuple(secrets))

    def _build(self, items: tuple[Secret, ...], *, source: str | None = None,
               lines: Sequence[int] | None = None) -> None:
        """Check and store ``items``; read from a file, errors name ``source`` and each secret's line."""
        if not items:
            where = "a SecretSet" if source is None else source
            raise ValueError(f"{where} needs at least one secret, got none")
        located = Located(source, lines)
        for j, secret in enumerate(items):
            if not isinstance(secret, Secret):
                raise ValueError(
                    f"{located.at(j)}expected a Secret, got a {type(secret).__name__} "
                    "(use SecretSet.from_records for dicts and tuples)"
                )
        check_distinct(items, located)
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
        records = read_json(path)
        if not records:
            raise ValueError(f"{source_name(path)} holds no secrets (an empty list)")
        return cls.from_records(records)

    @classmethod
    def from_jsonl(cls, path: str | Path) -> SecretSet:
        """Build from a JSON Lines file, one record per line (errors give the line)."""
        return cls._from_lines(path, read_jsonl(path), empty="it has no lines")

    @classmethod
    def from_csv(cls, path: str | Path) -> SecretSet:
        """Build from a CSV file whose header names the record fields (``terms`` split on ``;``).

        Errors give the line number (never the row): see :func:`hush_hf.secrets.records.read_csv`.
        """
        return cls._from_lines(path, read_csv(path), empty="it is empty or has a header row only")

    @classmethod
    def _from_lines(cls, path: str | Path, rows: list[tuple[int, Any]], *, empty: str) -> SecretSet:
        source = source_name(path)
        if not rows:
            raise ValueError(f"{source} holds no secrets: {empty}")
        secrets = []
        for line, record in rows:
            try:
                secrets.append(secret_from_record(record))
            except ValueError as error:
                raise ValueError(f"{source}: line {line}: {error}") from None
        built = cls.__new__(cls)
        built._build(tuple(secrets), source=source, lines=[line for line, _ in rows])
        return built

    @classmethod
    def load(cls, path: str | Path) -> SecretSet:
        """Build from a ``.json``, ``.jsonl`` or ``.csv`` file, chosen by suffix."""
        readers = {".json": cls.from_json, ".jsonl": cls.from_jsonl, ".csv": cls.from_csv}
        if Path(path).is_dir():
            raise ValueError(f"{source_name(path)} is a folder; give the secrets file in it")
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
