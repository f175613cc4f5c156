"""Binding a certificate to the weights it certifies, and checking the published files against it.

A run publishes its plan with a training record (``hush_hf.planning.record``): the sigma and DP steps
the weights went through and the weights' SHA-256 digests. :func:`certify` makes that record for the
files in a folder and recomputes every bound at it. The privacy report (``"certificate"``) and the
model card's YAML metadata (``hush_hf:``) carry the same machine-readable block
(:func:`certificate_block`): the plan's digest, the weights' digests, sigma, the DP steps, where the
DP seed came from (``dp_seed_source``: ``"drawn"`` by hush_hf, set by the ``"user"``, or ``"unknown"``
for a record written before the field existed), and whether every target holds with the worst
bound / target. ``hush verify`` recomputes the block from the plan
and the weights and compares it, the whole report and the card's whole section with what the
recomputation gives (``hush_hf.audit.published``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

CARD_METADATA_KEY = "hush_hf"
CERTIFICATE_VERSION = 2  # 2 adds dp_seed_source


def certify(plan: Any, folder: str | Path, *, noise_multiplier: float | None, dp_steps: int | None,
            clip_norm: float, public_steps: int | None = None, dp_seed_source: str | None = None,
            verification: Any = None) -> tuple[Any, Any]:
    """(``plan`` carrying the training record of the weights in ``folder``, its bounds recomputed at the
    record; the :class:`~hush_hf.planning.verification.Verification` behind them).

    ``noise_multiplier``: the sigma training used; ``dp_steps``: the DP steps the weights went through;
    ``public_steps``: CRT public steps. None takes each from the plan's training record (e.g. a published
    plan, re-certified with an audit added; ``clip_norm`` must then be the record's, never rewritten);
    without a record, sigma defaults to the plan's and ``dp_steps`` is required. ``dp_seed_source``:
    ``"drawn"`` or ``"user"`` (:class:`~hush_hf.planning.record.TrainingRecord`); None is unknown for
    new weights, and re-certifying (``dp_steps`` None) keeps the record's (another one is refused).
    ``verification``: bounds already recomputed, reused when made at that sigma and that many steps.
    """
    from hush_hf.planning.record import TrainingRecord, weight_digests
    from hush_hf.planning.verification import certified_bounds

    record = plan.training
    if dp_steps is None:
        if record is None:
            raise ValueError("dp_steps is required: the number of DP steps the weights went through (the "
                             "plan has no training record to take it from)")
        if clip_norm != record.clip_norm:  # re-certifying the same weights: the record says how they trained
            raise ValueError(f"clip_norm={clip_norm!r} contradicts the plan's training record, which says "
                             f"the weights were trained with C={record.clip_norm!r}; pass clip_norm="
                             f"{record.clip_norm!r}")
        dp_steps = record.dp_steps
        if dp_seed_source is not None and dp_seed_source != record.dp_seed_source:
            raise ValueError(f"dp_seed_source={dp_seed_source!r} contradicts the plan's training record, "
                             f"which says the seed was {record.stated_seed_source!r}; leave dp_seed_source "
                             "unset")
        dp_seed_source = record.dp_seed_source
    if public_steps is None:
        public_steps = record.public_steps if record is not None else 0
    if noise_multiplier is None:
        noise_multiplier = record.noise_multiplier if record is not None else plan.noise_multiplier
    sigma = float(noise_multiplier)
    folder = Path(folder)
    weights = weight_digests(folder) if folder.is_dir() else {}
    plan = plan.with_training(TrainingRecord(sigma, dp_steps, clip_norm, public_steps, weights,
                                             dp_seed_source=dp_seed_source))
    if verification is None or (verification.noise_multiplier, verification.steps) != (sigma, dp_steps):
        verification = certified_bounds(plan)
    return plan.with_bounds(verification.bound), verification


def certificate_block(plan: Any, plan_digest: str, verification: Any) -> dict[str, Any]:
    """What the card's metadata and the report state about the certificate, for machines to compare."""
    record = plan.training
    if record is None:
        raise ValueError("the plan has no training record: it certifies no model")
    ratio = verification.bound / verification.target
    return {
        "format_version": CERTIFICATE_VERSION,
        "plan_digest": plan_digest,
        "weights": dict(sorted(record.weights.items())),
        "noise_multiplier": float(record.noise_multiplier),
        "dp_steps": int(record.dp_steps),
        "dp_seed_source": record.stated_seed_source,
        "planned_steps": int(plan.steps),
        "accountant": plan.accountant,
        "secrets": int(plan.num_secrets),
        "meets_targets": bool(verification.meets_targets),
        "max_bound_over_target": float(ratio.max(initial=0.0)),
    }


def recomputed_report(plan: Any, verification: Any, certificate: Mapping[str, Any] | None) -> dict[str, Any]:
    """The report the recomputation gives (no attacks, no CRT section, no evaluation note: verify takes
    those from the published report, ``hush_hf.audit.published``)."""
    from hush_hf.audit.report import build_privacy_report

    certified = plan.with_bounds(np.asarray(verification.bound))
    return build_privacy_report(certified, clip_norm=None, certificate=certificate, bounds_verified=True)
