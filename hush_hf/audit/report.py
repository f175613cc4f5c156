"""The privacy report: the plan's guarantee and the attacks' results as JSON and Markdown (no secrets).

The report is built from numbers only: the plan's scalars and per-secret arrays (secrets are indices)
and attack results produced by this package. :func:`render_report` is what ``hush report`` calls.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hush_hf import __version__

REPORT_FORMAT_VERSION = 1
ATTACK_NAMES = ("exposure", "extraction", "membership", "reconstruction")
REPORT_JSON = "privacy_report.json"
REPORT_MARKDOWN = "privacy_report.md"
AUDIT_JSON = "audit.json"


def check_clip_norm(clip_norm: object, *, allow_none: bool = False) -> float | None:
    """The clip norm C as a positive finite float (``None`` allowed only where it may be unknown)."""
    if clip_norm is None and allow_none:
        return None
    if isinstance(clip_norm, bool) or not isinstance(clip_norm, numbers.Real) \
            or not math.isfinite(clip_norm) or clip_norm <= 0:
        raise ValueError("clip_norm (per_example_clip_norm) must be a positive finite number, "
                         f"got {clip_norm!r}")
    return float(clip_norm)


def _stats(values: np.ndarray) -> dict[str, float | None]:
    values = np.asarray(values, dtype=np.float64)
    if not values.size:
        return {"min": None, "median": None, "max": None, "mean": None}
    return {"min": float(values.min()), "median": float(np.median(values)), "max": float(values.max()),
            "mean": float(values.mean())}


def _log_histogram(values: np.ndarray, bins: int = 20) -> dict[str, list[float]]:
    values = np.asarray(values, dtype=np.float64)
    values = values[values > 0]
    if not values.size:
        return {"edges": [], "counts": []}
    low, high = np.log10(values.min()), np.log10(values.max())
    edges = np.logspace(low, high if high > low else low + 1e-9, bins + 1)
    edges[0], edges[-1] = min(edges[0], values.min()), max(edges[-1], values.max())  # 10**log10(x) != x
    counts, edges = np.histogram(values, bins=edges)
    return {"edges": edges.tolist(), "counts": counts.tolist()}


def check_attacks(attacks: Mapping[str, Any] | None) -> dict[str, Any]:
    """Attack results keyed by attack name (a report with an ``"attacks"`` key is unwrapped)."""
    if attacks is None:
        return {}
    if not isinstance(attacks, Mapping):
        raise ValueError(f"report must be a mapping of attack results, got a {type(attacks).__name__}")
    if "attacks" in attacks:  # an audit.json or a whole report
        attacks = attacks["attacks"] or {}
    unknown = sorted(set(attacks) - {*ATTACK_NAMES, "not_run"})
    if unknown:
        raise ValueError(f"report has unknown attack sections {unknown}; known: {list(ATTACK_NAMES)}")
    return dict(attacks)


def check_noise_multiplier(noise_multiplier: object) -> float | None:
    """The sigma training used, as a finite float >= 0 (``None``: the plan's)."""
    if noise_multiplier is None:
        return None
    if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, numbers.Real) \
            or not math.isfinite(noise_multiplier) or noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be None or a finite number >= 0, got {noise_multiplier!r}")
    return float(noise_multiplier)


def trained_noise_multiplier(plan: Any, noise_multiplier: float | None = None) -> float:
    """The sigma the weights were trained with: the plan's training record's when it has one (an
    explicit ``noise_multiplier`` must then agree with it), else ``noise_multiplier``, else the plan's."""
    noise_multiplier = check_noise_multiplier(noise_multiplier)
    record = getattr(plan, "training", None)
    if record is None:
        return float(plan.noise_multiplier if noise_multiplier is None else noise_multiplier)
    if noise_multiplier is not None and noise_multiplier != record.noise_multiplier:
        raise ValueError(f"noise_multiplier={noise_multiplier!r} contradicts the plan's training record, "
                         f"which says the model was trained with {record.noise_multiplier!r}")
    return float(record.noise_multiplier)


def verified_plan(plan: Any, noise_multiplier: float | None = None) -> Any:
    """``plan`` with every secret's bound recomputed from its rho and recorded memberships at what was
    trained: the training record's sigma and DP steps when the plan has one, else at ``noise_multiplier``
    (default: the plan's) and T (``hush_hf.planning.verification``). What a report or a card states is
    never a number read from the plan file."""
    from hush_hf.planning.verification import certified_bounds, recompute_bounds

    sigma = trained_noise_multiplier(plan, noise_multiplier)
    if plan.training is not None:
        return plan.with_bounds(certified_bounds(plan).bound)
    return plan.with_bounds(recompute_bounds(plan, sigma).bound)


def training_section(plan: Any, clip_norm: float | None,
                     noise_multiplier: float | None = None) -> dict[str, Any]:
    """What the guarantee rests on: accountant, sigma, C, B, T, sampling and the LP's outcome.

    sigma, the DP steps ``steps`` and C come from the plan's training record when it has one (what
    the weights went through); otherwise ``noise_multiplier`` is the sigma training used when it
    differs from the plan's, and ``steps`` is the plan's T. ``dp_seed_source`` (with a record only):
    where the DP seed came from, ``"unknown"`` for a record that does not say. ``bounds_hold`` says
    whether sigma is at least the plan's; the report's bounds are always recomputed at what was trained
    (see :func:`verified_plan`).
    """
    summary = plan.summary()
    sigma = trained_noise_multiplier(plan, noise_multiplier)
    record = getattr(plan, "training", None)
    if record is not None and clip_norm is not None and clip_norm != record.clip_norm:
        raise ValueError(f"clip_norm={clip_norm!r} contradicts the plan's training record, which says the "
                         f"model was trained with {record.clip_norm!r}")
    clip_norm = record.clip_norm if record is not None else clip_norm
    return {
        **({"dp_seed_source": record.stated_seed_source} if record is not None else {}),
        "accountant": plan.accountant,
        "noise_multiplier": sigma,
        "planned_noise_multiplier": plan.noise_multiplier,
        "bounds_hold": bool(sigma >= plan.noise_multiplier),
        "clip_norm": clip_norm,
        "noise_std": sigma * clip_norm if clip_norm is not None else None,
        "expected_batch_size": plan.expected_batch_size,
        "steps": record.dp_steps if record is not None else plan.steps,
        "planned_steps": plan.steps,
        "sampling": "weighted Poisson (example i in each batch with probability rho_i = B w_i / sum(w))",
        "max_sampling_prob": summary["max_sampling_prob"],
        "examples": plan.num_examples,
        "retained_fraction": plan.retained_fraction,
        "retained_weight_fraction": plan.retained_weight_fraction,
        "noise_calibrated": plan.calibrated,
        "lp_budget": plan.budget,
        "lp_c": plan.lp_c,
        "lp_gap": summary.get("lp_gap"),
    }


def secrets_section(plan: Any) -> dict[str, Any]:
    """Per-secret targets r_j against certified bounds, as statistics and histograms (indices only)."""
    s = plan.secrets
    ratio = s.bound / s.target if s.target.size else np.zeros(0)
    return {
        "count": plan.num_secrets,
        "unmatched": int(np.count_nonzero(s.num_examples == 0)),
        "meets_targets": plan.meets_targets,
        "num_over_target": int(np.count_nonzero(s.bound > s.target)),
        "indices_over_target": np.flatnonzero(s.bound > s.target).tolist(),
        "prior": _stats(s.prior),
        "target": _stats(s.target),
        "bound": _stats(s.bound),
        "bound_over_target": _stats(ratio),
        "examples_per_secret": _stats(s.num_examples),
        "histograms": {"target": _log_histogram(s.target), "bound": _log_histogram(s.bound),
                       "bound_over_target": _log_histogram(ratio)},
    }


def build_privacy_report(plan: Any | None, *, clip_norm: float | None,
                         attacks: Mapping[str, Any] | None = None, model_name: str | None = None,
                         noise_multiplier: float | None = None,
                         crt: Mapping[str, Any] | None = None,
                         bounds_verified: bool = False,
                         certificate: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The report as a JSON-ready dict. ``plan=None`` reports attacks alone (e.g. an unprotected baseline);
    ``noise_multiplier``: the sigma training used, if not the plan's (see :func:`training_section`);
    ``crt``: a :func:`hush_hf.crt.confidentiality.crt_section` (CRT's confidentiality for what the
    taggers miss, given a measured recall), added under ``"crt"`` when given; ``certificate``: the
    machine-readable block of :func:`hush_hf.audit.certificate.certificate_block`, added under
    ``"certificate"``. The plan's bounds are recomputed at what was trained unless ``bounds_verified``
    (the caller just did)."""
    clip_norm = check_clip_norm(clip_norm, allow_none=True)
    noise_multiplier = check_noise_multiplier(noise_multiplier)
    if plan is not None and not bounds_verified:
        plan = verified_plan(plan, noise_multiplier)
    return {
        "format_version": REPORT_FORMAT_VERSION,
        "generated_by": f"hush_hf {__version__}",
        "model_name": model_name,
        "training": training_section(plan, clip_norm, noise_multiplier) if plan is not None else None,
        "secrets": secrets_section(plan) if plan is not None else None,
        "attacks": check_attacks(attacks),
        **({"crt": dict(crt)} if crt is not None else {}),
        **({"certificate": dict(certificate)} if certificate is not None else {}),
    }


# -- Markdown ---------------------------------------------------------------------------------------
def _g(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Real):
        return format(value, spec)
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_g(v) for v in row) + " |" for row in rows]
    return lines


def void_warning(training: Mapping[str, Any]) -> str:
    return (f"**WARNING: training used noise multiplier {training['noise_multiplier']:.4g}, below the "
            f"{training['planned_noise_multiplier']:.4g} the plan calibrated: the targets do NOT hold for "
            "this model; the bounds below were recomputed at the noise actually used.**")


SEED_WORDS = {
    "drawn": "drawn by hush_hf (128 bits from the OS at train start)",
    "user": "set by the user (dp_seed), not drawn by hush_hf",
    "unknown": "unknown (the training record does not say)",
}


def seed_warning(training: Mapping[str, Any]) -> str | None:
    """The warning a seed hush_hf did not draw (set by the user, or of unknown source) calls for."""
    source = training.get("dp_seed_source")
    if source is None or source == "drawn":
        return None
    origin = ("was set by the user (`dp_seed`), not drawn by hush_hf" if source == "user" else
              "is of unknown origin: the training record does not say whether hush_hf drew it or the user "
              "set it (a hush_hf that did not record it wrote the record)")
    return (f"**WARNING: the secret seed of the sampling and the noise {origin}.** The bounds hold only "
            "against an attacker who does not know that seed: anyone who knows or guesses it can reproduce "
            "every batch and noise draw and subtract the noise from the weights, which removes all "
            "protection. hush_hf cannot tell how secret a chosen seed is.")


def guarantee_lines(report: Mapping[str, Any]) -> list[str]:
    """The training and per-secret numbers of the guarantee, as Markdown."""
    t, s = report.get("training"), report.get("secrets")
    if t is None or s is None:
        return ["No protection plan was given: the model carries no certified secret protection."]
    lines = [] if t["bounds_hold"] else [void_warning(t), ""]
    lines += _table(["quantity", "value"], [
        ["accountant", t["accountant"]],
        ["noise multiplier sigma", t["noise_multiplier"]],
        ["sigma the plan calibrated", t["planned_noise_multiplier"]],
        ["clip norm C", t["clip_norm"]],
        ["noise std sigma*C", t["noise_std"]],
        ["expected batch size B", t["expected_batch_size"]],
        ["DP steps taken T", t["steps"]],
        ["DP steps planned", t.get("planned_steps", t["steps"])],
        ["sampling", t["sampling"]],
        ["max sampling probability", t["max_sampling_prob"]],
        ["examples", t["examples"]],
        ["examples kept (w > 0)", f"{t['retained_fraction']:.2%}"],
        ["sum(w) / n", f"{t['retained_weight_fraction']:.2%}"],
        ["noise calibrated by hush_hf", t["noise_calibrated"]],
        *([["DP seed", SEED_WORDS[t["dp_seed_source"]]]] if "dp_seed_source" in t else []),
    ])
    lines += ["", f"**{s['count']} secrets.** "
              + ("Every secret's certified bound is at most its target."
                 if s["meets_targets"] else
                 f"**WARNING: {s['num_over_target']} secret(s) have a bound above their target** "
                 f"(indices {s['indices_over_target'][:20]}{' ...' if s['num_over_target'] > 20 else ''}).")
              + (f" {s['unmatched']} secret(s) matched no training example (accepted with "
                 "allow_unmatched_secrets)." if s.get("unmatched") else ""),
              ""]
    lines += _table(["per secret", "min", "median", "max"], [
        [name, s[key]["min"], s[key]["median"], s[key]["max"]]
        for name, key in (("prior p_j", "prior"), ("target r_j", "target"), ("certified bound", "bound"),
                          ("bound / target", "bound_over_target"),
                          ("examples containing it", "examples_per_secret"))
    ])
    return lines


def crt_lines(crt: Mapping[str, Any]) -> list[str]:
    """CRT's Bayesian confidentiality (Prop. 6, Thm. 8.3) for secrets the taggers do not mark, as Markdown."""
    t = crt.get("training") or {}
    lines = []
    if t.get("schedule"):
        lines += [f"Trained in CRT mode (`{t['schedule']}`): {t.get('public_rows')} public rows (no "
                  f"policy marks them, no tagged secret) had {t.get('public_steps')} ordinary steps without "
                  f"clipping or noise besides the {crt['steps']} DP steps; the per-secret bounds above "
                  "hold unchanged (public steps are post-processing with data independent of every tagged "
                  "secret).", ""]
    if crt.get("occurrences"):
        lines += occurrence_lines(crt["occurrences"]) + [""]
    if crt.get("recall") is None:
        return lines + ["No measured recall of the redaction policies was given (`crt_recall`), so no "
                        "confidentiality is stated for secrets that no tagger marks."]
    if crt["unbounded"]:
        return lines + ["The DP steps added no noise: a secret no tagger marks has **no** confidentiality "
                        "guarantee, whatever the policies' recall."]
    lines += [f"For a secret no tagger marks, one occurrence in the private rows is "
              f"({_g(crt['example_epsilon'])}, {_g(crt['delta'])})-DP over the {crt['steps']} DP steps "
              "(sampling probability at most "
              f"{_g(crt['max_sampling_prob'])}, sigma {_g(crt['noise_multiplier'])}). With the redaction "
              f"policies' measured recall {_g(crt['recall'])} (gamma = {_g(1 - crt['recall'])}) and the "
              f"public-set policy's recall {_g(crt['conservative_recall'])}, CRT Thm. 8.3 gives "
              f"(log(1 + gamma (e^eps - 1)), gamma delta + delta_2) = "
              f"**({_g(crt['confidentiality_epsilon'])}, {_g(crt['confidentiality_delta'])})-Bayesian "
              "confidentiality**; it rests on the recall the user measured, which hush_hf does not check."]
    return lines


def occurrence_lines(occurrences: Mapping[str, Any], top: int = 10) -> list[str]:
    """Per secret index: rows and unique occurrences (CRT Prop. 7), the ``top`` with most unique ones."""
    rows, unique = np.asarray(occurrences["rows"]), np.asarray(occurrences["unique"])
    sentences = occurrences.get("sentences")
    repeats = ""
    if sentences is not None:
        repeated = int(np.count_nonzero(np.asarray(sentences) > unique))
        repeats = f" {repeated} of {unique.size} secrets repeat a sentence (counted once after dedup)."
    order = np.argsort(-unique, kind="stable")[:top]
    header = ["secret index", "rows", *(["sentences"] if sentences is not None else []), "unique occurrences"]
    table = [[int(j), int(rows[j]), *([int(sentences[j])] if sentences is not None else []), int(unique[j])]
             for j in order]
    return [f"**Occurrences (CRT Prop. 7).** Dedup keeps one copy of a repeated sentence, so the group "
            f"a secret's confidentiality is over is its unique occurrences: at most "
            f"{int(unique.max(initial=0))} per secret here.{repeats} Every secret's counts are in "
            "privacy_report.json (`crt.occurrences`); the secrets with the most unique occurrences:",
            "", *_table(header, table)]


def _drawn_from(what: str, pool: str | None) -> str:
    return f" {what} drawn from {pool}." if pool else ""


def attack_lines(attacks: Mapping[str, Any]) -> list[str]:
    """The attacks' results as Markdown (canaries and secrets by index)."""
    lines: list[str] = []
    exposure = attacks.get("exposure")
    if exposure:
        ins, non = exposure["inserted"], exposure["not_inserted"]
        lines += ["### Canary exposure (Carlini et al. 2019)", "",
                  f"Exposure = log2|R| - log2 rank, at most {_g(exposure['max_possible'])} bits here; an "
                  f"unmemorised canary averages {exposure['chance_mean']:.2f} bits. Inserted canaries: max "
                  f"{_g(ins['max'])}, mean {_g(ins['mean'])} bits ({ins['count']} canaries)"
                  + (f"; never-inserted controls: max {_g(non['max'])}, mean {_g(non['mean'])} bits."
                     if non["count"] else "."), ""]
        lines += _table(["canary", "inserted", "exposure (bits)", "rank", "method"],
                        [[c["index"], c["repetitions"], c["exposure"], c["rank"], c["method"]]
                         for c in exposure["canaries"][:50]])
        lines.append("")
    extraction = attacks.get("extraction")
    if extraction:
        lines += ["### Extraction (k-extractability, Carlini et al. 2023)", "",
                  f"Prompted with the first {extraction['prefix_length']} tokens, greedy decoding "
                  f"reproduced the next {extraction['suffix_length']} tokens of "
                  f"{extraction['num_extracted']} of {extraction['num_sequences']} training sequences "
                  f"({extraction['fraction_extracted']:.2%}); "
                  f"mean leading tokens matched {extraction['mean_matched_tokens']:.2f}, token accuracy "
                  f"{extraction['token_accuracy']:.2%}. Sequences too short to test: "
                  f"{extraction['num_skipped_too_short']}."
                  + _drawn_from("Sequences", extraction.get("sequences_from")), ""]
    membership = attacks.get("membership")
    if membership:
        fprs = sorted({k for m in membership for k in m["tpr_at_fpr"]}, key=float)
        lines += ["### Membership inference", "",
                  "Protection targets secret reconstruction, not membership: membership of examples is "
                  "public under the Hush definition, so a high AUC here does not contradict the "
                  "guarantee." + _drawn_from("Members", membership[0].get("members_from")), ""]
        lines += _table(["attack", "members", "non-members", "AUC", *[f"TPR at FPR {f}" for f in fprs]],
                        [[m["attack"], m["num_members"], m["num_nonmembers"], m["auc"],
                          *[m["tpr_at_fpr"].get(f) for f in fprs]] for m in membership])
        lines.append("")
    reconstruction = attacks.get("reconstruction")
    if reconstruction:
        lines += ["### Secret reconstruction", "",
                  f"{reconstruction['num_evaluated']} secrets probed; the true value ranked first among its "
                  f"candidates for {reconstruction['num_ranked_first']}. Mean posterior of the true value "
                  f"{_g(reconstruction['mean_probability'])} against a uniform guess among the candidates "
                  f"{_g(reconstruction['mean_candidate_prior'])} and the certified bound at that prior "
                  f"{_g(reconstruction.get('mean_bound_at_candidate_prior'))} (bound at the secrets' own "
                  f"priors: {_g(reconstruction['mean_bound'])}).", ""]
        rows = sorted(reconstruction["secrets"], key=lambda r: -r["probability"])[:20]
        lines += _table(["secret", "contexts", "candidates", "rank", "posterior", "uniform guess",
                         "bound at that prior", "bound b_j"],
                        [[r["index"], r["num_contexts"], r["num_candidates"], r["rank"], r["probability"],
                          r["candidate_prior"], r.get("bound_at_candidate_prior"), r["bound"]] for r in rows])
        if reconstruction["not_evaluated"]:
            lines += ["", "Not probed: " + "; ".join(f"{n} ({why})" for why, n in
                                                     reconstruction["not_evaluated"].items()) + "."]
        lines.append("")
    for name, why in attacks.get("not_run", {}).items():
        lines.append(f"- {name}: not run ({why})")
    return lines or ["No attacks were run."]


def report_markdown(report: Mapping[str, Any], plots: Mapping[str, str] | None = None) -> str:
    """The whole report as Markdown; ``plots`` maps captions to relative PNG paths."""
    title = f"Privacy report: {report['model_name']}" if report.get("model_name") else "Privacy report"
    lines = [f"# {title}", "",
             f"Generated by {report['generated_by']}. Secrets are referred to by index only.",
             "", "## Guarantee", "", *_seed_warning_lines(report.get("training")), *guarantee_lines(report),
             "", "## Attacks", "",
             *attack_lines(report.get("attacks", {}))]
    if report.get("crt"):
        lines += ["", "## CRT confidentiality (untagged secrets)", "", *crt_lines(report["crt"])]
    for caption, path in (plots or {}).items():
        lines += ["", f"![{caption}]({path})"]
    return "\n".join(lines) + "\n"


def _seed_warning_lines(training: Mapping[str, Any] | None) -> list[str]:
    warning = seed_warning(training) if training is not None else None
    return [warning, ""] if warning else []


def write_privacy_report(report: Mapping[str, Any], output_dir: str | Path, *,
                         plan: Any = None) -> dict[str, Path]:
    """Write privacy_report.json, privacy_report.md and (from the plan's arrays) PNG plots."""
    from hush_hf.audit.plots import write_report_plots

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    plots = write_report_plots(output_dir, plan=plan, attacks=report.get("attacks", {}))
    paths = {"json": output_dir / REPORT_JSON, "markdown": output_dir / REPORT_MARKDOWN}
    paths["json"].write_text(json.dumps(report, indent=2, allow_nan=False))
    paths["markdown"].write_text(report_markdown(report, {c: p.name for c, p in plots.items()}))
    paths.update({f"plot:{p.stem}": p for p in plots.values()})
    return paths


def load_audit(path: str | Path) -> dict[str, Any]:
    """Attack results from an audit.json (or a privacy_report.json, whose ``attacks`` are taken)."""
    from hush_hf.jsonfile import read_json

    return check_attacks(read_json(path, what="audit file"))


def load_occurrences(path: str | Path) -> dict[str, Any]:
    """``secret_occurrences`` of a ``hush redact --secrets`` report JSON (per secret: rows, sentences,
    unique); a JSON holding those keys directly is taken as is."""
    from hush_hf.jsonfile import read_json

    data = read_json(path, what="--crt-occurrences file")  # one line naming the file: missing, truncated
    found = None
    if isinstance(data, dict):
        found = data.get("secret_occurrences", data if "unique" in data else None)
    if found is None:
        raise ValueError(f"{path}: no secret_occurrences (write them with `hush redact --secrets FILE`)")
    return found


def recorded(data: Mapping[str, Any], key: str) -> Any:
    """``key`` (clip_norm, noise_multiplier) as recorded in an audit.json (top level) or a
    privacy_report.json (under ``training``); ``None`` if absent."""
    if data.get(key) is not None:
        return data[key]
    return (data.get("training") or {}).get(key)


def render_report(plan_path: str | Path, audit_json: str | Path | None, output_dir: str | Path, *,
                  clip_norm: float | None = None, noise_multiplier: float | None = None,
                  model_name: str | None = None, crt_recall: float | None = None,
                  crt_conservative_recall: float | None = None, crt_delta: float = 1e-5,
                  crt_occurrences: str | Path | None = None) -> dict[str, Path]:
    """``hush report``: plan JSON + audit JSON -> privacy_report.json/.md and PNG plots in ``output_dir``.

    ``clip_norm`` and ``noise_multiplier`` (the sigma training used) come from the plan's training
    record when it has one; otherwise they default to the ones recorded in the audit JSON
    (``run_audit`` records them when known), and sigma then to the plan's.
    ``crt_recall`` (measured recall of the redaction policies) adds the CRT section (CRT Thm. 8.3);
    ``crt_occurrences``, the report JSON of ``hush redact --secrets``, adds each secret's rows and
    unique occurrences to it (CRT Prop. 7).
    """
    from hush_hf.jsonfile import read_json
    from hush_hf.planning.plan import ProtectionPlan

    plan = ProtectionPlan.load(plan_path)
    attacks: dict[str, Any] = {}
    if audit_json is not None:
        raw = read_json(audit_json, what="audit file")
        if not isinstance(raw, Mapping):
            raise ValueError(f"audit file {str(audit_json)!r}: expected a JSON object")
        attacks = check_attacks(raw)
        if plan.training is None:
            clip_norm = recorded(raw, "clip_norm") if clip_norm is None else clip_norm
            if noise_multiplier is None:
                noise_multiplier = recorded(raw, "noise_multiplier")
    plan = verified_plan(plan, noise_multiplier)
    crt = None
    if crt_recall is not None or crt_occurrences is not None:
        from hush_hf.crt.confidentiality import crt_section

        crt = crt_section(plan, recall=crt_recall, conservative_recall=crt_conservative_recall,
                          delta=crt_delta, noise_multiplier=trained_noise_multiplier(plan, noise_multiplier),
                          occurrences=None if crt_occurrences is None else load_occurrences(crt_occurrences))
    report = build_privacy_report(plan, clip_norm=clip_norm, attacks=attacks, model_name=model_name,
                                  noise_multiplier=noise_multiplier, crt=crt, bounds_verified=True)
    return write_privacy_report(report, output_dir, plan=plan)
