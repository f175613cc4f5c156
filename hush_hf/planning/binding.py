"""Which rows a plan was made from: a keyed digest of every row's content, in row order.

A plan's sampling probabilities and memberships are indexed by row: rho_i and the secrets of
example i are row i's. Trained on other rows (shuffled, filtered and padded back, edited by a
``map``, or unrelated rows of the same count) the plan would sample each row with another row's
probability and count its secrets in another row's place, and every per-secret bound would be void.
So a plan records, for each row it was made from, a digest of the row's content, and every use of
the plan with a dataset (``plan.attach``, the trainers, ``hush verify --dataset``) recomputes them
and refuses a dataset whose rows differ, naming how many rows differ and the first one.

A row's content is every column but hush_hf's bookkeeping (``secret_ids``, ``hush_weight``,
``hush_sampling_prob``, secret marks, tagged-text digests): what a model or collator could read.
Digests are taken on the values, not their storage (:mod:`hush_hf.digests`). They are keyed with a
random key drawn per plan and kept, with the digests, only in the local plan file
(``save(include_fingerprint=True)``, as ``hush plan`` writes it): published copies omit both, since
whoever knows all of a row but its secret could otherwise confirm a guess by hashing the row.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from hush_hf.data import SECRET_IDS_COLUMN, arrow_columns, column_names
from hush_hf.digests import DIGEST_BYTES, row_digests

KEY_BYTES = 32
#: Columns hush_hf adds beside a row's content and drops before the model: ``secret_ids`` and the
#: plan's ``hush_weight`` / ``hush_sampling_prob`` (marks and tagged-text digests: see is_bookkeeping).
WEIGHT_COLUMN = "hush_weight"
SAMPLING_PROB_COLUMN = "hush_sampling_prob"
BOOKKEEPING_COLUMNS = (SECRET_IDS_COLUMN, WEIGHT_COLUMN, SAMPLING_PROB_COLUMN)

RULE = (
    "a plan trains exactly the rows it was made from, in that order, with the same columns and values "
    "(plan the dataset as it will be trained: tokenize first, then plan)"
)


def is_bookkeeping(name: str) -> bool:
    """Whether a column is hush_hf's bookkeeping rather than a row's content: ``BOOKKEEPING_COLUMNS``,
    secret marks (:func:`hush_hf.mark_secrets`) and tagged-text digests (``tag_dataset``)."""
    from hush_hf.secrets.marks import MARKS_PREFIX
    from hush_hf.secrets.tagging import is_text_digest_column

    return name in BOOKKEEPING_COLUMNS or name.startswith(MARKS_PREFIX) or is_text_digest_column(name)


def content_columns(dataset: Any) -> list[str]:
    """The columns a row's digest covers: all but hush_hf's bookkeeping, sorted by name."""
    return sorted(name for name in column_names(dataset) if not is_bookkeeping(name))


@dataclass(frozen=True)
class RowBinding:
    """Keyed digests of the rows a plan was made from: ``digests[i]`` is row i's (module docstring)."""

    columns: tuple[str, ...]
    key: bytes
    digests: np.ndarray  # (num_examples, DIGEST_BYTES) uint8

    def __repr__(self) -> str:  # neither the key nor the digests
        return f"RowBinding({len(self.digests)} rows, columns={list(self.columns)})"

    @classmethod
    def of(cls, dataset: Any) -> RowBinding:
        """The binding of ``dataset``'s rows under a fresh random key."""
        columns = content_columns(dataset)
        if not columns:
            raise ValueError(
                f"the dataset has no columns besides hush_hf's bookkeeping ({column_names(dataset)}): "
                "there is no row content to bind the plan to"
            )
        key = secrets.token_bytes(KEY_BYTES)
        return cls(tuple(columns), key, row_digests(arrow_columns(dataset, columns), key=key))

    def differing_rows(self, dataset: Any) -> np.ndarray:
        """Indices of the rows of ``dataset`` (same length, same columns) whose digest differs."""
        now = row_digests(arrow_columns(dataset, self.columns), key=self.key)
        return np.flatnonzero(np.any(now != self.digests, axis=1))

    def check(self, dataset: Any, *, what: str = "dataset") -> None:
        """ValueError unless ``dataset`` holds exactly the bound rows: same count, same content columns,
        same values row by row. The error names how many rows differ and the first (never their content)."""
        if len(dataset) != len(self.digests):
            raise ValueError(
                f"{what} has {len(dataset)} rows but the plan was made from {len(self.digests)}: {RULE}"
            )
        columns = content_columns(dataset)
        if columns != list(self.columns):
            missing = [c for c in self.columns if c not in columns]
            added = [c for c in columns if c not in self.columns]
            raise ValueError(
                f"{what}'s columns are not those the plan was made from ({list(self.columns)}): "
                f"{missing} missing, {added} added: {RULE}"
            )
        differ = self.differing_rows(dataset)
        if differ.size:
            raise ValueError(
                f"{what} differs from the rows the plan was made from at {differ.size} of "
                f"{len(self.digests)} "
                f"rows (first: row {int(differ[0])}): was it shuffled, filtered, edited or replaced after "
                f"planning? {RULE}"
            )

    # -- persistence (local plan files only) ---------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "columns": list(self.columns),
            "key": self.key.hex(),
            "digests": base64.b64encode(np.ascontiguousarray(self.digests).tobytes()).decode("ascii"),
        }

    @classmethod
    def from_json(cls, data: Any, num_examples: int) -> RowBinding:
        columns, key = data["columns"], bytes.fromhex(data["key"])
        digests = np.frombuffer(base64.b64decode(data["digests"], validate=True), dtype=np.uint8)
        if not (isinstance(columns, list) and columns and all(isinstance(c, str) for c in columns)):
            raise ValueError("rows.columns must be a non-empty list of column names")
        if len(key) != KEY_BYTES or digests.size != num_examples * DIGEST_BYTES:
            raise ValueError(f"rows do not describe the plan's {num_examples} examples")
        return cls(tuple(columns), key, digests.reshape(num_examples, DIGEST_BYTES))


def unbound_plan_error(what: str) -> ValueError:
    """The error for a plan that records no rows being used with a dataset."""
    return ValueError(
        f"the plan records no row digests, so {what}'s rows cannot be matched to the plan's (it was "
        "made from a bare secret_ids column, or it is a published or checkpoint copy, which omit them): "
        "make the plan from the dataset (plan_protection(dataset, ...), `hush plan`, "
        "SecretProtectionTrainer(secrets=...)), use the local plan file (saved with "
        "include_fingerprint=True), or bind it to the rows its secret_ids were read from with "
        "plan.bound_to(dataset)"
    )
