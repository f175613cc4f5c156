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

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tqdm.auto import tqdm

from hush_hf import experiments as ex

RECIPE = "gpt2_canary"
BASE_METHODS = ("non_private", "uniform_dp", "hush_hf")
CRT_METHODS = ("non_private_redacted", "crt", "hush_hf_crt")  # one run per gamma
METHODS = BASE_METHODS + CRT_METHODS

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


@dataclass
class GPT2CanaryArguments(ex.TextExperimentArguments):
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
    ex.refuse_owned_fields(config, {"noise_multiplier": "calibrated per model", "plan_file": "planned",
                                    "secrets_file": "the canaries are the secrets"})
    if args.preset == "paper" and args.dataset_name is None:
        raise ValueError("preset='paper' needs --dataset_name (no large dialogue corpus offline)")
    ex.check_text_arguments(args, min_seq_length=12)
    for name in ("model_layers", "model_width", "model_heads", "num_canaries", "canary_nonmembers",
                 "mia_examples"):
        ex.check_int(name, getattr(args, name), minimum=1)
    ex.check_number("canary_target", args.canary_target, low=1e-6, high=1.0 - 1e-12)
    ex.check_int("canary_seed", args.canary_seed, minimum=0)
    ex.check_names("methods", args.methods, METHODS)
    if not args.gammas or any(not isinstance(g, float) or not 0 <= g < 1 for g in args.gammas):
        raise ValueError(f"gammas must be numbers in [0, 1), got {args.gammas!r}")
    if config.crt_schedule != "off":
        raise ValueError(f"crt_schedule={config.crt_schedule!r}: the recipe sets the CRT mode of its arms")
    ex.check_whole_batch_size(config, " here (the non-private model trains with batches of B)")


def load_dialogues(args: GPT2CanaryArguments) -> tuple[Any, Any, str, list[Any], Any]:
    """(training dialogues with the canaries and ``secret_ids``, test dialogues, description, canaries,
    SecretSet: canary k is secret k). One ``text`` column; a seeded random split."""
    from hush_hf.assets import chitchat_dialogues

    corpus, source = ex.load_corpus(args.dataset_name, args.dataset_split, [args.text_column],
                                    offline=chitchat_dialogues,
                                    offline_source="Chit Chat dialogues (offline)")
    corpus = corpus.select_columns([args.text_column])
    corpus = corpus.rename_column(args.text_column, "text") if args.text_column != "text" else corpus
    corpus = corpus.filter(lambda row: len(row["text"].split()) >= 4, desc="Dropping near-empty dialogues")
    train, test = ex.split_held_out(corpus, args.test_fraction, seed=args.canary_seed,
                                    max_train=args.max_train_examples, max_test=args.max_test_examples)
    train, secrets, canaries = ex.tag_with_canaries(
        train, [], num_canaries=args.num_canaries, repetitions=args.canary_repetitions,
        targets=[args.canary_target] * args.num_canaries, seed=args.canary_seed)
    return train, test, source, canaries, secrets


def page(results: dict[str, Any]) -> str:
    data, choices = results["data"], results["choices"]
    sections = [("The comparison at one guarantee", results["table"])]
    if results["crt"]:
        sections += ex.fig3_sections(results["rows"], choices["gammas"])
    return ex.results_page("CRT canary experiment: GPT-2 on dialogues", [
        f"Data: {data['source']}: {data['train_examples']} training rows ({data['canary_rows']} canary "
        f"copies), {data['test_examples']} test dialogues. {choices['num_canaries']} canaries x "
        f"{choices['canary_repetitions']} copies, p = 1/|R| = {data['canary_prior']:.3g}, target r = "
        f"{choices['canary_target']:g}.",
        f"Training: B = {choices['expected_batch_size']:g}, T = {choices['max_steps']}, C = "
        f"{choices['per_example_clip_norm']:g}, {choices['accountant']} accountant, hush_hf LP c = "
        f"{choices['lp_c']:g}. Exposure: at most {results['exposure_max_possible'] or 0:.4g} bits, chance "
        "~1.44 bits.",
    ], sections, results=results)


def run(args: GPT2CanaryArguments, config: Any, session: ex.Session) -> dict[str, Any]:
    from transformers import DataCollatorForLanguageModeling

    from hush_hf.accounting import get_accountant, lp_budget

    output_dir, main_process, watch = session.output_dir, session.main_process, session.watch
    with watch("data and canaries"):
        train_text, test_text, source, canaries, secrets = load_dialogues(args)
        secret_ids = ex.secret_ids_column(train_text)
        sizes, _ = ex.secret_counts(secret_ids, len(secrets))
    with watch("planning"):  # uniform_dp keeps every example (w = 1); CRT's DP steps use its noise
        wanted = [m for m in ("uniform_dp", "hush_hf") if m in args.methods]
        wanted = ["uniform_dp"] * ("crt" in args.methods and "uniform_dp" not in wanted) + wanted
        budget = lp_budget(secrets.priors, secrets.targets, get_accountant(config.accountant).lp_budget)
        lp_cs = {"uniform_dp": ex.no_preprocessing_lp_c(sizes, budget), "hush_hf": config.lp_c}
        plans = session.on_main_process(
            lambda: {m: ex.plan_for_config(secret_ids, secrets, config, lp_c=lp_cs[m]) for m in wanted})
        for method, found in plans.items() if main_process else ():
            found.save(output_dir / "plans" / f"{method}.json")
            logger.info("%s plan: retained weight %.3f, sigma %.4g", method, found.retained_weight_fraction,
                        found.noise_multiplier)
    with watch("tokenizing"):
        tokenizer = ex.causal_tokenizer(args.model_name_or_path)
        tokenized = partial(ex.tokenize_text, tokenizer=tokenizer, text_column="text",
                            max_length=args.max_seq_length)
        train, test = tokenized(train_text, keep_text=True), tokenized(test_text)  # ids checked on the text
        collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
        test_batches = ex.collate_batches(test, collator, args.eval_batch_size)
        members, nonmembers = ex.membership_rows(train_text["text"], canaries, test_text["text"],
                                                 args.mia_examples, seed=args.canary_seed)
    rows: list[dict[str, Any]] = []  # one per trained model

    def train_and_attack(method: str, plan: Any, data: Any, gamma: float | None = None, **overrides: Any):
        run_dir = output_dir / "runs" / (method if gamma is None else f"{method}_gamma{gamma:g}")
        with watch(f"training {method}"):
            model = ex.causal_model(args.model_name_or_path, len(tokenizer), seed=config.seed,
                                    n_layer=args.model_layers, n_embd=args.model_width,
                                    n_head=args.model_heads, n_positions=max(64, args.max_seq_length))
            _, record = ex.train_model(model, config, plan, train=data, collator=collator, run_dir=run_dir,
                                       **overrides)
        with watch(f"attacks {method}"):
            found = ex.causal_lm_attacks(
                model, tokenizer, canaries, test_batches=test_batches, members=members, nonmembers=nonmembers,
                exposure_samples=args.exposure_samples, num_fresh_canaries=args.canary_nonmembers,
                max_length=args.max_seq_length, batch_size=args.eval_batch_size, seed=args.canary_seed)
        rows.append({"method": method, "gamma": gamma, **record, **found,
                     "certified": plan is not None and plan.meets_targets,
                     "bound_over_target_max": plan and plan.summary()["bound_over_target_max"],
                     "retained_weight_fraction": plan and plan.retained_weight_fraction})
        logger.info("%s (gamma %s): perplexity %.4g, exposure mean %.3g max %.3g bits", method, gamma,
                    found["test_perplexity"], found["exposure_mean"], found["exposure_max"])

    for method in tqdm([m for m in args.methods if m in BASE_METHODS], desc="Models"):
        train_and_attack(method, plans.get(method), train)
    crt_methods, crt_records = [m for m in args.methods if m in CRT_METHODS], []
    for gamma in tqdm(args.gammas if crt_methods else [], desc="CRT gammas"):
        with watch("CRT data and plans"):
            data, records = ex.redacted_arms(train_text, canaries, secrets, gamma, methods=crt_methods,
                                             target=args.canary_target, mask=tokenizer.eos_token,
                                             dedup=args.crt_dedup)
            crt_records += records
            gamma_plans = session.on_main_process(lambda rows=data: ex.crt_plans(
                config, ex.secret_ids_column(rows["crt"]), secrets, plans["uniform_dp"].noise_multiplier)
                if "crt" in rows else None) or {}
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
        "recipe": RECIPE, "choices": ex.run_choices(args, config),
        "data": {"source": source, "train_examples": len(train), "canary_rows": int(sizes.sum()),
                 "test_examples": len(test), "canary_prior": float(secrets.priors[0]),
                 "examples_per_canary": ex.describe_counts(sizes)},
        "exposure_max_possible": rows[0]["exposure_max_possible"] if rows else None,
        "rows": rows, "crt": crt_records,
        "table": ex.comparison([r for r in rows if r["gamma"] is None], [
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
        ex.fig3_figure(rows, args.gammas, output_dir / "crt_fig3.png", title=title)
    if main_process and args.save_canaries:
        from hush_hf.audit import save_canaries

        save_canaries(output_dir / "canaries_PRIVATE.json", canaries)
    return session.finish(results, page)


EXPERIMENT = ex.Experiment(RECIPE, GPT2CanaryArguments, PRESETS, validate=validate, run=run)
main, logger = EXPERIMENT.main, EXPERIMENT.logger

if __name__ == "__main__":
    main()
