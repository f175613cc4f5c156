"""The protection plan: LP weights, sampling probabilities and calibrated noise (Hush Alg. 2, lines 1-5)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from hush_hf.accounting import (
    DEFAULT_ACCOUNTANT,
    LP_BUDGET_KINDS,
    SecretGroups,
    calibrate_noise,
    get_accountant,
    lp_budget,
    posterior_bounds,
)
from hush_hf.data import SECRET_IDS_COLUMN
from hush_hf.planning.binding import SAMPLING_PROB_COLUMN, WEIGHT_COLUMN, RowBinding, unbound_plan_error
from hush_hf.planning.lp import solve_example_weights
from hush_hf.planning.memberships import membership_matrix
from hush_hf.planning.plan_fields import check_plan_fields
from hush_hf.planning.probabilities import sampling_probabilities
from hush_hf.planning.record import TrainingRecord

logger = logging.getLogger(__name__)

#: Version 2 adds the training record (``training``): a hush_hf that cannot read it must refuse the
#: plan rather than certify a model at the plan's intended sigma and T.
PLAN_FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)
OVERTAGGING_SHARE = 0.05  # a secret marking more than this share of the examples is reported


@dataclass(frozen=True)
class SecretReport:
    """Per-secret columns of a plan; index j is secret j (names are never stored)."""

    num_examples: np.ndarray
    sum_rho: np.ndarray
    prior: np.ndarray
    target: np.ndarray
    bound: np.ndarray

    def to_json(self) -> dict[str, list]:
        return {k: np.asarray(v).tolist() for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, list]) -> SecretReport:
        return cls(
            num_examples=np.asarray(data["num_examples"], dtype=np.int64),
            **{k: np.asarray(data[k], dtype=np.float64) for k in ("sum_rho", "prior", "target", "bound")},
        )


@dataclass(frozen=True)
class ProtectionPlan:
    """Everything a training run needs to meet every secret's (p_j, r_j) target.

    ``sampling_probs[i] = B * weights[i] / sum(weights)`` (Alg. 2 line 3); ``noise_multiplier`` is the
    smallest sigma (in units of the clip norm) at which the accountant certifies
    ``secrets.bound[j] <= secrets.target[j]`` for all j, given T steps (Alg. 2 lines 4-5).

    A saved plan carries a ``digest`` (SHA-256 of its content); :meth:`load` refuses a file whose
    content no longer matches it. The digest catches edits, not forgery: what certifies a model is
    the bounds recomputed from the plan's rho, memberships and its ``training`` record (the sigma and
    DP steps the weights went through, and the weights' digests; ``hush_hf.planning.verification``).
    ``noise_multiplier`` and ``steps`` are what the plan was made for; ``training`` is None in a plan
    that no run has published (it certifies no model).

    ``rows`` binds the plan to the rows it was made from (keyed per-row content digests,
    :mod:`hush_hf.planning.binding`): a plan is used with a dataset only if the dataset's rows are
    those rows, in that order. Local plan files keep it; published copies omit it.
    """

    weights: np.ndarray
    sampling_probs: np.ndarray
    noise_multiplier: float
    accountant: str
    budget: str
    lp_c: float
    expected_batch_size: float
    steps: int
    secrets: SecretReport
    lp: dict[str, Any] = field(default_factory=dict)
    calibrated: bool = True
    secret_set_fingerprint: str | None = None
    #: (num_secrets x num_examples) 0/1 CSR: which examples contain which secret (indices only). What
    #: a saved plan's bounds are recomputed from (``hush verify``); None in hand-built plans.
    memberships: sp.csr_matrix | None = None
    #: What the published weights went through (set when a run writes its artifacts); None otherwise.
    training: TrainingRecord | None = None
    #: The rows the plan was made from (None: bound to no rows, so it cannot be used with a dataset).
    rows: RowBinding | None = None

    @property
    def num_examples(self) -> int:
        return int(self.weights.size)

    @property
    def num_secrets(self) -> int:
        return int(self.secrets.target.size)

    @property
    def retained_fraction(self) -> float:
        """Fraction of examples with a non-zero weight (Hush Fig. 1a)."""
        return float(np.count_nonzero(self.weights) / max(self.weights.size, 1))

    @property
    def retained_weight_fraction(self) -> float:
        """sum(w) / n: the share of the data the plan trains on, counting fractional weights."""
        return float(self.weights.sum() / max(self.weights.size, 1))

    @property
    def unmatched_secrets(self) -> int:
        """How many secrets mark no example (accepted only with ``allow_unmatched``)."""
        return int(np.count_nonzero(self.secrets.num_examples == 0))

    @property
    def meets_targets(self) -> bool:
        return bool(np.all(self.secrets.bound <= self.secrets.target))

    def summary(self) -> dict[str, Any]:
        """Scalars for logs and reports (no per-example data, no secret names)."""
        ratio = self.secrets.bound / self.secrets.target
        return {
            "examples": self.num_examples,
            "secrets": self.num_secrets,
            "unmatched_secrets": self.unmatched_secrets,
            "accountant": self.accountant,
            "budget": self.budget,
            "lp_c": self.lp_c,
            "expected_batch_size": self.expected_batch_size,
            "steps": self.steps,
            "noise_multiplier": self.noise_multiplier,
            "retained_fraction": self.retained_fraction,
            "retained_weight_fraction": self.retained_weight_fraction,
            "max_sampling_prob": float(self.sampling_probs.max(initial=0.0)),
            "bound_over_target_max": float(ratio.max(initial=0.0)),
            "bound_over_target_median": float(np.median(ratio)) if ratio.size else 0.0,
            "meets_targets": self.meets_targets,
            "lp_gap": self.lp.get("gap"),
        }

    def with_bounds(self, bounds: np.ndarray) -> ProtectionPlan:
        """This plan with ``secrets.bound`` replaced (e.g. by bounds recomputed at the sigma trained with)."""
        bounds = np.asarray(bounds, dtype=np.float64)
        if bounds.shape != self.secrets.target.shape:
            raise ValueError(f"bounds has shape {bounds.shape}, expected {self.secrets.target.shape}")
        return replace(self, secrets=replace(self.secrets, bound=bounds))

    def with_training(self, record: TrainingRecord | None) -> ProtectionPlan:
        """This plan carrying ``record`` (what a run trained with it), e.g. to publish beside the weights."""
        if record is not None and not isinstance(record, TrainingRecord):
            raise ValueError(f"record must be a TrainingRecord, got a {type(record).__name__}")
        return replace(self, training=record)

    # -- persistence ---------------------------------------------------------------------------
    def to_json(self, *, include_fingerprint: bool = False) -> dict[str, Any]:
        """The plan as JSON-ready data, ``digest`` included (see :func:`content_digest`); the secret-set
        fingerprint and the row binding only with ``include_fingerprint`` (a local plan file: the
        fingerprint hashes the secrets and the row digests hash the training rows, so both stay out of
        published copies)."""
        data = self._content(include_fingerprint)
        data["digest"] = content_digest(json.loads(json.dumps(data)))
        return data

    def _content(self, include_fingerprint: bool) -> dict[str, Any]:
        extra = self._local_fields() if include_fingerprint else {}
        data = {
            **extra,
            "format_version": PLAN_FORMAT_VERSION,
            "noise_multiplier": self.noise_multiplier,
            "accountant": self.accountant,
            "budget": self.budget,
            "lp_c": self.lp_c,
            "expected_batch_size": self.expected_batch_size,
            "steps": self.steps,
            "calibrated": self.calibrated,
            "summary": self.summary(),
            "lp": self.lp,
            "secrets": self.secrets.to_json(),
            "weights": self.weights.tolist(),
            "sampling_probs": self.sampling_probs.tolist(),
        }
        if self.memberships is not None:
            csr = sp.csr_matrix(self.memberships)
            data["memberships"] = {"indptr": csr.indptr.tolist(), "indices": csr.indices.tolist()}
        if self.training is not None:
            data["training"] = self.training.to_json()
        return data

    def _local_fields(self) -> dict[str, Any]:
        """What only a local plan file holds: the secret-set fingerprint and the row binding."""
        extra: dict[str, Any] = {}
        if self.secret_set_fingerprint is not None:
            extra["secret_set_fingerprint"] = self.secret_set_fingerprint
        if self.rows is not None:
            extra["rows"] = self.rows.to_json()
        return extra

    def save(self, path: str | Path, *, include_fingerprint: bool = False) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(include_fingerprint=include_fingerprint)))
        return path

    @classmethod
    def from_json(cls, data: dict[str, Any], *, source: str = "plan") -> ProtectionPlan:
        """A plan from :meth:`to_json` data; ValueError naming ``source`` and the field if it is
        malformed, or if its content no longer matches its digest (an edited plan)."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
        version = data.get("format_version")
        if isinstance(version, bool) or version not in READABLE_FORMAT_VERSIONS:
            raise ValueError(
                f"{source}: format_version={version!r} is not supported (expected one of "
                f"{READABLE_FORMAT_VERSIONS}; a newer hush_hf wrote it?)"
            )
        if version == 1 and "training" in data:
            raise ValueError(f"{source}: format_version 1 has no 'training' record")
        check_plan_fields(data, source)  # first: a hand-edited file is told which field is wrong
        check_digest(data, source)
        try:
            return cls._from_content(data)
        except KeyError as err:
            raise ValueError(f"{source}: missing field {err.args[0]!r}") from None
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: malformed plan ({err})") from None

    @classmethod
    def _from_content(cls, data: dict[str, Any]) -> ProtectionPlan:
        weights = np.asarray(data["weights"], dtype=np.float64)
        return cls(
            weights=weights,
            sampling_probs=np.asarray(data["sampling_probs"], dtype=np.float64),
            noise_multiplier=float(data["noise_multiplier"]),
            accountant=data["accountant"],
            budget=data["budget"],
            lp_c=float(data["lp_c"]),
            expected_batch_size=float(data["expected_batch_size"]),
            steps=int(data["steps"]),
            secrets=SecretReport.from_json(data["secrets"]),
            lp=dict(data.get("lp", {})),
            calibrated=data.get("calibrated", True),
            secret_set_fingerprint=data.get("secret_set_fingerprint"),
            memberships=_memberships_from_json(
                data.get("memberships"), len(data["secrets"]["target"]), weights.size
            ),
            training=TrainingRecord.from_json(data["training"]) if "training" in data else None,
            rows=RowBinding.from_json(data["rows"], weights.size) if "rows" in data else None,
        )

    @classmethod
    def load(cls, path: str | Path) -> ProtectionPlan:
        """Read a plan file; ValueError naming the file for a missing, truncated, malformed or edited one."""
        from hush_hf.jsonfile import read_json

        return cls.from_json(read_json(path, what="plan file"), source=f"plan file {str(path)!r}")

    # -- datasets ------------------------------------------------------------------------------
    def attach(self, dataset: Any, *, num_proc: int | None = None) -> Any:
        """Add ``hush_weight`` and ``hush_sampling_prob`` columns (row i gets example i's values).

        Only to the rows the plan was made from: ValueError unless ``dataset``'s rows match the plan's
        row binding (:meth:`check_rows`).
        """
        self.check_rows(dataset, what="dataset")
        weights, probs = self.weights, self.sampling_probs

        def add(_: dict, indices: list[int]) -> dict[str, list[float]]:
            return {WEIGHT_COLUMN: weights[indices].tolist(), SAMPLING_PROB_COLUMN: probs[indices].tolist()}

        return dataset.map(add, with_indices=True, batched=True, num_proc=num_proc, desc="Attaching plan")

    def check_rows(self, dataset: Any, *, what: str = "dataset") -> None:
        """ValueError unless ``dataset`` holds the rows the plan was made from, in order (one line naming
        how many rows differ and the first); a plan bound to no rows is refused."""
        if len(dataset) != self.num_examples:
            raise ValueError(
                f"{what} has {len(dataset)} rows but the plan covers {self.num_examples} examples"
            )
        if self.rows is None:
            raise unbound_plan_error(what)
        self.rows.check(dataset, what=what)

    def bound_to(self, dataset: Any) -> ProtectionPlan:
        """This plan bound to ``dataset``'s rows (:mod:`hush_hf.planning.binding`): the rows its
        ``secret_ids`` were read from, in that order. If the rows carry ``secret_ids`` (or secret marks),
        each row's must be the plan's memberships of that row."""
        if len(dataset) != self.num_examples:
            raise ValueError(
                f"dataset has {len(dataset)} rows but the plan covers {self.num_examples} examples"
            )
        if self.memberships is not None:
            check_row_memberships(self.memberships, dataset)
        return replace(self, rows=RowBinding.of(dataset))


def content_digest(data: dict[str, Any]) -> str:
    """SHA-256 of a plan's JSON content (every key but ``digest``, keys sorted, compact separators).

    Computed on parsed JSON, so a file written by :meth:`ProtectionPlan.save` verifies exactly.
    """
    body = {k: v for k, v in data.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def check_digest(data: dict[str, Any], source: str = "plan") -> None:
    """ValueError unless ``data`` carries a digest matching its content."""
    recorded = data.get("digest")
    if recorded is None:
        raise ValueError(
            f"{source} has no digest, so edits to it cannot be detected; hush_hf writes one into every "
            "plan it saves: re-create the plan (`hush plan` or ProtectionPlan.save)"
        )
    if recorded != content_digest(data):
        raise ValueError(
            f"{source} was edited after hush_hf wrote it: its content does not match its digest. "
            "A plan's numbers (noise multiplier, sampling probabilities, targets) must not be changed by "
            "hand; re-create the plan with `hush plan` (or plan_protection) with the settings you want"
        )


def _memberships_from_json(data: Any, num_secrets: int, num_examples: int) -> sp.csr_matrix | None:
    if data is None:
        return None
    indptr = np.asarray(data["indptr"], dtype=np.int64)
    indices = np.asarray(data["indices"], dtype=np.int64)
    if (
        indptr.size != num_secrets + 1
        or indptr[0] != 0
        or np.any(np.diff(indptr) < 0)
        or indptr[-1] != indices.size
        or np.any((indices < 0) | (indices >= num_examples))
    ):
        raise ValueError("memberships do not describe the plan's secrets and examples")
    ones = np.ones(indices.size, dtype=np.float64)
    return sp.csr_matrix((ones, indices, indptr), shape=(num_secrets, num_examples))


def plan_protection(
    secret_ids: Any,
    priors: np.ndarray,
    targets: np.ndarray,
    *,
    expected_batch_size: float,
    steps: int,
    lp_c: float = 1.0,
    accountant: str = DEFAULT_ACCOUNTANT,
    budget: str | None = None,
    solver: str = "highs",
    drop_secretless: bool = False,
    gap_tol: float = 1e-2,
    time_limit: float | None = None,
    noise_multiplier: float | None = None,
    rtol: float = 1e-4,
    progress: bool = False,
    allow_unmatched: bool = False,
    secret_set_fingerprint: str | None = None,
) -> ProtectionPlan:
    """Solve the LP (Hush eq. 1), set rho_i = B w_i / sum(w), and calibrate sigma (Alg. 2, lines 1-5).

    ``secret_ids``: the tagged ``datasets.Dataset`` itself (its ``secret_ids`` column, in its current
    row order; the plan is then bound to its rows, see :meth:`ProtectionPlan.bound_to`, and can be used
    with them), or one list of secret indices per example (a ``datasets`` column works; the plan is
    then bound to no rows, e.g. for a sweep).
    ``priors``/``targets``: p_j and r_j per secret (e.g. ``SecretSet.priors``/``.targets``).
    ``budget``: the LP's per-secret budget, ``c * budget_j``; default follows the accountant
    (``sqrt(mu_j)`` for kl, ``g_j = Phi^-1(1-p_j) - Phi^-1(1-r_j)`` for tight and rdp, since sigma_j is
    linear in sum(rho) with those slopes, docs/design.md#lp-budgets); ``"paper"``: mu_j, as in the paper.
    ``noise_multiplier``: None calibrates; a number is used as is and the plan reports the bounds it
    gives (``meets_targets`` says whether every target holds).
    ``allow_unmatched``: a secret that marks no example is an error unless this is set (its sigma
    would be 0: most likely its terms were mistyped or the data was tagged with another secret set);
    accepted, the plan counts them (``unmatched_secrets``). ``secret_set_fingerprint``: recorded in
    the plan (``SecretSet.fingerprint``) so it is never used with data tagged by another secret set.
    """
    priors, targets = np.asarray(priors, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    _validate_plan_args(expected_batch_size, steps, lp_c, accountant, noise_multiplier)
    rows, secret_ids = _rows_and_secret_ids(secret_ids)
    budget = budget or get_accountant(accountant).lp_budget
    if budget not in LP_BUDGET_KINDS:
        raise ValueError(f"budget must be one of {LP_BUDGET_KINDS}, got {budget!r}")
    capacity = lp_c * lp_budget(priors, targets, budget)  # validates priors and targets

    membership = membership_matrix(secret_ids, num_secrets=priors.size)
    check_matches(membership, allow_unmatched=allow_unmatched)
    start = time.perf_counter()
    solution = solve_example_weights(
        membership,
        capacity,
        solver=solver,
        gap_tol=gap_tol,
        time_limit=time_limit,
        drop_secretless=drop_secretless,
        progress=progress,
    )
    logger.info(
        "LP: %d examples x %d secrets, retained weight %.4g, certified gap %.2e, %.1f s",
        membership.shape[1],
        membership.shape[0],
        solution.objective,
        solution.gap,
        time.perf_counter() - start,
    )
    rho = sampling_probabilities(solution.weights, expected_batch_size)
    groups = SecretGroups.from_membership(membership, rho)
    if noise_multiplier is None:
        calibration = calibrate_noise(
            groups, priors, targets, steps, accountant=accountant, rtol=rtol, progress=progress
        )
        sigma, bounds = calibration.sigma, calibration.bounds
    else:
        sigma = float(noise_multiplier)
        # Exact per-secret evaluation costs ~20-50 ms a distinct secret (tight); beyond a few hundred
        # secrets, envelopes at 1e-3 relative resolution give valid, marginally larger bounds.
        resolution = 0.0 if priors.size <= 500 else 1e-3
        bounds = posterior_bounds(groups, priors, sigma, steps, accountant=accountant, resolution=resolution)
    logger.info(
        "Noise multiplier %.6g (%s accountant, T=%d, B=%g)", sigma, accountant, steps, expected_batch_size
    )
    return ProtectionPlan(
        weights=solution.weights,
        sampling_probs=rho,
        noise_multiplier=float(sigma),
        accountant=accountant,
        budget=budget,
        lp_c=float(lp_c),
        expected_batch_size=float(expected_batch_size),
        steps=int(steps),
        secrets=SecretReport(
            num_examples=groups.sizes.astype(np.int64),
            sum_rho=groups.sum_rho(),
            prior=priors,
            target=targets,
            bound=np.asarray(bounds, dtype=np.float64),
        ),
        lp={
            "solver": solution.solver,
            "status": solution.status,
            "objective": float(solution.objective),
            "upper_bound": float(solution.upper_bound),
            "gap": float(solution.gap),
            "seconds": float(solution.seconds),
            "drop_secretless": bool(drop_secretless),
        },
        calibrated=noise_multiplier is None,
        secret_set_fingerprint=secret_set_fingerprint,
        memberships=membership,
        rows=None if rows is None else RowBinding.of(rows),
    )


def _rows_and_secret_ids(secret_ids: Any) -> tuple[Any, Any]:
    """(the dataset, its secret_ids column in row order) for a ``datasets.Dataset``; (None, as given) else."""
    import sys

    datasets = sys.modules.get("datasets")
    if datasets is None or not isinstance(secret_ids, datasets.Dataset):
        return None, secret_ids
    if SECRET_IDS_COLUMN not in secret_ids.column_names:
        raise ValueError(
            f"the dataset has no '{SECRET_IDS_COLUMN}' column (columns: {secret_ids.column_names}); tag it "
            "first (hush_hf.secrets.tag_dataset) or derive it from secret marks (secret_ids_from_marks)"
        )
    from hush_hf.data import arrow_columns
    from hush_hf.secrets.marks import find_marks_column
    from hush_hf.secrets.tagging import VOUCHED, check_secret_ids_current, unchecked_tokens

    unchecked = check_secret_ids_current(secret_ids)  # ids tagged from other text than the rows hold: refused
    unchecked = unchecked or unchecked_tokens(secret_ids)
    # Ids beside marks are checked against them when the plan binds the rows (check_row_memberships).
    if unchecked and secret_ids not in VOUCHED and find_marks_column(secret_ids.column_names) is None:
        warnings.warn(unchecked, UserWarning, stacklevel=3)
        logger.warning(unchecked)
    return secret_ids, arrow_columns(secret_ids, [SECRET_IDS_COLUMN])[0][1]


def check_row_memberships(memberships: sp.csr_matrix, dataset: Any, *, what: str = "dataset") -> None:
    """ValueError unless each row's ``secret_ids`` (or the secrets its marks name) are exactly the
    plan's memberships of that row; a dataset with neither is not checked here."""
    from hush_hf.data import arrow_columns, column_names
    from hush_hf.secrets.marks import MARKS_PREFIX, secret_ids_from_marks

    names = column_names(dataset)
    marks = [c for c in names if c.startswith(MARKS_PREFIX)]
    if marks:
        ids, source = secret_ids_from_marks(arrow_columns(dataset, marks[:1])[0][1]), "secret marks"
    elif SECRET_IDS_COLUMN in names:
        ids, source = arrow_columns(dataset, [SECRET_IDS_COLUMN])[0][1], f"'{SECRET_IDS_COLUMN}'"
    else:
        return
    rows = differing_memberships(memberships, ids)
    if rows.size:
        raise ValueError(
            f"{what}'s {source} differ from the plan's memberships at {rows.size} rows (first: row "
            f"{int(rows[0])}): these are not the rows the plan was made from, in that order"
        )


def differing_memberships(memberships: sp.csr_matrix, secret_ids: Any) -> np.ndarray:
    """Rows whose secret ids (one list per row, as many rows as the plan has examples) differ from the
    plan's memberships of that row; an id the plan does not know is an error naming its row."""
    ours = membership_matrix(secret_ids, memberships.shape[0])
    if ours.shape != memberships.shape:
        raise ValueError(f"secret_ids cover {ours.shape[1]} rows but the plan covers {memberships.shape[1]}")
    difference = abs(ours - sp.csr_matrix(memberships)).tocoo()
    return np.unique(difference.col[difference.data != 0]).astype(np.int64)


def check_matches(membership: Any, *, allow_unmatched: bool) -> None:
    """Refuse secrets that mark no example (unless allowed) and report over-tagging.

    ``membership``: the (secrets x examples) 0/1 matrix. Logs the share of examples the secrets mark
    (max and median) and warns, naming indices, when a secret marks more than 5% of the examples (a
    short or common term: every such example is trained with that secret's noise budget).
    """
    counts = np.asarray(membership.getnnz(axis=1)).ravel()
    examples = max(membership.shape[1], 1)
    unmatched = np.flatnonzero(counts == 0)
    if unmatched.size and not allow_unmatched:
        shown = ", ".join(f"#{j}" for j in unmatched[:10].tolist())
        more = f" and {unmatched.size - 10} more" if unmatched.size > 10 else ""
        raise ValueError(
            f"{unmatched.size} secret(s) mark no example (secret {shown}{more}): their terms never occur "
            "in the data, so nothing would protect them if they are there in another form; check the "
            "terms, or accept with allow_unmatched_secrets=True (hush plan: --allow-unmatched)"
        )
    if unmatched.size:
        logger.warning("%d of %d secrets mark no example (accepted)", unmatched.size, counts.size)
    share = counts / examples
    logger.info(
        "secrets mark %.3g%% of the examples at most (median %.3g%%)",
        100 * share.max(initial=0.0),
        100 * float(np.median(share)) if share.size else 0.0,
    )
    over = np.flatnonzero(share > OVERTAGGING_SHARE)
    if over.size:
        order = over[np.argsort(-share[over], kind="stable")]
        shown = ", ".join(f"#{j} ({100 * share[j]:.1f}%)" for j in order[:10].tolist())
        more = f" and {over.size - 10} more" if over.size > 10 else ""
        message = (
            f"{over.size} secret(s) each mark more than {100 * OVERTAGGING_SHARE:g}% of the examples: "
            f"secret {shown}{more}; a short or common term (e.g. a two-letter code) over-tags, which "
            "costs utility: give such secrets longer terms or a pattern"
        )
        warnings.warn(message, UserWarning, stacklevel=3)
        logger.warning(message)


def _validate_plan_args(
    expected_batch_size: float, steps: int, lp_c: float, accountant: str, noise_multiplier: float | None
) -> None:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps (T) must be an integer >= 1, got {steps!r}")
    if not (
        isinstance(expected_batch_size, (int, float, np.number))
        and np.isfinite(expected_batch_size)
        and expected_batch_size > 0
    ):
        raise ValueError(f"expected_batch_size (B) must be a positive number, got {expected_batch_size!r}")
    if not (isinstance(lp_c, (int, float, np.number)) and np.isfinite(lp_c) and lp_c > 0):
        raise ValueError(f"lp_c must be a positive number, got {lp_c!r}")
    get_accountant(accountant)  # ValueError listing the registered names
    if noise_multiplier is not None and not (np.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(f"noise_multiplier must be None or a number >= 0, got {noise_multiplier!r}")
