"""``hush audit``: run every applicable attack on a saved model and write the privacy report.

Which attacks run depends on what is given; each one that cannot run is listed under
``attacks.not_run`` with the reason, never silently left out:

- canaries -> exposure (causal LM);
- training data -> k-extractability (causal LM);
- training data + held-out data -> membership inference (loss; calibrated with a reference model);
- secrets + training data -> secret reconstruction (causal or masked LM); canaries declared as
  secrets are probed against values drawn from their own space.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from hush_hf.audit.canaries import CANARY_ID_PREFIX, Canary, load_canaries
from hush_hf.audit.exposure import ExposureMethod, canary_exposures, summarize_exposures
from hush_hf.audit.extraction import extraction_attack_on_texts
from hush_hf.audit.membership import DEFAULT_FPRS, membership_attacks
from hush_hf.audit.reconstruction import (
    canary_probes,
    fit_probe,
    probes_for_secrets,
    reconstruction_attack,
    summarize_reconstructions,
)
from hush_hf.audit.report import (
    ATTACK_NAMES,
    AUDIT_JSON,
    REPORT_JSON,
    build_privacy_report,
    check_clip_norm,
    check_noise_multiplier,
    recorded,
    trained_noise_multiplier,
    verified_plan,
    write_privacy_report,
)
from hush_hf.audit.scoring import ModelKind, check_positive_int
from hush_hf.data import SECRET_IDS_COLUMN

logger = logging.getLogger(__name__)


def load_model(model_dir: str | Path, *, kind: ModelKind | None = None, device: str | None = None
               ) -> tuple[Any, Any, ModelKind]:
    """(model, tokenizer, kind) from a local directory, never from the Hub."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if not Path(model_dir).is_dir():
        raise ValueError(f"model_dir={str(model_dir)!r} is not a directory")
    if kind is None:
        architectures = AutoConfig.from_pretrained(model_dir, local_files_only=True).architectures or []
        kind = "masked" if set(architectures) & set(MODEL_FOR_MASKED_LM_MAPPING_NAMES.values()) else "causal"
    elif kind not in ("causal", "masked"):
        raise ValueError(f"kind must be 'causal' or 'masked', got {kind!r}")
    auto = AutoModelForMaskedLM if kind == "masked" else AutoModelForCausalLM
    model = auto.from_pretrained(model_dir, local_files_only=True)
    if device is not None:
        model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return model.eval(), tokenizer, kind


#: Model config fields that give the longest input its positions allow (the first one present).
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")


def model_max_length(model: Any, tokenizer: Any) -> int | None:
    """The most tokens one input may have: the model's positions (RoBERTa-style offsets are caught by
    the tokenizer's ``model_max_length``, the smaller wins); None when neither states one."""
    config = getattr(model, "config", None)
    limits = [getattr(config, f) for f in POSITION_FIELDS if isinstance(getattr(config, f, None), int)][:1]
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < 10**8:  # transformers' "no limit" is ~1e30
        limits.append(declared)
    return min(limits) if limits else None


class _AuditFile:
    """audit.json, rewritten after each attack: a later failure leaves what was computed, and the
    attacks not finished are listed under ``not_run`` with why (``hush report`` shows them)."""

    def __init__(self, path: Path, header: dict[str, Any], attacks: dict[str, Any], not_run: dict[str, str]):
        self.path, self.header, self.attacks, self.not_run = path, header, attacks, not_run

    def save(self, stopped: str | None = None) -> None:
        pending = [n for n in ATTACK_NAMES if n not in self.attacks and n not in self.not_run]
        why = (f"not finished: the audit stopped during {stopped}" if stopped
               else "not reached yet when this file was written")
        attacks = {**self.attacks, "not_run": {**self.not_run, **dict.fromkeys(pending, why)}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps({**self.header, "complete": not pending, "attacks": attacks}, indent=2))
        os.replace(partial, self.path)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Run one attack; saved after it, and saved with the reason when it fails (the error's type
        only: a message may quote the data)."""
        try:
            yield
        except BaseException as err:
            self.save(stopped=f"{name} ({type(err).__name__})")
            raise
        self.save()


def _as_dataset(data: Any, field: str, text_column: str) -> Any:
    import datasets

    from hush_hf.data import load_text_dataset

    if data is None:
        return None
    if isinstance(data, (str, Path)):
        data = load_text_dataset(str(data))
    elif isinstance(data, list):
        data = datasets.Dataset.from_dict({text_column: data})
    if not isinstance(data, datasets.Dataset):
        raise ValueError(f"{field} must be a path, a list of texts or a datasets.Dataset, "
                         f"got a {type(data).__name__}")
    if text_column not in data.column_names:
        raise ValueError(f"{field} has no column text_column={text_column!r} (columns: {data.column_names})")
    return data


def _sample_texts(dataset: Any, text_column: str, limit: int, rng: np.random.Generator,
                  rows: np.ndarray | None = None) -> list[str]:
    """Up to ``limit`` texts drawn without replacement from ``rows`` (default: all rows), in row order."""
    rows = np.arange(len(dataset)) if rows is None else rows
    if rows.size > limit:
        rows = np.sort(rng.choice(rows, limit, replace=False))
    return [dataset[int(i)][text_column] for i in rows]


def _longest_canary(tokenizer: Any, canaries: Sequence[Canary]) -> int:
    """Tokens of the longest canary text (every candidate of a space has the canary's form)."""
    from hush_hf.audit.scoring import encode

    return max(len(ids) for ids in encode(tokenizer, [c.space.text(c.value) for c in canaries]))


def _trained_rows(plan: Any, train: Any) -> tuple[np.ndarray | None, str]:
    """Rows the model can have trained on: w_i > 0 under the plan (others are never sampled, so they
    are not members and would dilute the attacks); all rows when the plan does not match the data."""
    if plan is not None and plan.num_examples == len(train):
        return np.flatnonzero(plan.weights > 0), "examples with a non-zero plan weight"
    return None, "all rows (no plan matching the data)"


def _load_plan(plan: Any, model_dir: Path) -> Any:
    from hush_hf.planning.plan import ProtectionPlan

    if plan is None:
        default = model_dir / "hush_plan.json"
        return ProtectionPlan.load(default) if default.is_file() else None
    return ProtectionPlan.load(plan) if isinstance(plan, (str, Path)) else plan


def _reconstruction(model: Any, tokenizer: Any, kind: ModelKind, secrets: Any, train: Any,
                    canaries: list[Canary], plan: Any, *, text_column: str, num_alternatives: int,
                    max_contexts: int, max_secrets: int, batch_size: int, rng: np.random.Generator,
                    seed: int, max_length: int | None) -> dict[str, Any]:
    from hush_hf.secrets import tag_dataset, tagger_for

    canary_of = {c.name: c for c in canaries}
    canary_secrets = [j for j, s in enumerate(secrets) if s.name in canary_of]
    other_secrets = [j for j, s in enumerate(secrets) if s.name not in canary_of]
    if len(other_secrets) > max_secrets:
        other_secrets = sorted(rng.choice(other_secrets, max_secrets, replace=False).tolist())
    probes = canary_probes([canary_of[secrets[j].name] for j in canary_secrets], canary_secrets, seed=seed,
                           num_alternatives=num_alternatives)
    skipped: dict[int, str] = {}
    if other_secrets and train is None:
        skipped = dict.fromkeys(other_secrets, "no training data given")
    elif other_secrets:
        if SECRET_IDS_COLUMN not in train.column_names:
            train = tag_dataset(train, tagger_for(secrets), text_column=text_column, num_secrets=len(secrets))
        pool = [j for j, s in enumerate(secrets) if s.name not in canary_of]
        word_probes, skipped = probes_for_secrets(
            secrets, train[text_column], train[SECRET_IDS_COLUMN], indices=other_secrets, pool=pool,
            num_alternatives=num_alternatives, max_contexts=max_contexts, seed=seed)
        probes += word_probes
    if max_length is not None:  # contexts cut to the model's positions; a candidate alone too long: skipped
        fitted = [(p, fit_probe(p, tokenizer, max_length, kind)) for p in probes]
        skipped |= {p.index: f"a candidate alone exceeds max_length={max_length} tokens"
                    for p, fit in fitted if fit is None}
        probes = [fit for _, fit in fitted if fit is not None]
    results = reconstruction_attack(model, tokenizer, probes, plan=plan, kind=kind, batch_size=batch_size)
    summary = summarize_reconstructions(results, skipped)
    summary["num_secrets_total"] = len(secrets)
    summary["num_secrets_sampled"] = len(canary_secrets) + len(other_secrets)
    return summary


def run_audit(
    model_dir: str | Path,
    dataset: Any = None,
    *,
    output_dir: str | Path,
    plan: Any = None,
    clip_norm: float | None = None,
    noise_multiplier: float | None = None,
    secrets: Any = None,
    canaries: str | Path | Sequence[Canary] | None = None,
    heldout: Any = None,
    reference_model_dir: str | Path | None = None,
    text_column: str = "text",
    kind: ModelKind | None = None,
    max_examples: int = 1000,
    prefix_length: int = 50,
    suffix_length: int = 50,
    max_tokens: int = 512,
    max_length: int | None = None,
    num_alternatives: int = 20,
    max_contexts: int = 4,
    max_secrets: int = 200,
    exposure_method: ExposureMethod | str = "auto",
    max_exact: int = 100_000,
    num_samples: int = 5_000,
    fprs: Sequence[float] = DEFAULT_FPRS,
    batch_size: int = 16,
    seed: int = 0,
    device: str | None = None,
) -> dict[str, Any]:
    """Attack the model in ``model_dir`` and write audit.json, privacy_report.json/.md and plots.

    ``dataset``: the training data (path, list of texts or ``datasets.Dataset``); ``heldout``: data
    not trained on (membership inference); ``secrets``: a ``SecretSet`` or secrets file;
    ``canaries``: a canary file or list. ``plan`` (default ``model_dir/hush_plan.json``), ``clip_norm``
    and ``noise_multiplier`` (the sigma training used; defaults: the plan's training record; for a plan
    without one, as recorded in ``model_dir/privacy_report.json``, else the plan's sigma) add the
    guarantee.
    At most ``max_examples`` texts per data set and ``max_secrets`` secrets (besides canaries) are
    attacked, drawn with ``seed``; the report records how many.
    ``max_length``: the most tokens any input to the model may have (default: the model's positions,
    ``model_max_length``); membership texts are cut to the smaller of it and ``max_tokens``,
    reconstruction contexts are cut around the secret, and an attack whose inputs cannot be cut to it
    (canaries, prefix + suffix) is listed as not run. audit.json is rewritten after each attack.
    """
    for field, value in (("max_examples", max_examples), ("prefix_length", prefix_length),
                         ("suffix_length", suffix_length), ("max_tokens", max_tokens),
                         ("num_alternatives", num_alternatives), ("max_contexts", max_contexts),
                         ("max_secrets", max_secrets), ("batch_size", batch_size)):
        check_positive_int(field, value)
    if max_length is not None:
        check_positive_int("max_length", max_length)
    clip_norm = check_clip_norm(clip_norm, allow_none=True)
    noise_multiplier = check_noise_multiplier(noise_multiplier)
    if exposure_method not in ("auto", "exact", "empirical", "skewnorm"):
        raise ValueError(f"exposure_method must be 'auto', 'exact', 'empirical' or 'skewnorm', "
                         f"got {exposure_method!r}")
    for k, fpr in enumerate(fprs):
        if not 0.0 < float(fpr) < 1.0:
            raise ValueError(f"fprs[{k}]={fpr!r} must lie in (0, 1)")
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    train = _as_dataset(dataset, "dataset", text_column)
    held = _as_dataset(heldout, "heldout", text_column)
    if isinstance(secrets, (str, Path)):
        from hush_hf.secrets import SecretSet

        secrets = SecretSet.load(secrets)
    canary_list = load_canaries(canaries) if isinstance(canaries, (str, Path)) else list(canaries or [])
    plan = _load_plan(plan, model_dir)
    if plan is not None and secrets is not None and plan.num_secrets != len(secrets):
        raise ValueError(f"secrets has {len(secrets)} secrets but the plan covers {plan.num_secrets}")
    record = plan.training if plan is not None else None
    if record is None and (model_dir / REPORT_JSON).is_file():  # a plan without a training record
        written = json.loads((model_dir / REPORT_JSON).read_text())
        clip_norm = recorded(written, "clip_norm") if clip_norm is None else clip_norm
        if noise_multiplier is None:
            noise_multiplier = recorded(written, "noise_multiplier")
    if record is not None:  # what the weights went through, from the plan they were published with
        clip_norm = record.clip_norm if clip_norm is None else clip_norm
        noise_multiplier = trained_noise_multiplier(plan, noise_multiplier)
    if plan is not None:  # bounds recomputed at what was trained, never read from the plan file
        plan = verified_plan(plan, noise_multiplier)
    model, tokenizer, kind = load_model(model_dir, kind=kind, device=device)
    reference = None
    if reference_model_dir is not None:
        reference = load_model(reference_model_dir, kind="causal", device=device)[0]
    max_length = model_max_length(model, tokenizer) if max_length is None else max_length
    rng = np.random.default_rng(seed)
    attacks: dict[str, Any] = {}
    not_run: dict[str, str] = {}
    audit_file = _AuditFile(output_dir / AUDIT_JSON, {
        "format_version": 1, "model_kind": kind, "clip_norm": clip_norm, "noise_multiplier": noise_multiplier,
        "max_length": max_length}, attacks, not_run)
    too_long = f"longer than max_length={max_length} tokens (the model's positions; see --max-length)"

    causal_only = "needs a causal LM" if kind != "causal" else None
    with audit_file.stage("exposure"):
        if not canary_list:
            not_run["exposure"] = "no canaries given"
        elif causal_only:
            not_run["exposure"] = causal_only
        elif max_length is not None and _longest_canary(tokenizer, canary_list) > max_length:
            not_run["exposure"] = f"canary texts {too_long}"
        else:
            logger.info("Exposure of %d canaries", len(canary_list))
            attacks["exposure"] = summarize_exposures(canary_exposures(
                model, tokenizer, canary_list, method=exposure_method, max_exact=max_exact,
                num_samples=num_samples, batch_size=batch_size, seed=seed))
    members: list[str] = []
    pool = ""
    with audit_file.stage("extraction"):
        if train is None:
            not_run["extraction"] = not_run["membership"] = "no training data given"
        elif causal_only:
            not_run["extraction"] = not_run["membership"] = causal_only
        else:
            trained, pool = _trained_rows(plan, train)
            members = _sample_texts(train, text_column, max_examples, rng, trained)
            if max_length is not None and prefix_length + suffix_length > max_length:
                window = prefix_length + suffix_length
                not_run["extraction"] = f"prefix_length + suffix_length = {window} is {too_long}"
            else:
                logger.info("Extraction on %d training texts", len(members))
                attacks["extraction"] = extraction_attack_on_texts(
                    model, tokenizer, members, prefix_length=prefix_length, suffix_length=suffix_length,
                    batch_size=batch_size).to_json()
                attacks["extraction"]["sequences_from"] = pool
    with audit_file.stage("membership"):
        if "membership" in not_run:  # no training data, or not a causal LM (set above)
            pass
        elif held is None:
            not_run["membership"] = "no held-out data given"
        else:
            nonmembers = _sample_texts(held, text_column, max_examples, rng)
            logger.info("Membership inference: %d members, %d non-members", len(members), len(nonmembers))
            cut = max_tokens if max_length is None else min(max_tokens, max_length)
            attacks["membership"] = [{**r.to_json(), "members_from": pool} for r in membership_attacks(
                model, tokenizer, members, nonmembers, reference_model=reference, fprs=fprs,
                max_length=cut, batch_size=batch_size)]
    with audit_file.stage("reconstruction"):
        if secrets is None:
            not_run["reconstruction"] = "no secrets given"
        elif train is None and not any(s.name.startswith(CANARY_ID_PREFIX) for s in secrets):
            not_run["reconstruction"] = "no training data given"
        else:
            logger.info("Reconstruction of up to %d secrets", max_secrets)
            attacks["reconstruction"] = _reconstruction(
                model, tokenizer, kind, secrets, train, canary_list, plan, text_column=text_column,
                num_alternatives=num_alternatives, max_contexts=max_contexts, max_secrets=max_secrets,
                batch_size=batch_size, rng=rng, seed=seed, max_length=max_length)
    attacks = {**attacks, "not_run": not_run}
    report = build_privacy_report(plan, clip_norm=clip_norm, attacks=attacks,
                                  noise_multiplier=noise_multiplier, bounds_verified=True)
    write_privacy_report(report, output_dir, plan=plan)
    return report
