"""The Hugging Face model card's "Secret protection" section, and everything written beside the weights.

Built offline with ``huggingface_hub.ModelCard`` from a template string (never fetched). The section
states the guarantee of Hush (Ganesh et al. 2025, Def. 3.1) for this model in plain words, with the
numbers it rests on and the audit's results; secrets appear as counts and statistics only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hush_hf.audit.certificate import CARD_METADATA_KEY, certificate_block, certify
from hush_hf.audit.report import (
    build_privacy_report,
    check_attacks,
    check_clip_norm,
    check_noise_multiplier,
    crt_lines,
    guarantee_lines,
    seed_warning,
    void_warning,
    write_privacy_report,
)

PLAN_FILE = "hush_plan.json"
CARD_FILE = "README.md"
SECTION_START = "<!-- hush_hf: secret protection (generated; edits here are overwritten) -->"
SECTION_END = "<!-- hush_hf: end of secret protection -->"
CARD_TAGS = ("hush_hf", "secret-protection", "dp-sgd")

def _accountant_words(name: str) -> str:
    """The registry's one-sentence description of accountant ``name`` (the name itself if unregistered)."""
    from hush_hf.accounting.accountants import REGISTRY

    entry = REGISTRY.get(name)
    return entry.description if entry is not None else name


CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ model_name }}

This model was trained with hush_hf (per-secret reconstruction protection for Hugging Face training,
after Ganesh et al. 2025, "Hush! Protecting Secrets During Model Training").

{{ protection_section }}
"""


def _fmt(value: Any) -> str:
    return "n/a" if value is None else format(value, ".4g")


def protection_section(report: Mapping[str, Any]) -> str:
    """The Markdown of the "Secret protection" section, between markers so it can be replaced."""
    t, s = report.get("training"), report.get("secrets")
    lines = [SECTION_START, "## Secret protection", ""]
    if t is None or s is None:
        lines += ["No protection plan was recorded for this model: it carries **no** secret-protection "
                  "guarantee."]
    elif not t["bounds_hold"] and not s["meets_targets"]:
        lines += [void_warning(t), "", "The model therefore carries **no** certified secret protection; "
                  "the plan's numbers are listed for reference only.", "", "### Numbers", "",
                  *guarantee_lines(report)]
    else:
        lines += [
            f"The training data contained **{s['count']} protected secrets**, numbered 0..{s['count'] - 1}; "
            "their contents are not published here or anywhere in this repository."
            + (f" **{s['unmatched']} of them matched no training example**: their bounds hold only if "
               "they occur in no form the tagger missed." if s.get("unmatched") else ""),
            "",
            "**What is guaranteed.** For each secret j, an attacker who knows everything about the training "
            "data except that secret, and who could guess it with probability at most its prior p_j without "
            "the model, guesses it with probability at most its certified bound b_j using this model "
            "(its weights, or anything computed from them). "
            + ("Each bound is at most the target r_j set for that secret. " if s["meets_targets"] else "")
            + f"Targets range from {_fmt(s['target']['min'])} to {_fmt(s['target']['max'])} "
            f"(median {_fmt(s['target']['median'])}); certified bounds from {_fmt(s['bound']['min'])} to "
            f"{_fmt(s['bound']['max'])} (median {_fmt(s['bound']['median'])}); priors from "
            f"{_fmt(s['prior']['min'])} to {_fmt(s['prior']['max'])}.",
            "",
        ]
        if not s["meets_targets"]:
            lines += [f"**WARNING: {s['num_over_target']} secret(s) have a certified bound above their "
                      "target; for those, only the (weaker) bound holds.**", ""]
        if warning := seed_warning(t):
            lines += [warning, ""]
        lines += [
            "**How.** Examples were weighted by a linear program and drawn by weighted Poisson sampling "
            f"(expected batch size B = {_fmt(t['expected_batch_size'])}, T = {t['steps']} DP steps"
            + (f" of the {t['planned_steps']} planned" if t.get("planned_steps", t["steps"]) != t["steps"]
               else "") + ", "
            f"{t['retained_fraction']:.2%} of {t['examples']} examples kept with a non-zero weight); each "
            f"example's gradient was clipped to norm C = {_fmt(t['clip_norm'])} and Gaussian noise of "
            f"standard deviation sigma*C = {_fmt(t['noise_multiplier'])} * {_fmt(t['clip_norm'])} was "
            f"added to each step's summed gradient (DP-SGD). The bounds were computed with the "
            f"`{t['accountant']}` accountant: {_accountant_words(t['accountant'])}."
            + _seed_sentence(t.get("dp_seed_source")),
            "",
            "**What is not guaranteed.** The guarantee covers a secret's occurrences in the examples tagged "
            "as containing it; it does not hide which examples contain secrets, or that an example was "
            "trained on (membership is public under this definition); it holds only against an attacker "
            "who does not know the secret seed the batches and the noise were drawn from; and only if "
            "training followed the plan (`hush_plan.json`) and its training record (the sigma and DP steps "
            "above) exactly, for the weight files whose SHA-256 digests the plan records.",
            "",
            "### Numbers", "",
            *guarantee_lines(report),
        ]
    if report.get("crt"):
        lines += ["", "### Redaction (CRT)", "", *crt_lines(report["crt"])]
    if report.get("evaluation"):
        lines += ["", "### Evaluation", "", evaluation_line(report["evaluation"])]
    lines += ["", "### Audit", ""]
    lines += _audit_lines(report.get("attacks") or {})
    if t is not None and s is not None:
        lines += ["", "### Check it yourself", "",
                  "Every bound above was recomputed from the plan when this model was saved. To recompute "
                  "them again from the files in this repository (the plan's sampling probabilities, which "
                  "examples contain which secret, and its training record: the noise and the number of DP "
                  "steps), and to check that the weights, this card and the privacy report are the ones the "
                  "plan certifies, install hush_hf and run, in a download of this repository:", "",
                  "```bash", "pip install hush-hf", "hush verify .", "```", "",
                  "It prints each secret's target against its recomputed bound and exits with status 0 when "
                  "every target holds and every check passes, 1 otherwise; a DP seed hush_hf did not draw "
                  "(set by the user, or of unknown origin) is printed as a warning, and fails with "
                  "`--require-drawn-seed`. With the training data and the "
                  "secrets file at hand, `hush verify . --dataset DATA --secrets SECRETS` also recomputes "
                  "which examples contain which secret and compares every secret's prior and target."]
    lines += ["", "Full report: `privacy_report.md` / `privacy_report.json`; plan: `hush_plan.json`.",
              SECTION_END, ""]
    return "\n".join(lines)


def _seed_sentence(source: str | None) -> str:
    """Where the batches' and the noise's seed came from, for the "How." paragraph."""
    if source is None:
        return ""
    if source == "drawn":
        return (" The batches and the noise were drawn from a secret seed that hush_hf drew from the "
                "operating system at train start (128 bits) and wrote to no published file.")
    origin = ("set by the user (`dp_seed`), not drawn by hush_hf" if source == "user" else
              "whose origin the training record does not state")
    return f" The batches and the noise were drawn from a seed {origin} (see the warning above)."


def evaluation_line(evaluation: Mapping[str, Any]) -> str:
    """Evaluations on rows holding secrets are outside the guarantee (:mod:`hush_hf.trainer.evaluation`)."""
    rows, unchecked = evaluation["rows_with_secrets"], evaluation["unchecked"]
    where = [f"{rows} rows that hold protected secrets"] if rows else []
    where += [f"data that could not be checked for secrets ({', '.join(unchecked)})"] if unchecked else []
    return (f"**Evaluation metrics are not covered.** The evaluations run during training "
            f"({', '.join(evaluation['evaluations'])}) included {' and '.join(where)}. Metrics on such rows "
            "(eval loss, perplexity, ...) are computed from the rows themselves, without noise: the "
            "guarantee above does not extend to them or to a checkpoint chosen by them.")


def _audit_lines(attacks: Mapping[str, Any]) -> list[str]:
    lines = []
    if exposure := attacks.get("exposure"):
        ins = exposure["inserted"]
        lines.append(f"- Canary exposure: max {_fmt(ins['max'])} bits over {ins['count']} inserted canaries "
                     f"(chance ~{exposure['chance_mean']:.2f} bits, "
                     f"maximum {_fmt(exposure['max_possible'])}).")
    if extraction := attacks.get("extraction"):
        lines.append(f"- Extraction: {extraction['num_extracted']} of {extraction['num_sequences']} training "
                     f"sequences reproduced ({extraction['prefix_length']}-token prompts, "
                     f"{extraction['suffix_length']} tokens greedy).")
    for result in attacks.get("membership") or []:
        tprs = ", ".join(f"TPR {_fmt(v)} at FPR {k}" for k, v in result["tpr_at_fpr"].items())
        lines.append(f"- Membership inference ({result['attack']}): AUC {_fmt(result['auc'])}; {tprs}.")
    if reconstruction := attacks.get("reconstruction"):
        lines.append(f"- Secret reconstruction: the true value ranked first among its candidates for "
                     f"{reconstruction['num_ranked_first']} of {reconstruction['num_evaluated']} secrets "
                     f"probed; mean posterior {_fmt(reconstruction['mean_probability'])} against a uniform "
                     f"guess {_fmt(reconstruction['mean_candidate_prior'])} and a certified bound at that "
                     f"prior of {_fmt(reconstruction.get('mean_bound_at_candidate_prior'))}.")
    for name, why in (attacks.get("not_run") or {}).items():
        lines.append(f"- {name}: not run ({why}).")
    return lines or ["No attacks have been run on this model yet (`hush audit`)."]


def build_model_card(report: Mapping[str, Any], *, model_name: str | None = None,
                     existing: str | Path | None = None) -> Any:
    """A ``huggingface_hub.ModelCard`` with the Secret protection section, and the report's certificate
    block (if any) as the ``hush_hf`` entry of its YAML metadata.

    With ``existing`` (a README.md, e.g. written by ``Trainer.create_model_card``) its metadata and
    text are kept and the section is appended, or replaced if a previous one is there.
    """
    from huggingface_hub import ModelCard, ModelCardData

    section = protection_section(report)
    if existing is not None and Path(existing).is_file():
        card = ModelCard.load(Path(existing))  # a local path: read, never fetched
        pattern = re.compile(re.escape(SECTION_START) + ".*?" + re.escape(SECTION_END), re.DOTALL)
        text = card.text
        if pattern.search(text):
            card.text = pattern.sub(lambda _: section, text)
        else:
            card.text = text.rstrip() + "\n\n" + section
        tags = list(card.data.tags or [])
        card.data.tags = tags + [t for t in CARD_TAGS if t not in tags]
        card.data.pop(CARD_METADATA_KEY, None)  # a previous run's block never survives
        if report.get("certificate") is not None:
            card.data[CARD_METADATA_KEY] = dict(report["certificate"])
        return card
    block = {CARD_METADATA_KEY: dict(report["certificate"])} if report.get("certificate") is not None else {}
    data = ModelCardData(library_name="transformers", tags=list(CARD_TAGS), model_name=model_name, **block)
    return ModelCard.from_template(data, template_str=CARD_TEMPLATE, model_name=model_name or "Model",
                                   protection_section=section)


def write_protection_artifacts(output_dir: str | Path, plan: Any, *, clip_norm: float,
                               dp_steps: int | None = None, public_steps: int | None = None,
                               noise_multiplier: float | None = None, dp_seed_source: str | None = None,
                               verification: Any = None, report: Mapping[str, Any] | None = None,
                               model_name: str | None = None,
                               crt: Mapping[str, Any] | None = None,
                               evaluation: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """Write README.md (card), hush_plan.json, privacy_report.json/.md and plots beside the weights
    already saved in ``output_dir``.

    What ``SecretProtectionTrainer.save_model``/``push_to_hub`` call after saving the weights. The plan
    written carries the training record (:func:`hush_hf.audit.certificate.certify`): sigma
    (``noise_multiplier``, the sigma training used; below the plan's, the card says the bounds do NOT
    hold), ``dp_steps`` (the DP steps the saved weights went through), ``public_steps`` (CRT public
    steps among the optimizer steps), ``clip_norm`` (the trainer's ``per_example_clip_norm``),
    ``dp_seed_source`` (``"drawn"`` by hush_hf or set by the ``"user"``; None: unknown, and the card
    warns) and the SHA-256 of every weight file in ``output_dir``. None takes sigma, ``dp_steps`` and
    ``public_steps`` from the plan's own record (a published plan: e.g. to add an audit to its card;
    with ``dp_steps`` None the seed's source is the record's too); a plan without one needs
    ``dp_steps`` and defaults sigma to the plan's. Every bound
    written is recomputed at that sigma and ``dp_steps`` (``verification``: the trainer's bounds at
    train start, reused when made at the same sigma and steps). The report and the card's YAML
    metadata carry the certificate block (``hush verify`` compares them). ``report`` is a ``run_audit``
    result (or its attacks); ``crt`` a CRT section (``hush_hf.crt.crt_section``); ``evaluation`` the
    evaluations run on rows holding secrets (``hush_hf.trainer.evaluation.EvaluationCoverage.card_section``).
    An existing README.md keeps its content; the Secret protection section is added or replaced.
    """
    clip_norm = check_clip_norm(clip_norm)
    attacks = check_attacks(report)
    noise_multiplier = check_noise_multiplier(noise_multiplier)
    output_dir = Path(output_dir)
    plan, verification = certify(plan, output_dir, noise_multiplier=noise_multiplier, dp_steps=dp_steps,
                                 clip_norm=clip_norm, public_steps=public_steps,
                                 dp_seed_source=dp_seed_source, verification=verification)
    plan_json = plan.to_json()
    block = certificate_block(plan, plan_json["digest"], verification)
    privacy_report = build_privacy_report(plan, clip_norm=clip_norm, attacks=attacks, model_name=model_name,
                                          crt=crt, bounds_verified=True,  # validates before writing
                                          certificate=block)
    if evaluation:
        privacy_report["evaluation"] = dict(evaluation)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {"plan": output_dir / PLAN_FILE}
    paths["plan"].write_text(json.dumps(plan_json))
    paths.update(write_privacy_report(privacy_report, output_dir, plan=plan))
    card_path = output_dir / CARD_FILE
    build_model_card(privacy_report, model_name=model_name, existing=card_path).save(card_path)
    paths["card"] = card_path
    return paths
