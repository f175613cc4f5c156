"""Canaries: random secrets inserted into training data to measure memorisation (Carlini et al. 2019).

A canary is ``template.format(secret=r)`` with r drawn uniformly from the randomness space
R = alphabet^length (e.g. "My ID is: 123456", |R| = 10^6). Inserted before tagging, a canary can be
declared as a secret with prior p = 1/|R| (the chance of guessing r without the model) and audited
with :mod:`hush_hf.audit.exposure`, or left untagged as an unprotected control.

A canary file written by :func:`save_canaries` holds the secret values: it is the user's own file,
like a secrets file, and must not be published. Nothing else here prints a value.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PLACEHOLDER = "{secret}"
SPACE_KEYS = ("template", "alphabet", "length")
CANARY_KEYS = ("index", "value", "repetitions")  # the keys of a canary file's entries
CANARY_ID_PREFIX = "hush-canary-"
_WORD_CHAR = re.compile(r"\w")


@dataclass(frozen=True)
class CanarySpace:
    """The randomness space R: ``template`` with its one ``{secret}`` filled by alphabet^length.

    The value must be a whole word of the canary text (word characters only, and no word
    character touching the placeholder): secrets are tagged by whole words
    (:mod:`hush_hf.secrets.words`), so a value glued to its neighbours would be left untagged.
    """

    template: str = "My ID is: {secret}"
    alphabet: str = "0123456789"
    length: int = 6

    def __post_init__(self) -> None:
        if not isinstance(self.template, str) or self.template.count(PLACEHOLDER) != 1:
            raise ValueError(f"template must contain exactly one {PLACEHOLDER!r}, got {self.template!r}")
        try:
            self.template.format(secret="")
        except (IndexError, KeyError, ValueError) as error:
            raise ValueError(f"template={self.template!r} has other format fields: {error}") from None
        before, after = self.template.split(PLACEHOLDER)
        if (before and _WORD_CHAR.match(before[-1])) or (after and _WORD_CHAR.match(after[0])):
            raise ValueError(
                f"template={self.template!r}: the characters around {PLACEHOLDER} must not be word "
                "characters, or the canary would not be a whole word and would escape tagging"
            )
        if not isinstance(self.alphabet, str) or len(self.alphabet) < 2 or len(set(self.alphabet)) != len(
                self.alphabet):
            raise ValueError(f"alphabet must hold at least 2 distinct characters, got {self.alphabet!r}")
        if not all(_WORD_CHAR.match(ch) for ch in self.alphabet):
            raise ValueError(f"alphabet={self.alphabet!r} must hold word characters only "
                             "(letters, digits, _)")
        if isinstance(self.length, bool) or not isinstance(self.length, numbers.Integral) or self.length < 1:
            raise ValueError(f"length must be a positive integer, got {self.length!r}")

    @property
    def size(self) -> int:
        """|R| = len(alphabet) ** length."""
        return len(self.alphabet) ** self.length

    @property
    def prior(self) -> float:
        """p = 1/|R|: the chance of guessing a uniformly drawn value without the model."""
        return 1.0 / self.size

    @property
    def bits(self) -> float:
        """log2 |R|: the largest exposure a canary from this space can have."""
        return self.length * math.log2(len(self.alphabet))

    def value(self, index: int) -> str:
        """The ``index``-th value of R in lexicographic order of the alphabet (index in [0, |R|))."""
        if not 0 <= index < self.size:
            raise ValueError(f"index must lie in [0, {self.size}), got {index}")
        base, chars = len(self.alphabet), []
        for _ in range(self.length):
            index, digit = divmod(index, base)
            chars.append(self.alphabet[digit])
        return "".join(reversed(chars))

    def index(self, value: str) -> int:
        """The position of ``value`` in R (inverse of :meth:`value`)."""
        if len(value) != self.length or any(ch not in self.alphabet for ch in value):
            raise ValueError(f"value is not in this canary space (length {self.length} over the alphabet)")
        base, out = len(self.alphabet), 0
        for ch in value:
            out = out * base + self.alphabet.index(ch)
        return out

    def text(self, value: str) -> str:
        """The canary text with ``value`` in place of ``{secret}``."""
        return self.template.replace(PLACEHOLDER, value)

    def random_values(self, count: int, rng: np.random.Generator) -> list[str]:
        """``count`` values drawn uniformly and independently from R (repeats possible)."""
        draws = rng.integers(0, len(self.alphabet), size=(count, self.length))
        return ["".join(self.alphabet[d] for d in row) for row in draws]

    def to_json(self) -> dict[str, Any]:
        return {"template": self.template, "alphabet": self.alphabet, "length": self.length}


@dataclass(frozen=True, repr=False)
class Canary:
    """Canary number ``index``: ``space.text(value)``, inserted ``repetitions`` times."""

    index: int
    value: str
    repetitions: int
    space: CanarySpace = field(default_factory=CanarySpace)

    def __post_init__(self) -> None:
        self.space.index(self.value)  # validates the value against the space
        if isinstance(self.repetitions, bool) or not isinstance(self.repetitions, numbers.Integral) \
                or self.repetitions < 0:
            raise ValueError(f"canary #{self.index}: repetitions must be an integer >= 0, "
                             f"got {self.repetitions!r}")

    @property
    def text(self) -> str:
        return self.space.text(self.value)

    @property
    def name(self) -> str:
        """The identifier used when the canary is declared as a secret (not the value)."""
        return f"{CANARY_ID_PREFIX}{self.index}"

    def secret_record(self, target_posterior: float) -> dict[str, Any]:
        """A record for ``SecretSet.from_records``: id, prior 1/|R|, target, and the value as the term.

        The term is the random value alone, not the whole canary text: every example holding the
        full text also holds the value, so tagging by the value marks a superset (errs towards
        protecting more examples).
        """
        return {"id": self.name, "prior": self.space.prior, "target": target_posterior, "terms": [self.value]}

    def __repr__(self) -> str:
        return f"Canary(index={self.index}, value=<hidden>, repetitions={self.repetitions})"

    __str__ = __repr__


def make_canaries(num_canaries: int, repetitions: int | Sequence[int] = 1, *,
                  space: CanarySpace | None = None, seed: int = 0) -> list[Canary]:
    """``num_canaries`` canaries with distinct values drawn uniformly from R (seeded).

    ``repetitions``: how many times each is to be inserted (one number, or one per canary; 0 makes
    a canary that is only scored, a never-trained reference).
    """
    space = space or CanarySpace()
    if isinstance(num_canaries, bool) or not isinstance(num_canaries, numbers.Integral) or num_canaries < 1:
        raise ValueError(f"num_canaries must be a positive integer, got {num_canaries!r}")
    if num_canaries > space.size // 2:
        raise ValueError(f"num_canaries={num_canaries} is more than half of |R|={space.size}")
    reps = [repetitions] * num_canaries if isinstance(repetitions, numbers.Integral) else list(repetitions)
    if len(reps) != num_canaries:
        raise ValueError(f"repetitions has {len(reps)} entries for num_canaries={num_canaries}")
    rng = np.random.default_rng(seed)
    values: list[str] = []
    while len(values) < num_canaries:
        for value in space.random_values(num_canaries - len(values), rng):
            if value not in values:
                values.append(value)
    return [Canary(k, value, reps[k], space) for k, value in enumerate(values)]


def insert_canaries(data: Any, canaries: Sequence[Canary], *, text_column: str = "text",
                    seed: int = 0) -> tuple[Any, list[list[int]]]:
    """Insert each canary ``repetitions`` times at uniformly random positions (seeded).

    ``data``: a list of strings, or a ``datasets.Dataset`` whose ``text_column`` holds the text (the
    other columns of an inserted row are null). Returns the new data and, per canary, the row
    indices of its copies in it. The original rows keep their order.
    """
    if not canaries:
        raise ValueError("canaries must hold at least one canary, got none")
    texts = [c.text for c in canaries for _ in range(c.repetitions)]
    owners = [c.index for c in canaries for _ in range(c.repetitions)]
    n = len(data)
    rng = np.random.default_rng(seed)
    total = n + len(texts)
    inserted_at = np.sort(rng.choice(total, size=len(texts), replace=False))
    order = rng.permutation(len(texts))  # which copy goes to which inserted slot
    is_inserted = np.zeros(total, dtype=bool)
    is_inserted[inserted_at] = True
    # source[k]: row k of the output comes from original row source[k] (< n) or copy source[k] - n.
    source = np.empty(total, dtype=np.int64)
    source[~is_inserted] = np.arange(n)
    source[inserted_at] = n + order
    positions: dict[int, list[int]] = {c.index: [] for c in canaries}
    for row in inserted_at:
        positions[owners[source[row] - n]].append(int(row))
    by_canary = [positions[c.index] for c in canaries]
    if isinstance(data, list):
        if not all(isinstance(t, str) for t in data):
            raise ValueError("data as a list must hold strings only")
        pool = data + texts
        return [pool[k] for k in source], by_canary
    return _insert_into_dataset(data, texts, source, text_column), by_canary


def _insert_into_dataset(dataset: Any, texts: list[str], source: np.ndarray, text_column: str) -> Any:
    import datasets

    if not isinstance(dataset, datasets.Dataset):
        raise ValueError("data must be a list of strings or a datasets.Dataset, "
                         f"got a {type(dataset).__name__}")
    if text_column not in dataset.column_names:
        raise ValueError(f"text_column={text_column!r} is not a column of the dataset {dataset.column_names}")
    rows = {name: [None] * len(texts) for name in dataset.column_names}
    rows[text_column] = texts
    extra = datasets.Dataset.from_dict(rows, features=dataset.features)
    return datasets.concatenate_datasets([dataset, extra]).select(source.tolist()).flatten_indices()


def canary_secret_records(canaries: Sequence[Canary], target_posterior: float) -> list[dict[str, Any]]:
    """Records for ``SecretSet.from_records``, one per canary (see :meth:`Canary.secret_record`)."""
    return [c.secret_record(target_posterior) for c in canaries]


def save_canaries(path: str | Path, canaries: Sequence[Canary]) -> Path:
    """Write the canaries (with their values: keep this file private) as JSON."""
    spaces = {c.space for c in canaries}
    if len(spaces) != 1:
        raise ValueError(f"all canaries must share one space to be saved together, got {len(spaces)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"space": spaces.pop().to_json(),
            "canaries": [{"index": c.index, "value": c.value, "repetitions": c.repetitions}
                         for c in canaries]}
    path.write_text(json.dumps(data, indent=2))
    return path


def load_canaries(path: str | Path) -> list[Canary]:
    """Read canaries written by :func:`save_canaries`.

    Anything malformed is a one-line ValueError naming the file, and the line (JSON syntax, a key given
    twice) or the canary's position (``canaries[k]``); a value is never shown.
    """
    from hush_hf.jsonfile import read_json

    source = f"canary file {str(path)!r}"
    data = read_json(path, what="canary file", shown_keys=("space", "canaries", *SPACE_KEYS, *CANARY_KEYS))
    if not isinstance(data, dict) or set(data) != {"space", "canaries"}:
        raise ValueError(f"{source}: not a canary file (expected the keys 'space' and 'canaries')")
    space_data, entries = data["space"], data["canaries"]
    if not isinstance(space_data, dict) or set(space_data) != set(SPACE_KEYS):
        raise ValueError(f"{source}: 'space' must be an object with the keys {', '.join(SPACE_KEYS)}")
    try:
        space = CanarySpace(**space_data)
    except ValueError as error:
        raise ValueError(f"{source}: space: {error}") from None
    if not isinstance(entries, list):
        raise ValueError(f"{source}: 'canaries' must be a list, got a {type(entries).__name__}")
    canaries = []
    for k, entry in enumerate(entries):
        where = f"{source}: canaries[{k}]"
        if not isinstance(entry, dict) or set(entry) != set(CANARY_KEYS):
            raise ValueError(f"{where} must be an object with the keys {', '.join(CANARY_KEYS)}")
        index, value, repetitions = (entry[key] for key in CANARY_KEYS)
        if isinstance(index, bool) or not isinstance(index, int):
            raise ValueError(f"{where}: index must be an integer, got a {type(index).__name__}")
        if not isinstance(value, str):
            raise ValueError(f"{where}: value must be a string, got a {type(value).__name__}")
        try:
            canaries.append(Canary(index, value, repetitions, space))
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
    return canaries
