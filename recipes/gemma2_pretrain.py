"""Hush Fig. 2-3: a small Gemma-2 pretrained from scratch with DP-SGD noise; validation loss and extraction.

    accelerate launch recipes/gemma2_pretrain.py            # offline default, <= 10 min on 2 CPU cores
    accelerate launch recipes/gemma2_pretrain.py --smoke    # < 60 s (CI)
    accelerate launch recipes/gemma2_pretrain.py --preset paper --dataset_name HuggingFaceFW/fineweb-edu \
        --tokenizer_name google/gemma-2-2b --model_config_name google/gemma-2-2b

Hush Sec. 5.2: the same model is pretrained once per noise multiplier sigma in {0, 1e-3, 1e-2, 1e-1}
(per-example clipping at C, uniform Poisson sampling) and evaluated by its validation loss (Fig. 2) and
the fraction of training sequences that are k-extractable (Fig. 3; Carlini et al. 2023): prompted with
the first k tokens of a training sequence, greedy decoding reproduces the next m. The same attack on
held-out sequences measures what the model gets right by generalising rather than by memorising.
These noise levels certify nothing: every training sequence is a secret (prior ``--sequence_prior``)
and the plan reports the bound the KL accountant gives at each sigma (~1); the trainer warns about it.

Presets: ``offline``: ACLSum paragraphs, UTF-8 bytes as tokens (no Gemma tokenizer offline, and one
trained on the training text would leak it), a Gemma-2 with 2 layers, width 128, 4 query / 2 key-value
heads of 32, FFN 256, from its config; 96 sequences of 96 bytes seen ~53 times each (B = 16, T = 320),
so that the noise-free model memorises within 10 minutes on 2 CPU cores; k = 48, m = 24. ``smoke``: 32
sequences of 48 bytes, T = 6 (CI). ``paper``: ``--dataset_name`` with Gemma-2's ``--tokenizer_name`` /
``--model_config_name``, 512 tokens, B = 256, T = 2000, k = m = 50. Outputs (``--output_dir``):
results.json, results.md, fig2_fig3.png, run.log; no training text, only counts and fractions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from hush_hf import experiments as ex

RECIPE = "gemma2_pretrain"
PAPER_NOISE_MULTIPLIERS = [0.0, 1e-3, 1e-2, 1e-1]

COMMON = {"learning_rate": 3e-3, "accountant": "kl"}
PRESETS: dict[str, dict[str, Any]] = {
    "offline": {
        **COMMON, "max_steps": 320, "expected_batch_size": 16.0, "per_device_train_batch_size": 16,
        "logging_steps": 40, "eval_steps": 80, "block_size": 96, "num_train_sequences": 96,
        "num_validation_sequences": 64, "prefix_length": 48, "suffix_length": 24,
    },
    "smoke": {
        **COMMON, "max_steps": 6, "expected_batch_size": 8.0, "per_device_train_batch_size": 8,
        "logging_steps": 2, "eval_steps": 3, "block_size": 48, "num_train_sequences": 32,
        "num_validation_sequences": 8, "prefix_length": 24, "suffix_length": 16, "model_width": 64,
        "model_layers": 1,
    },
    "paper": {
        **COMMON, "max_steps": 2000, "expected_batch_size": 256.0, "per_device_train_batch_size": 32,
        "learning_rate": 1e-3, "logging_steps": 50, "eval_steps": 250, "block_size": 512,
        "num_train_sequences": 100_000, "num_validation_sequences": 2_000, "prefix_length": 50,
        "suffix_length": 50,
    },
}


@dataclass
class Gemma2PretrainArguments(ex.ExperimentArguments):
    """Arguments of the recipe (training arguments are those of SecretProtectionConfig)."""

    text_column: str = field(default="text", metadata={"help": "Column holding the text."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "A tokenizer; default: UTF-8 bytes."})
    model_config_name: str | None = field(default=None, metadata={"help": "A Gemma-2 config; default: small"})
    model_layers: int = field(default=2, metadata={"help": "Layers of the small Gemma-2."})
    model_width: int = field(default=128, metadata={"help": "Width of the small Gemma-2."})
    block_size: int | None = field(default=None, metadata={"help": "Tokens per training sequence."})
    num_train_sequences: int | None = field(default=None, metadata={"help": "Training sequences."})
    num_validation_sequences: int | None = field(default=None, metadata={"help": "Held-out sequences."})
    noise_multipliers: list[float] = field(default_factory=lambda: list(PAPER_NOISE_MULTIPLIERS),
                                           metadata={"help": "sigma of each run."})
    prefix_length: int | None = field(default=None, metadata={"help": "k: prompt tokens of the extraction."})
    suffix_length: int | None = field(default=None, metadata={"help": "m: tokens decoding must match."})
    sequence_prior: float = field(default=1e-6, metadata={"help": "Prior of each sequence as a secret."})
    split_seed: int = field(default=0, metadata={"help": "Seed of the train/validation split."})
    eval_batch_size: int = field(default=32, metadata={"help": "Batch size of the extraction attack."})


def validate(args: Gemma2PretrainArguments, config: Any) -> None:
    """ValueError naming the field and value for every bad choice, before any work."""
    ex.refuse_owned_fields(config, {"noise_multiplier": "use --noise_multipliers", "plan_file": "per run",
                                    "secrets_file": "each training sequence is a secret"})
    if args.preset == "paper" and args.dataset_name is None:
        raise ValueError("preset='paper' needs --dataset_name (e.g. a web-text corpus)")
    for name in ("model_layers", "model_width", "eval_batch_size", "num_validation_sequences",
                 "prefix_length", "suffix_length"):
        ex.check_int(name, getattr(args, name), minimum=1)
    ex.check_int("block_size", args.block_size, minimum=4)
    ex.check_int("num_train_sequences", args.num_train_sequences, minimum=2)
    ex.check_int("split_seed", args.split_seed, minimum=0)
    ex.check_number("sequence_prior", args.sequence_prior, low=0.0, high=0.5)
    if args.prefix_length + args.suffix_length > args.block_size:
        raise ValueError(f"prefix_length + suffix_length = {args.prefix_length + args.suffix_length} exceeds "
                         f"block_size={args.block_size}")
    if not args.noise_multipliers or len(set(args.noise_multipliers)) != len(args.noise_multipliers):
        raise ValueError(f"noise_multipliers must be distinct numbers, got {args.noise_multipliers!r}")
    for sigma in args.noise_multipliers:
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"noise_multipliers entries must be finite and >= 0, got {sigma!r}")
    if config.eval_steps is None:
        raise ValueError("eval_steps must be set (validation loss every eval_steps steps)")


def load_texts(args: Gemma2PretrainArguments) -> tuple[list[str], str]:
    from hush_hf.assets import aclsum_paragraphs

    corpus, source = ex.load_corpus(args.dataset_name, args.dataset_split, [args.text_column],
                                    offline=aclsum_paragraphs, offline_source="ACLSum paragraphs (offline)")
    return corpus[args.text_column], source


def sequence_plan(args: Gemma2PretrainArguments, config: Any, num_sequences: int, sigma: float) -> Any:
    """Uniform sampling (every weight 1) at the given sigma, with the bound it gives each sequence."""
    from hush_hf.planning import plan_protection

    priors = np.full(num_sequences, args.sequence_prior)
    targets = np.full(num_sequences, min(0.5, 1e3 * args.sequence_prior))
    return plan_protection([[i] for i in range(num_sequences)], priors, targets, lp_c=1e12,
                           noise_multiplier=sigma, expected_batch_size=config.expected_batch_size,
                           steps=config.max_steps, accountant=config.accountant)


def run_one(args: Gemma2PretrainArguments, config: Any, plan: Any, *, vocab_size: int, train: Any,
            validation: Any, train_blocks: list[list[int]], validation_blocks: list[list[int]],
            output_dir: Path) -> dict[str, Any]:
    import time

    from transformers import default_data_collator

    from hush_hf.audit import extraction_attack
    from hush_hf.trainer import SecretProtectionTrainer

    sigma = plan.noise_multiplier
    model = ex.gemma2_model(args.model_config_name, vocab_size, width=args.model_width,  # the same init
                            layers=args.model_layers, max_length=args.block_size, seed=config.seed)
    # sigma is swept on purpose: set explicitly, so a plan that misses its targets still trains (loudly).
    run_args = ex.run_config(config, output_dir / "runs" / f"sigma_{sigma:g}", eval_strategy="steps",
                             noise_multiplier=sigma)
    trainer = SecretProtectionTrainer(model=model, args=run_args, train_dataset=train,
                                      plan=plan.bound_to(train),  # one secret per sequence, train's order
                                      eval_dataset=validation, data_collator=default_data_collator)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    curve = [(log["step"], log["eval_loss"]) for log in trainer.state.log_history if "eval_loss" in log]
    if not curve or curve[-1][0] != config.max_steps:
        curve.append((config.max_steps, trainer.evaluate()["eval_loss"]))
    model.eval()
    k, m = args.prefix_length, args.suffix_length
    on_train, on_validation = (extraction_attack(model, blocks, prefix_length=k, suffix_length=m,
                                                 batch_size=args.eval_batch_size)
                               for blocks in (train_blocks, validation_blocks))
    return {
        "noise_multiplier": sigma,
        "validation_loss": curve[-1][1],
        "validation_curve": curve,
        "extractable_fraction": on_train.fraction_extracted,
        "extractable_count": on_train.num_extracted,
        "train_token_accuracy": on_train.token_accuracy,
        "heldout_extractable_fraction": on_validation.fraction_extracted,
        "heldout_token_accuracy": on_validation.token_accuracy,
        "posterior_bound_max": float(plan.secrets.bound.max()),
        "train_seconds": seconds,
    }


def page(results: dict[str, Any]) -> str:
    columns = {"noise_multiplier": "sigma", "validation_loss": "validation loss",
               "extractable_fraction": "k-extractable (train)",
               "heldout_extractable_fraction": "k-extractable (held-out)",
               "train_token_accuracy": "token accuracy (train)",
               "posterior_bound_max": "posterior bound per sequence"}
    c, data = results["choices"], results["data"]
    table = ex.markdown_table(list(columns.values()), [[r[k] for k in columns] for r in results["rows"]])
    return ex.results_page("Hush Fig. 2-3: Gemma-2 pretraining with DP-SGD noise", [
        f"Data: {data['source']}, {data['tokens']}; {c['num_train_sequences']} training and "
        f"{c['num_validation_sequences']} validation sequences of {c['block_size']} tokens.",
        f"Training: B = {c['expected_batch_size']:g}, T = {c['max_steps']}, "
        f"C = {c['per_example_clip_norm']:g}, learning rate {c['learning_rate']:g}. Extraction: k = "
        f"{c['prefix_length']} prompt tokens, m = {c['suffix_length']} tokens reproduced by greedy decoding.",
    ], [("", f"{table}\n\n![Fig. 2-3](fig2_fig3.png)")], results=results)


def run(args: Gemma2PretrainArguments, config: Any, session: ex.Session) -> dict[str, Any]:
    from transformers import AutoTokenizer

    output_dir, watch = session.output_dir, session.watch
    with watch("data"):
        texts, source = load_texts(args)
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name) if args.tokenizer_name else None
        vocab_size = ex.BYTE_VOCAB if tokenizer is None else len(tokenizer)
        train_blocks, validation_blocks = ex.split_blocks(
            texts, tokenizer, block_size=args.block_size, num_train=args.num_train_sequences,
            num_validation=args.num_validation_sequences, seed=args.split_seed)
        train = ex.block_dataset(train_blocks, with_secret_ids=True)
        validation = ex.block_dataset(validation_blocks, with_secret_ids=False)
    with watch("planning"):
        plans = [sequence_plan(args, config, len(train_blocks), sigma) for sigma in args.noise_multipliers]
    rows = []
    for plan in tqdm(plans, desc="Noise multipliers"):
        with watch(f"sigma {plan.noise_multiplier:g}"):
            rows.append(run_one(args, config, plan, vocab_size=vocab_size, train=train, validation=validation,
                                train_blocks=train_blocks, validation_blocks=validation_blocks,
                                output_dir=output_dir))
        logger.info("sigma %g: validation loss %.4f, %d of %d training sequences extractable",
                    plan.noise_multiplier, rows[-1]["validation_loss"], rows[-1]["extractable_count"],
                    len(train_blocks))
    notes = [
        "At these sigmas the certified posterior bound of a sequence is ~1 (or 1 - Pr[never sampled]): these "
        "runs carry NO formal guarantee; they measure the empirical effect of small noise (Hush Sec. 5.2).",
        "The corpus is small and repeated (~B*T/N passes) so that memorisation shows in a short CPU run; "
        "noise then also acts as a regulariser, unlike in the paper's single pass over web text.",
        "Extraction results are counts: no training text is written to the outputs.",
        "Held-out extraction measures generalisation (text the model predicts without having seen it).",
    ]
    if args.model_config_name is None:
        notes.append(f"Gemma-2 ({args.model_layers} layers, width {args.model_width}) is built from its "
                     "config and trained from scratch, as in the paper.")
    if tokenizer is None:
        notes.append("Tokens are UTF-8 bytes (no Gemma tokenizer offline; a tokenizer trained on this text "
                     "would leak it), so losses are in nats per byte.")
    results = {
        "recipe": RECIPE, "choices": ex.run_choices(args, config), "rows": rows, "notes": notes,
        "data": {"source": source, "tokens": "UTF-8 bytes" if tokenizer is None else args.tokenizer_name},
        "files": ["results.json", "results.md", "fig2_fig3.png", "run.log"],
    }
    if session.main_process:
        title = f"Gemma-2 from scratch ({args.preset}): B={config.expected_batch_size:g}, "
        title += f"T={config.max_steps}"
        ex.fig2_fig3_figure(rows, output_dir / "fig2_fig3.png", title)
    return session.finish(results, page)


EXPERIMENT = ex.Experiment(RECIPE, Gemma2PretrainArguments, PRESETS, validate=validate, run=run)
main, logger = EXPERIMENT.main, EXPERIMENT.logger

if __name__ == "__main__":
    main()
