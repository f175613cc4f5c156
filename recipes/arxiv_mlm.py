"""Hush Fig. 1 and the paper's comparison on a pretrained BERT masked LM (Ganesh et al. 2025, Sec. 5.1).

    accelerate launch recipes/arxiv_mlm.py            # offline default (make demo): <= 10 min on 2 CPU cores
    accelerate launch recipes/arxiv_mlm.py --smoke    # under a minute (CI)
    accelerate launch --config_file configs/accelerate/single_gpu.yaml recipes/arxiv_mlm.py --preset paper \
        --dataset_name <arXiv abstracts on the Hub> --text_column abstract

Secrets: the words of a document-frequency band and planted canaries ``My ID is: <10 digits>``, all with
p = 1e-10 and r ~ U[2e-4, 1e-3]. For every c = 2^k the LP (eq. 1) weights the examples and sigma is
calibrated so that every posterior stays <= r, in the settings ``paper`` (budget c mu_j, KL accountant)
and ``hush_hf`` (budget c g_j, tight accountant); c is relative: c = 2^4 keeps every example (no LP).
``results.md`` compares, at one guarantee, ``non_private`` (plain ``Trainer``), ``paper_no_lp`` (the
paper's baseline), ``dp_sgd_tight`` (uniform sampling + tight: what an Opacus user runs) and ``hush_hf``
(LP at the smallest trained c + tight) by test loss and canary exposure (``arms.png``), and gives Fig.
1a-d (``fig1.png``). The model is the pretrained MiniLM-L6-H384 encoder (``hush_hf.assets``) with a new
MLM head; ``--trainable`` says what trains (README, "The demo", says why ``head``). The ``paper`` preset
fine-tunes BERT-Tiny from the Hub with the paper's x10 ``--accounting_scale`` (sigma / 10: the bounds
then hold ONLY for a 10x larger run, as every output says in capitals).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from hush_hf import experiments as ex

RECIPE = "arxiv_mlm"
PAPER_MODEL = "google/bert_uncased_L-2_H-128_A-2"
LORA_RANK = 8
CANARY_DIGITS = 10  # p = 10^-10, the word secrets' prior
# The comparison at one guarantee: arm -> (setting, c exponent) of its noisy run; None: the plain Trainer;
# "min": the smallest trained c.
ARMS = {"non_private": None, "paper_no_lp": ("paper", 4), "dp_sgd_tight": ("hush_hf", 4), "hush_hf": "min"}

COMMON = {"secret_selection": "df", "accounting_scale": 1.0, "trainable": "head", "learning_rate": 1e-2}
PRESETS: dict[str, dict[str, Any]] = {
    "offline": {
        **COMMON, "max_steps": 40, "expected_batch_size": 32.0, "per_device_train_batch_size": 32,
        "max_seq_length": 64, "test_fraction": 0.02, "max_test_examples": 256, "secret_band": [50, 100],
        "planning_workers": 2, "c_exponents": [-6, 0, 2, 4], "train_c_exponents": [-6, 0, 4],
        "num_canaries": 5, "canary_repetitions": 50, "exposure_samples": 2000,
    },
    "smoke": {
        **COMMON, "max_steps": 3, "expected_batch_size": 8.0, "per_device_train_batch_size": 8,
        "logging_steps": 1, "max_seq_length": 32, "max_train_examples": 600, "test_fraction": 0.02,
        "max_test_examples": 32, "secret_band": [4, 8], "max_secrets": 20, "planning_workers": 1,
        "c_exponents": [2, 4], "train_c_exponents": [4], "num_canaries": 2, "canary_repetitions": 3,
        "exposure_samples": 50,
    },
    "paper": {
        **COMMON, "model_name_or_path": PAPER_MODEL, "trainable": "all", "max_steps": 2000,
        "expected_batch_size": 2048.0, "per_device_train_batch_size": 256, "learning_rate": 1e-3,
        "logging_steps": 50, "max_seq_length": 128, "test_fraction": 0.05, "max_test_examples": 10_000,
        "secret_selection": "rank", "secret_band": [50_000, 150_000], "planning_workers": 4,
        "c_exponents": list(range(-6, 5)), "train_c_exponents": list(range(-6, 5)),
        "accounting_scale": 10.0, "num_canaries": 10, "canary_repetitions": 100, "exposure_samples": 10_000,
    },
}


@dataclass
class ArxivMLMArguments(ex.SweepArguments, ex.TextExperimentArguments):
    """Arguments of the recipe (training arguments are those of SecretProtectionConfig)."""

    trainable: str | None = field(default=None, metadata={"help": "What trains: head, lora or all."})
    secret_selection: str | None = field(default=None, metadata={"help": "df: lo <= df <= hi; rank: lo..hi"})
    secret_band: list[int] | None = field(default=None, metadata={"help": "lo hi of --secret_selection."})
    max_secrets: int | None = field(default=None, metadata={"help": "Keep a random subset of N words."})
    secret_prior: float = field(default=1e-10, metadata={"help": "p_j of every word secret."})
    secret_target_range: list[float] = field(default_factory=lambda: [2e-4, 1e-3], metadata={"help": "r ~ U"})
    secret_seed: int = field(default=0, metadata={"help": "Seed of the targets, canaries and test split."})
    keep_secretless: bool = field(default=False, metadata={"help": "Train on examples without secrets too."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Fraction of tokens masked."})
    save_models: bool = field(default=False, metadata={"help": "Save every trained model under runs/."})


def validate(args: ArxivMLMArguments, config: Any) -> None:
    """ValueError naming the field and value for every bad choice, before any work."""
    ex.refuse_owned_fields(config, {
        "noise_multiplier": "use --accounting_scale to train with less noise than the certified",
        "secrets_file": "secrets are chosen by --secret_selection/--secret_band",
        "plan_file": "plans are computed for every c", "lp_c": "use --c_exponents",
        "accountant": "use --settings",
    })
    if args.preset == "paper" and args.dataset_name is None:
        raise ValueError("preset='paper' needs --dataset_name (no arXiv corpus exists offline)")
    ex.check_text_arguments(args, min_seq_length=8)
    ex.check_sweep_arguments(args)
    ex.check_choice("trainable", args.trainable, ex.MASKED_LM_TRAINABLE)
    ex.check_choice("secret_selection", args.secret_selection, ("df", "rank"))
    ex.check_pair("secret_band", args.secret_band, kind=int)
    ex.check_int("secret_band[0]", args.secret_band[0], minimum=0 if args.secret_selection == "rank" else 1)
    ex.check_int("max_secrets", args.max_secrets, minimum=1, allow_none=True)
    ex.check_pair("secret_target_range", args.secret_target_range, kind=float)
    ex.check_number("mlm_probability", args.mlm_probability, low=0.0, high=1.0)


# ----------------------------------------------------------------------------------- data and secrets
def load_data(args: ArxivMLMArguments) -> tuple[Any, Any, str, Any, list[Any], int]:
    """(tagged train with the canary rows, test, description, SecretSet of the words then the canaries,
    canaries, number of word secrets). Offline, whole papers are held out for the test set."""
    from hush_hf.assets import aclsum_paragraphs
    from hush_hf.secrets import select_by_document_frequency

    column, group = args.text_column, "doc_id" if args.dataset_name is None else None
    corpus, source = ex.load_corpus(args.dataset_name, args.dataset_split, [column],
                                    offline=aclsum_paragraphs,
                                    offline_source="ACLSum paragraphs (offline stand-in for arXiv abstracts)")
    train, test = ex.split_held_out(corpus, args.test_fraction, seed=args.secret_seed, group_column=group,
                                    max_train=args.max_train_examples, max_test=args.max_test_examples)
    train, test, band = train.select_columns([column]), test.select_columns([column]), tuple(args.secret_band)
    words = select_by_document_frequency(  # Hush Sec. 5.1: a document-frequency band of the training texts
        train, text_column=column, rank_range=band if args.secret_selection == "rank" else None,
        df_range=band if args.secret_selection == "df" else None, prior=args.secret_prior,
        target_range=tuple(args.secret_target_range), seed=args.secret_seed, max_secrets=args.max_secrets,
    )
    targets = ex.uniform_targets(args.num_canaries, *args.secret_target_range, seed=args.secret_seed + 1)
    train, secrets, canaries = ex.tag_with_canaries(
        train, words, num_canaries=args.num_canaries, repetitions=args.canary_repetitions, targets=targets,
        seed=args.secret_seed, text_column=column, digits=CANARY_DIGITS)
    logger.info("Secrets: %d words (%s band %s), %d canaries", len(words), args.secret_selection, band,
                len(canaries))
    return train, test, source, secrets, canaries, len(words)


# ----------------------------------------------------------------------------------- outputs
def page(results: dict[str, Any]) -> str:
    choices, data, gap = results["choices"], results["data"], results["gap_closed"]
    closed = "" if gap is None else (f"hush_hf closes **{100 * gap:.0f}%** of the test-loss gap between the "
                                     "paper's baseline (no LP, KL accountant) and non-private training. ")
    return ex.results_page("Hush Fig. 1 and the comparison at one guarantee: BERT masked LM", [
        f"Data: {data['source']}: {data['train_examples']} training / {data['test_examples']} test examples; "
        f"{data['word_secrets']} secret words (examples per word: {data['examples_per_secret']}) and "
        f"{data['canaries']} canaries x {choices['canary_repetitions']} copies (p = 1e-10, r ~ U"
        f"{choices['secret_target_range']}).",
        f"Model: {data['model']}; trained: {choices['trainable']} ({data['trainable_parameters']:,} "
        f"parameters). B = {choices['expected_batch_size']:g}, T = {choices['max_steps']}, C = "
        f"{choices['per_example_clip_norm']:g}, learning rate {choices['learning_rate']:g}. At "
        f"initialisation: test loss {results['init_test_loss']:.4g}, mean exposure "
        f"{results['init_exposure_mean'] or 0:.3g} bits.",
    ], [
        ("The comparison at one guarantee (same p, r, T, B)", f"{results['arms_table']}\n\n{closed}"
         "Exposure by chance: ~1.44 bits."),
        ("Fig. 1: the LP constant c", f"{ex.sweep_table(results['rows'])}\n\n![Fig. 1](fig1.png)"),
    ], results=results, warning=results["warning"])


# ----------------------------------------------------------------------------------- the experiment
def run(args: ArxivMLMArguments, config: Any, session: ex.Session) -> dict[str, Any]:
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    from hush_hf.assets import bert_uncased_tokenizer
    from hush_hf.trainer import MaskedPositionsTrainer, masked_positions_loss

    output_dir, main_process, watch = session.output_dir, session.main_process, session.watch
    if warning := ex.accounting_scale_warning(args.accounting_scale):
        ex.loud(warning)
    with watch("data and secrets"):
        train_text, test_text, source, secrets, canaries, num_words = load_data(args)
        secret_ids = ex.secret_ids_column(train_text)
        sizes, with_a_secret = ex.secret_counts(secret_ids, len(secrets))
    with watch("planning"):  # the main process plans; every rank trains with exactly its plans
        rows, plans = session.on_main_process(lambda: ex.plan_sweep(
            {s: ex.FIG1_SETTINGS[s] for s in args.settings}, args.c_exponents, secret_ids, secrets, sizes,
            config=config, c_unit=args.c_unit, workers=args.planning_workers, plan_dir=output_dir / "plans",
            keep=args.train_c_exponents or [], drop_secretless=not args.keep_secretless))
        for row in (r for r in rows if "noise_multiplier" in r):
            row["noise_multiplier_trained"] = row["noise_multiplier"] / args.accounting_scale
    with watch("tokenizing"):
        name = args.model_name_or_path
        tokenizer = AutoTokenizer.from_pretrained(name) if name else bert_uncased_tokenizer()
        encode = partial(ex.tokenize_text, tokenizer=tokenizer, text_column=args.text_column,
                         max_length=args.max_seq_length)
        train, test = encode(train_text, keep_text=True), encode(test_text)  # secret_ids checked on the text
        collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=args.mlm_probability)
        fixed = DataCollatorForLanguageModeling(tokenizer, args.mlm_probability, seed=args.secret_seed)
        test_batches = ex.collate_batches(test, fixed, args.eval_batch_size)  # the same masks for every model

    # Every run starts from the same model: built once, then copied with the random states the build left.
    build_model = ex.copied_builds(
        partial(ex.bert_masked_lm, name, trainable=args.trainable, seed=config.seed, lora_rank=LORA_RANK))

    def score(model: Any) -> dict[str, Any]:
        """Test loss, and canary exposure (the canaries' fill-in likelihood among random candidates)."""
        found = ex.exposure(model, tokenizer, canaries, kind="masked", samples=args.exposure_samples,
                            batch_size=args.eval_batch_size, seed=args.secret_seed) if canaries else {}
        loss = test_loss(model)
        return {"test_loss": loss, "exposure_mean": None, "exposure_max": None, **found}

    with watch("training"):
        initial = build_model()
        # trainable=head: every run's encoder is the initial one, frozen; its evaluation-mode outputs on
        # the test batches are computed once and each model's head scored on them (the same loss, bit
        # for bit; a model whose encoder differs is scored by the full forward).
        test_loss = (ex.FrozenEncoderTestLoss(initial, test_batches) if args.trainable == "head" else partial(
            ex.mean_token_loss, batches=test_batches, per_example_loss=masked_positions_loss, causal=False))
        init = score(initial)
        runs = ex.train_sweep(rows, plans, build_model=build_model, score=score, config=config, train=train,
                              collator=collator, output_dir=output_dir, trainer_class=MaskedPositionsTrainer,
                              save_models=args.save_models)
        if isinstance(test_loss, ex.FrozenEncoderTestLoss):
            logger.info("test loss: %d of %d models scored on the frozen encoder's states computed once",
                        test_loss.cached, len(runs) + 1)
    arms = ex.sweep_arms(ARMS, rows, runs, smallest_c=min(args.train_c_exponents or [0]))
    results = {
        "recipe": RECIPE, "certified_for_this_run": warning is None, "warning": warning,
        "choices": ex.run_choices(args, config),
        "data": {
            "source": source, "train_examples": len(train), "test_examples": len(test),
            "model": args.model_name_or_path or "MiniLM-L6-H384 (pretrained, offline) + a new MLM head",
            "trainable_parameters": sum(p.numel() for p in initial.parameters() if p.requires_grad),
            "word_secrets": num_words, "canaries": len(canaries), "secrets": len(secrets),
            "examples_with_a_secret": with_a_secret,
            "examples_per_secret": ex.describe_counts(sizes[:num_words]),
        },
        "init_test_loss": init["test_loss"], "init_exposure_mean": init["exposure_mean"],
        "arms": arms, "rows": rows, "runs": runs,
        "gap_closed": ex.gap_closed(arms, baseline="paper_no_lp", best="non_private", method="hush_hf"),
        "notes": [
            "Secrets and canaries are named by index only; the words and canary values are written nowhere.",
            f"c unit: {args.c_unit}" + (" (c = 2^4 keeps every example)" * (args.c_unit == "relative")),
            "Examples without any secret are " + ("kept." if args.keep_secretless else "discarded (paper)."),
            "non_private trains with plain transformers.Trainer (no clipping, no noise): no guarantee.",
            "The canaries are secrets of every plan; exposure ranks a canary's fill-in likelihood (one "
            "[MASK] per token) among random candidates, extrapolated to |R| = 10^10 by a skew-normal fit.",
        ],
        "files": ["results.json", "results.md", "arms.png", "fig1.png", "plans/", "run.log"],
    }
    title = f"BERT MLM ({args.preset}): B={config.expected_batch_size:g}, T={config.max_steps}"
    title += f" | NOISE / {args.accounting_scale:g}: NOT CERTIFIED" if warning else ""
    results["arms_table"] = ex.comparison(  # table and bar chart (arms.png)
        arms, ("arm", "c", "accountant", "sigma", "test_loss", "exposure_mean", "exposure_max"),
        [("test_loss", "test loss (dotted: at init)", init["test_loss"]),
         ("exposure_mean", "mean canary exposure, bits (dotted: chance)", 1.44)],
        output_dir / "arms.png", title=title, draw=main_process)
    if main_process:
        ex.sweep_figure(rows, output_dir / "fig1.png", init_loss=init["test_loss"], title=title)
    session.finish(results, page)
    if warning:
        ex.loud(warning)
    return results


EXPERIMENT = ex.Experiment(RECIPE, ArxivMLMArguments, PRESETS, validate=validate, run=run)
main, logger = EXPERIMENT.main, EXPERIMENT.logger

if __name__ == "__main__":
    main()
