"""CRT's canary experiment (Zhao et al. 2022, Sec. 5, Fig. 3): GPT-2 on dialogues, with and without DP.

    accelerate launch recipes/gpt2_canary.py            # offline default: <= 10 min on 2 CPU cores
    accelerate launch recipes/gpt2_canary.py --smoke    # about a minute (CI)
    accelerate launch recipes/gpt2_canary.py --preset paper --model_name_or_path distilgpt2 \
        --dataset_name <dialogue dataset> --text_column <column>

Ten canaries ``My ID is: <6 random digits>`` are inserted ``--canary_repetitions`` times into the training
dialogues and declared secrets (p = 1/|R| = 1e-6, target ``--canary_target``). For the same T and B:
``non_private`` (plain ``Trainer``), ``uniform_dp`` (DP-SGD, every example at rate B/n) and ``hush_hf``
(the LP at c = ``--lp_c``), each DP model with the noise every canary's target needs. CRT arms, per
false-negative rate gamma of the redaction policy pi (it misses the last gamma share of the canaries and
masks the others with EOS): ``non_private_redacted``, ``crt`` (CRT Alg. 1: dedup, redact, ordinary steps
on the rows pi_c = "any six-digit number" leaves public, DP steps at ``uniform_dp``'s noise) and
``hush_hf_crt`` (hush_hf's CRT mode, the LP for the canaries pi missed). Per model: test perplexity,
canary exposure (extrapolated from ``--exposure_samples`` candidates) and two membership attacks.
Offline: Chit Chat dialogues, a 2-layer width-64 GPT-2 with the GPT-2 vocabulary built from its config (no
GPT-2 weights exist offline), B = 16, T = 100, LP c = 1e-5, gamma in {0, 0.3, 0.5} (docs/benchmarks.md
has the runs behind it). Canary values are written only to ``canaries_PRIVATE.json`` (``--save_canaries``).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    Stopwatch,
    TextRecipeArguments,
    causal_model,
    causal_tokenizer,
    check_int,
    check_names,
    check_number,
    check_text_arguments,
    collate_batches,
    comparison,
    describe_counts,
    exposure,
    finish,
    line_panels,
    load_corpus,
    mean_token_loss,
    no_preprocessing_lp_c,
    pivot_table,
    plant_canaries,
    recipe_main,
    refuse_recipe_owned_fields,
    results_page,
    run_choices,
    series_by,
    split_held_out,
    tokenize_text,
    train_model,
)
from tqdm.auto import tqdm

RECIPE = "gpt2_canary"
BASE_METHODS = ("non_private", "uniform_dp", "hush_hf")
CRT_METHODS = ("non_private_redacted", "crt", "hush_hf_crt")  # one run per gamma
METHODS = BASE_METHODS + CRT_METHODS
SIX_DIGITS = re.compile(r"(?<!\d)\d{6}(?!\d)")  # pi_c: every canary of the default space
NO_LP = 1e6  # an LP constant so large that every example keeps its weight 1 (uniform sampling)

COMMON = {"num_canaries": 10, "canary_repetitions": 20, "learning_rate": 3e-3}
PRESETS: dict[str, dict[str, Any]] = {
    "offline": {
        **COMMON, "max_steps": 100, "expected_batch_size": 16.0, "per_device_train_batch_size": 16,
        "logging_steps": 20, "max_seq_length": 20, "max_train_examples": 200, "max_test_examples": 64,
        "exposure_samples": 200, "canary_nonmembers": 50, "mia_examples": 32,
        "lp_c": 1e-5,  # the LP samples a canary's copies so rarely that its target needs (almost) no noise
        "gammas": [0.0, 0.3, 0.5],  # 3 + 3 x 3 = 12 models within 10 minutes on 2 cores
    },
    "smoke": {  # uniform_dp is planned (the CRT arm's noise), not trained; KL calibrates in ms
        **COMMON, "methods": ["non_private", "hush_hf", *CRT_METHODS], "accountant": "kl", "max_steps": 3,
        "expected_batch_size": 8.0, "per_device_train_batch_size": 8, "logging_steps": 1,
        "max_seq_length": 24, "max_train_examples": 120, "max_test_examples": 8, "exposure_samples": 40,
        "canary_nonmembers": 10, "mia_examples": 8, "model_width": 32, "gammas": [0.5],
    },
    "paper": {
        **COMMON, "model_name_or_path": "distilgpt2", "max_steps": 1000, "expected_batch_size": 256.0,
        "per_device_train_batch_size": 32, "learning_rate": 5e-4, "logging_steps": 50, "max_seq_length": 128,
        "max_test_examples": 2000, "exposure_samples": 20000, "canary_nonmembers": 1000, "mia_examples": 1000,
    },
}

logger = logging.getLogger("recipes.gpt2_canary")


@dataclass
class GPT2CanaryArguments(TextRecipeArguments):
    """Arguments of the recipe (training arguments are those of SecretProtectionConfig)."""

    model_layers: int = field(default=2, metadata={"help": "Layers of the GPT-2 built from its config."})
    model_width: int = field(default=64, metadata={"help": "Width of the GPT-2 built from its config."})
    model_heads: int = field(default=2, metadata={"help": "Heads of the GPT-2 built from its config."})
    test_fraction: float | None = field(default=0.1, metadata={"help": "Fraction of dialogues held out."})
    canary_target: float = field(default=1e-3, metadata={"help": "Target posterior r of every canary."})
    canary_seed: int = field(default=0, metadata={"help": "Seed of the canary values, positions and split."})
    methods: list[str] = field(default_factory=lambda: list(METHODS), metadata={"help": "Models to train."})
    gammas: list[float] = field(default_factory=lambda: [0.0, 0.1, 0.3, 0.5],
                                metadata={"help": "False-negative rates of the redaction (CRT arms)."})
    crt_dedup: bool = field(default=True, metadata={"help": "CRT arms: dedup rows and sentences (Alg. 1)."})
    canary_nonmembers: int | None = field(default=None, metadata={"help": "Fresh canaries, for the MIA"})
    mia_examples: int | None = field(default=None, metadata={"help": "Train and held-out rows, MIA."})
    save_canaries: bool = field(default=False, metadata={"help": "Write canaries_PRIVATE.json."})


def validate(args: GPT2CanaryArguments, config: Any) -> None:
    """ValueError naming the field and value for every bad choice, before any work."""
    refuse_recipe_owned_fields(config, {"noise_multiplier": "calibrated per model", "plan_file": "planned",
                                        "secrets_file": "the canaries are the secrets"})
    if args.preset == "paper" and args.dataset_name is None:
        raise ValueError("preset='paper' needs --dataset_name (no large dialogue corpus offline)")
    check_text_arguments(args, min_seq_length=12)
    for name in ("model_layers", "model_width", "model_heads", "num_canaries", "canary_nonmembers",
                 "mia_examples"):
        check_int(name, getattr(args, name), minimum=1)
    check_number("canary_target", args.canary_target, low=1e-6, high=1.0 - 1e-12)
    check_int("canary_seed", args.canary_seed, minimum=0)
    check_names("methods", args.methods, METHODS)
    if not args.gammas or any(not isinstance(g, float) or not 0 <= g < 1 for g in args.gammas):
        raise ValueError(f"gammas must be numbers in [0, 1), got {args.gammas!r}")
    if config.crt_schedule != "off":
        raise ValueError(f"crt_schedule={config.crt_schedule!r}: the recipe sets the CRT mode of its arms")
    if config.expected_batch_size is None or config.expected_batch_size != int(config.expected_batch_size):
        raise ValueError(f"expected_batch_size must be a whole number here (the non-private model trains "
                         f"with batches of B), got {config.expected_batch_size!r}")


# ----------------------------------------------------------------------------------- data and plans
def load_dialogues(args: GPT2CanaryArguments) -> tuple[Any, Any, str, list[Any], Any]:
    """(training dialogues with the canaries and ``secret_ids``, test dialogues, description, canaries,
    SecretSet: canary k is secret k). One ``text`` column; a seeded random split."""
    from hush_hf.assets import chitchat_dialogues
    from hush_hf.secrets import SecretSet, tag_dataset, tagger_for

    corpus, source = load_corpus(args.dataset_name, args.dataset_split, [args.text_column],
                                 offline=chitchat_dialogues, offline_source="Chit Chat dialogues (offline)")
    corpus = corpus.select_columns([args.text_column])
    corpus = corpus.rename_column(args.text_column, "text") if args.text_column != "text" else corpus
    corpus = corpus.filter(lambda row: len(row["text"].split()) >= 4, desc="Dropping near-empty dialogues")
    train, test = split_held_out(corpus, args.test_fraction, seed=args.canary_seed,
                                 max_train=args.max_train_examples, max_test=args.max_test_examples)
    train, canaries, records = plant_canaries(train, num_canaries=args.num_canaries, seed=args.canary_seed,
                                              repetitions=args.canary_repetitions,
                                              targets=[args.canary_target] * args.num_canaries)
    secrets = SecretSet.from_records(records)
    train = tag_dataset(train, tagger_for(secrets), text_column="text", num_secrets=len(secrets))
    return train, test, source, canaries, secrets


def plan(config: Any, data: Any, secrets: Any, lp_c: float, sigma: float | None = None, **kwargs: Any) -> Any:
    from hush_hf.planning.plan import plan_protection
    from hush_hf.trainer.plan_setup import column

    return plan_protection(column(data, "secret_ids"), secrets.priors, secrets.targets, lp_c=lp_c,
                           expected_batch_size=config.expected_batch_size, steps=config.max_steps,
                           accountant=config.accountant, noise_multiplier=sigma, **kwargs)


def redacted(args: GPT2CanaryArguments, train: Any, canaries: list[Any], secrets: Any, gamma: float, *,
             mask: str, crt: bool) -> tuple[Any, dict[str, Any]]:
    """Training rows of a CRT arm at false-negative rate gamma, and what was done to them: pi masks the
    copies of the first (1 - gamma) share of the canaries; with ``crt``, Dedup first (``--crt_dedup``) and
    pi_c (any six-digit number) marks the private rows (``crt_public``). Rows are tagged with every canary."""
    from hush_hf.audit.canaries import canary_secret_records
    from hush_hf.crt import Policy, dedup_dataset, redact_dataset, secrets_policy
    from hush_hf.secrets import SecretSet, tag_dataset, tagger_for

    known = len(canaries) - round(gamma * len(canaries))
    record: dict[str, Any] = {"gamma": gamma, "canaries_missed": len(canaries) - known}
    data = train.remove_columns("secret_ids")
    if crt and args.crt_dedup:
        data, dedup = dedup_dataset(data, mask_token=mask)
        record.update(dedup_rows_removed=dedup.rows_in - dedup.rows_out,
                      dedup_sentences_masked=dedup.sentences_masked)
    known_set = SecretSet.from_records(canary_secret_records(canaries[:known], args.canary_target))
    policies = [secrets_policy(known_set)] if known else []
    conservative = [Policy("six_digits", lambda t: [m.span() for m in SIX_DIGITS.finditer(t)])] if crt else []
    if policies or conservative:
        data, report = redact_dataset(data, policies, conservative_policies=conservative, mask_token=mask)
        data = data.remove_columns(["crt_masked_spans"] + ([] if crt else ["crt_public"]))
        record.update(public_rows=report.public_rows, private_rows=report.private_rows)
    return tag_dataset(data, tagger_for(secrets), text_column="text", num_secrets=len(secrets)), record


def crt_plans(config: Any, data: Any, secrets: Any, uniform_sigma: float) -> dict[str, Any]:
    """The CRT arms' plans on the redacted rows (which may match no canary: that is redaction's point):
    ``crt`` uniform at uniform_dp's sigma (calibrated higher only if that misses a target here) and
    ``hush_hf_crt`` the LP with its own calibrated sigma."""
    crt = plan(config, data, secrets, NO_LP, uniform_sigma, allow_unmatched=True)
    if not crt.meets_targets:
        crt = plan(config, data, secrets, NO_LP, allow_unmatched=True)
    return {"crt": crt, "hush_hf_crt": plan(config, data, secrets, config.lp_c, allow_unmatched=True)}


# ----------------------------------------------------------------------------------- models and attacks
def attack(model: Any, args: GPT2CanaryArguments, tokenizer: Any, canaries: list[Any], *,
           test_batches: Any, members: list[str], nonmembers: list[str]) -> dict[str, Any]:
    """Test perplexity, canary exposure and the two membership attacks on one trained model."""
    from hush_hf.audit.membership import membership_attacks
    from hush_hf.trainer.losses import lm_per_example_loss

    loss = mean_token_loss(model, test_batches, lm_per_example_loss, causal=True)
    found = exposure(model, tokenizer, canaries, kind="causal", samples=args.exposure_samples,
                     batch_size=args.eval_batch_size, seed=args.canary_seed)
    space, taken = canaries[0].space, {c.value for c in canaries}
    rng = np.random.default_rng(args.canary_seed + 1)
    fresh = [v for v in space.random_values(4 * args.canary_nonmembers, rng) if v not in taken]
    canary_mia = membership_attacks(model, tokenizer, [c.text for c in canaries],
                                    [space.text(v) for v in fresh[: args.canary_nonmembers]],
                                    batch_size=args.eval_batch_size)[0].to_json()
    example_mia = membership_attacks(model, tokenizer, members, nonmembers, max_length=args.max_seq_length,
                                     batch_size=args.eval_batch_size)[0].to_json()
    return {"test_loss": loss, "test_perplexity": math.exp(loss), **found, "canary_mia": canary_mia,
            "example_mia": example_mia, "canary_mia_auc": canary_mia["auc"],
            "example_mia_auc": example_mia["auc"]}


# ----------------------------------------------------------------------------------- outputs
def fig3_rows(rows: list[dict[str, Any]], gammas: list[float]) -> list[dict[str, Any]]:
    """CRT Fig. 3's points: every model at every gamma (the arms without redaction at each gamma alike)."""
    return [{**r, "gamma": g} for r in rows for g in gammas if r["gamma"] in (None, g)]


def page(results: dict[str, Any]) -> str:
    data, choices = results["data"], results["choices"]
    sections = [("The comparison at one guarantee", results["table"])]
    if results["crt"]:
        points = fig3_rows(results["rows"], choices["gammas"])
        for key, title in (("exposure_max", "Max canary exposure (bits)"), ("test_perplexity", "Perplexity")):
            table = pivot_table(points, row="method", column="gamma", values={key: ""},
                                header="gamma = {column}")
            sections.append((f"{title} against gamma (CRT Fig. 3)", table))
        sections.append(("", "![CRT Fig. 3](crt_fig3.png)"))
    return results_page("CRT canary experiment: GPT-2 on dialogues", [
        f"Data: {data['source']}: {data['train_examples']} training rows ({data['canary_rows']} canary "
        f"copies), {data['test_examples']} test dialogues. {choices['num_canaries']} canaries x "
        f"{choices['canary_repetitions']} copies, p = 1/|R| = {data['canary_prior']:.3g}, target r = "
        f"{choices['canary_target']:g}.",
        f"Training: B = {choices['expected_batch_size']:g}, T = {choices['max_steps']}, C = "
        f"{choices['per_example_clip_norm']:g}, {choices['accountant']} accountant, hush_hf LP c = "
        f"{choices['lp_c']:g}. Exposure: at most {results['exposure_max_possible'] or 0:.4g} bits, chance "
        "~1.44 bits.",
    ], sections, results=results)


# ----------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse and check the arguments, then run the experiment; returns what ``results.json`` holds."""
    return recipe_main(GPT2CanaryArguments, PRESETS, recipe_name=RECIPE, validate=validate, run=run,
                       argv=argv)


def run(args: GPT2CanaryArguments, config: Any) -> dict[str, Any]:
    from transformers import DataCollatorForLanguageModeling

    from hush_hf.accounting import lp_budget
    from hush_hf.planning.memberships import membership_matrix
    from hush_hf.trainer.distributed import broadcast_object
    from hush_hf.trainer.plan_setup import column

    output_dir, main_process, watch = Path(config.output_dir), config.process_index == 0, Stopwatch()
    with watch("data and canaries"):
        train_text, test_text, source, canaries, secrets = load_dialogues(args)
        membership = membership_matrix(column(train_text, "secret_ids"), len(secrets))
        sizes = np.asarray(membership.sum(axis=1)).ravel()
    with watch("planning"):  # uniform_dp keeps every example (w = 1); CRT's DP steps use its noise
        wanted = [m for m in ("uniform_dp", "hush_hf") if m in args.methods]
        wanted = ["uniform_dp"] * ("crt" in args.methods and "uniform_dp" not in wanted) + wanted
        budget = lp_budget(secrets.priors, secrets.targets, "kl" if config.accountant == "kl" else "tight")
        lp_cs = {"uniform_dp": no_preprocessing_lp_c(sizes, budget), "hush_hf": config.lp_c}
        plans = {m: plan(config, train_text, secrets, lp_cs[m]) for m in wanted} if main_process else None
        plans = broadcast_object(plans)
        for method, found in plans.items() if main_process else ():
            found.save(output_dir / "plans" / f"{method}.json")
            logger.info("%s plan: retained weight %.3f, sigma %.4g", method, found.retained_weight_fraction,
                        found.noise_multiplier)
    with watch("tokenizing"):
        tokenizer = causal_tokenizer(args.model_name_or_path)

        tokenized = partial(tokenize_text, tokenizer=tokenizer, text_column="text",
                            max_length=args.max_seq_length)
        train, test = tokenized(train_text, keep_text=True), tokenized(test_text)  # ids checked on the text
        collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
        test_batches = collate_batches(test, collator, args.eval_batch_size)
        ordinary = [t for t in train_text["text"] if not any(c.text == t for c in canaries)]
        chosen = np.random.default_rng(args.canary_seed).permutation(len(ordinary))[: args.mia_examples]
        members = [ordinary[k] for k in np.sort(chosen)]
        nonmembers = test_text["text"][: args.mia_examples]
    rows: list[dict[str, Any]] = []

    def train_and_attack(method: str, plan: Any, data: Any, gamma: float | None = None, **overrides: Any):
        run_dir = output_dir / "runs" / (method if gamma is None else f"{method}_gamma{gamma:g}")
        with watch(f"training {method}"):
            model = causal_model(args.model_name_or_path, len(tokenizer), seed=config.seed,
                                 n_layer=args.model_layers, n_embd=args.model_width, n_head=args.model_heads,
                                 n_positions=max(64, args.max_seq_length))
            _, record = train_model(model, config, plan, train=data, collator=collator, run_dir=run_dir,
                                    **overrides)
        with watch(f"attacks {method}"):
            found = attack(model, args, tokenizer, canaries, test_batches=test_batches, members=members,
                           nonmembers=nonmembers)
        rows.append({"method": method, "gamma": gamma, **record, **found,
                     "certified": plan is not None and plan.meets_targets,
                     "bound_over_target_max": plan and plan.summary()["bound_over_target_max"],
                     "retained_weight_fraction": plan and plan.retained_weight_fraction})
        logger.info("%s%s: perplexity %.4g, exposure mean %.3g max %.3g bits", method,
                    "" if gamma is None else f" (gamma {gamma:g})", found["test_perplexity"],
                    found["exposure_mean"], found["exposure_max"])

    for method in tqdm([m for m in args.methods if m in BASE_METHODS], desc="Models"):
        train_and_attack(method, plans.get(method), train)
    crt_methods, crt_records = [m for m in args.methods if m in CRT_METHODS], []
    for gamma in tqdm(args.gammas if crt_methods else [], desc="CRT gammas"):
        with watch("CRT data and plans"):
            data, gamma_plans = {}, None
            for arm in ["non_private_redacted"] * ("non_private_redacted" in crt_methods) + ["crt"] * bool(
                    {"crt", "hush_hf_crt"} & set(crt_methods)):
                data[arm], record = redacted(args, train_text, canaries, secrets, gamma,
                                             mask=tokenizer.eos_token, crt=arm == "crt")
                crt_records.append({"arm": arm, **record})
            if main_process and "crt" in data:
                gamma_plans = crt_plans(config, data["crt"], secrets, plans["uniform_dp"].noise_multiplier)
            gamma_plans = broadcast_object(gamma_plans) or {}
            for method in set(gamma_plans) & set(crt_methods) if main_process else ():
                gamma_plans[method].save(output_dir / "plans" / f"{method}_gamma{gamma:g}.json")
        for method in crt_methods:
            if method == "non_private_redacted":
                train_and_attack(method, None, tokenized(data[method]), gamma)
            else:
                train_and_attack(method, gamma_plans[method], tokenized(data["crt"], keep_text=True), gamma,
                                 crt_schedule="interleave")
    title = f"CRT canaries ({args.preset}): B={config.expected_batch_size:g}, T={config.max_steps}"
    results = {
        "recipe": RECIPE, "choices": run_choices(args, config),
        "data": {"source": source, "train_examples": len(train), "canary_rows": int(sizes.sum()),
                 "test_examples": len(test), "canary_prior": float(secrets.priors[0]),
                 "examples_per_canary": describe_counts(sizes)},
        "exposure_max_possible": rows[0]["exposure_max_possible"] if rows else None,
        "rows": rows, "crt": crt_records,
        "table": comparison([r for r in rows if r["gamma"] is None], [
            "method", "noise_multiplier", "certified", "test_perplexity", "exposure_mean", "exposure_max",
            "canary_mia_auc", "example_mia_auc"],
                            [("test_perplexity", "test perplexity", None),
                             ("exposure_mean", "mean canary exposure, bits (dotted: chance)", 1.44),
                             ("canary_mia_auc", "canary membership AUC", 0.5),
                             ("example_mia_auc", "example membership AUC", 0.5)],
                            output_dir / "canaries.png", title=title, label="method", draw=main_process),
        "notes": [
            "Canaries are referred to by index; their values are secrets, written nowhere"
            + (" but canaries_PRIVATE.json." if args.save_canaries else "."),
            "non_private trains with plain transformers.Trainer (no clipping, no noise): no guarantee.",
            "uniform_dp samples every example at rate B/n (no LP); hush_hf samples by the LP weights. Both "
            "calibrate sigma so that every canary's posterior bound is <= its target.",
            f"Exposure is extrapolated from {args.exposure_samples} random candidates by a skew-normal.",
        ] + ["CRT arms: pi misses the last gamma share of the canaries and masks the others' copies "
             "with EOS; crt and hush_hf_crt dedup first (exact rows, repeated sentences), mark rows with a "
             "six-digit number private (pi_c) and interleave an ordinary public step before each DP step."
             ] * bool(crt_methods),
        "files": ["results.json", "results.md", "canaries.png", "plans/", "run.log"]
        + ["crt_fig3.png"] * bool(crt_methods),
    }
    if main_process and crt_methods:
        points = fig3_rows(rows, args.gammas)
        line_panels(output_dir / "crt_fig3.png", [
            {"title": title, "xlabel": "false-negative rate gamma of pi", "ylabel": title,
             "series": series_by(points, "method", "gamma", key), "logy": key == "test_perplexity"}
            for key, title in (("exposure_max", "max exposure, bits"), ("test_perplexity", "perplexity"))
        ], title=title)
    if main_process and args.save_canaries:
        from hush_hf.audit.canaries import save_canaries

        save_canaries(output_dir / "canaries_PRIVATE.json", canaries)
    finish(results, output_dir, watch, page, main_process=main_process)
    return results


if __name__ == "__main__":
    main()
