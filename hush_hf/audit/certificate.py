"""Binding a certificate to the weights it certifies, and checking the published files against it.

A run publishes its plan with a training record (``hush_hf.planning.record``): the sigma and DP steps
the weights went through and the weights' SHA-256 digests. :func:`certify` makes that record for the
files in a folder and recomputes every bound at it. The privacy report (``"certificate"``) and the
model card's YAML metadata (``hush_hf:``) carry the same machine-readable block
(:func:`certificate_block`): the plan's digest, the weights' digests, sigma, the DP steps, and whether
every target holds with the worst bound / target. ``hush verify`` recomputes the block from the plan
and the weights and compares it, the report's numbers and the card's guarantee text with what the
recomputation gives (:func:`check_card`, :func:`check_report`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hush_hf.planning.consistency import RTOL, Check

CARD_METADATA_KEY = "hush_hf"
CERTIFICATE_VERSION = 1
#: The card's and the Markdown report's guarantee text ends where these unverifiable parts start
#: (redaction claims rest on a recall the user measured; attacks on the model are empirical).
UNCHECKED_HEADINGS = ("\n### Redaction (CRT)", "\n### Evaluation", "\n### Audit")


def certify(plan: Any, folder: str | Path, *, noise_multiplier: float | None, dp_steps: int | None,
            clip_norm: float, public_steps: int | None = None, verification: Any = None) -> tuple[Any, Any]:
    """(``plan`` carrying the training record of the weights in ``folder``, its bounds recomputed at the
    record; the :class:`~hush_hf.planning.verification.Verification` behind them).

    ``noise_multiplier``: the sigma training used; ``dp_steps``: the DP steps the weights went through;
    ``public_steps``: CRT public steps. None takes each from the plan's training record (e.g. a published
    plan, re-certified with an audit added); without a record, sigma defaults to the plan's and
    ``dp_steps`` is required. ``verification``: bounds already recomputed, reused when made at that
    sigma and that many steps.
    """
    from hush_hf.planning.record import TrainingRecord, weight_digests
    from hush_hf.planning.verification import certified_bounds

    record = plan.training
    if dp_steps is None:
        if record is None:
            raise ValueError("dp_steps is required: the number of DP steps the weights went through (the "
                             "plan has no training record to take it from)")
        dp_steps = record.dp_steps
    if public_steps is None:
        public_steps = record.public_steps if record is not None else 0
    if noise_multiplier is None:
        noise_multiplier = record.noise_multiplier if record is not None else plan.noise_multiplier
    sigma = float(noise_multiplier)
    folder = Path(folder)
    weights = weight_digests(folder) if folder.is_dir() else {}
    plan = plan.with_training(TrainingRecord(sigma, dp_steps, clip_norm, public_steps, weights))
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
        "planned_steps": int(plan.steps),
        "accountant": plan.accountant,
        "secrets": int(plan.num_secrets),
        "meets_targets": bool(verification.meets_targets),
        "max_bound_over_target": float(ratio.max(initial=0.0)),
    }


def guarantee_text(markdown: str) -> str:
    """The part of a card section or Markdown report up to its first unverifiable heading."""
    cut = min((k for k in (markdown.find(h) for h in UNCHECKED_HEADINGS) if k >= 0), default=len(markdown))
    return markdown[:cut].rstrip()


def check_card(path: str | Path, block: Mapping[str, Any], report: Mapping[str, Any]) -> Check:
    """The card's ``hush_hf`` metadata equals ``block`` and its Secret protection text, up to the
    attacks and redaction parts, is the one ``report`` (the recomputed report) gives."""
    from huggingface_hub.repocard import metadata_load

    from hush_hf.audit.card import SECTION_END, SECTION_START, protection_section
    from hush_hf.jsonfile import first_difference

    path = Path(path)
    name = f"card {path.name}"
    if not path.is_file():
        return Check(name, None, "absent: no card states this certificate")
    try:
        metadata = metadata_load(path) or {}
    except Exception as err:  # noqa: BLE001  (yaml errors have no common base besides Exception)
        return Check(name, False, f"its YAML metadata cannot be read: {' '.join(str(err).split())[:200]}")
    stated = metadata.get(CARD_METADATA_KEY) if isinstance(metadata, Mapping) else None
    if stated is None:
        return Check(name, False, f"no '{CARD_METADATA_KEY}' block in its metadata: it states no certificate")
    difference = first_difference(stated, block, rtol=RTOL, path=CARD_METADATA_KEY)
    if difference is not None:
        return Check(name, False, f"metadata {difference}")
    text = path.read_text(encoding="utf-8")
    start, end = text.find(SECTION_START), text.find(SECTION_END)
    if start < 0 or end < start:
        return Check(name, False, "no Secret protection section")
    found = guarantee_text(text[start:end])
    expected = guarantee_text(protection_section(report))
    if found != expected:
        return Check(name, False, "its Secret protection text differs from the recomputed one: "
                                  + _first_differing_line(found, expected))
    return Check(name, True, "metadata and Secret protection text agree with the recomputation")


def check_report(path: str | Path, report: Mapping[str, Any]) -> Check:
    """privacy_report.json's certificate, training and secrets sections equal ``report``'s (the recomputed
    report), and privacy_report.md beside it states the same guarantee text."""
    from hush_hf.audit.report import REPORT_MARKDOWN, guarantee_lines
    from hush_hf.jsonfile import first_difference, read_json

    path = Path(path)
    name = f"privacy report {path.name}"
    if not path.is_file():
        return Check(name, None, "absent: not checked")
    written = read_json(path, what="privacy report")
    if not isinstance(written, Mapping):
        return Check(name, False, "not a JSON object")
    for key in ("certificate", "training", "secrets"):
        difference = first_difference(written.get(key), report.get(key), rtol=RTOL, path=key)
        if difference is not None:
            return Check(name, False, difference)
    markdown = path.with_name(REPORT_MARKDOWN)
    if markdown.is_file():
        expected = "\n".join(guarantee_lines(report))
        if expected not in markdown.read_text(encoding="utf-8"):
            return Check(name, False, f"{REPORT_MARKDOWN} does not state the recomputed guarantee (its "
                                      "'Guarantee' numbers differ)")
    return Check(name, True, "its certificate, training and secrets sections agree with the recomputation"
                             + (f" (and {REPORT_MARKDOWN})" if markdown.is_file() else ""))


def _first_differing_line(found: str, expected: str) -> str:
    a, b = found.splitlines(), expected.splitlines()
    for k in range(max(len(a), len(b))):
        x, y = (a[k] if k < len(a) else "<none>"), (b[k] if k < len(b) else "<none>")
        if x != y:
            return f"line {k + 1}: {x[:80]!r}, expected {y[:80]!r}"
    return "(same lines)"


def recomputed_report(plan: Any, verification: Any, certificate: Mapping[str, Any] | None) -> dict[str, Any]:
    """The report the recomputation gives (no attacks, no CRT section: the parts compared with the
    published report and card do not depend on them)."""
    from hush_hf.audit.report import build_privacy_report

    certified = plan.with_bounds(np.asarray(verification.bound))
    return build_privacy_report(certified, clip_norm=None, certificate=certificate, bounds_verified=True)
