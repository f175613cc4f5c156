"""CRT's canary experiment (Zhao et al. 2022, Sec. 5): GPT-2 on dialogues, non-private vs DP-SGD vs hush_hf.

    accelerate launch recipes/gpt2_canary.py            # offline default: CRT Fig. 3, <= 10 min, 2 CPUs
    accelerate launch recipes/gpt2_canary.py --smoke    # about a minute (CI)
    accelerate launch recipes/gpt2_canary.py --preset paper --model_name_or_path distilgpt2 \
        --dataset_name <dialogue dataset> --text_column <column>

Ten canaries "My ID is: <6 random digits>" are inserted ``--canary_repetitions`` times each (CRT,
Sec. 5.1: 20; the offline preset: 10) into the training dialogues. Each canary is declared a secret
with the prior of a blind guess, p = 1/|R| = 1e-6, and a target posterior r (``--canary_target``,
default 1e-3). Three models are trained for the same T steps of expected batch size B:

- ``non_private``: plain ``transformers.Trainer`` (shuffled batches of B, no clipping, no noise);
- ``uniform_dp``: DP-SGD with uniform Poisson sampling (every example at rate B/n: the LP with a
  constant c large enough to keep everything) and the noise the ``--accountant`` needs for every
  canary's target;
- ``hush_hf``: the LP weights (Hush eq. 1, c = ``--lp_c``) and the noise calibrated for them.

CRT arms (CRT Fig. 3), once per false-negative rate gamma in ``--gammas`` (default 0, 0.1, 0.3, 0.5):
the redaction policy pi knows only the first (1 - gamma) share of the canaries (it misses the rest on
purpose) and masks their copies with the tokenizer's EOS token; the conservative policy pi_c (any
six-digit number: every canary) decides the private rows.

- ``non_private_redacted``: plain ``Trainer`` on Redact_pi(D) (no dedup, no clipping, no noise);
- ``crt``: CRT Alg. 1: Dedup (exact rows and repeated sentences), Redact_pi, then ordinary steps on
  the public rows interleaved with DP-SGD steps (uniform sampling) at the noise of ``uniform_dp``;
- ``hush_hf_crt``: the same data with hush_hf's CRT mode: the LP plan for the canaries that pi missed
  (tagged by their values, as the secrets file would) and ordinary public steps in between.

Both DP models certify posterior <= r for every canary. Reported per model: test perplexity,
canary exposure (Carlini et al. 2019: log2|R| - log2 rank; the max and mean over the 10 canaries,
rank estimated from a skew-normal fit to ``--exposure_samples`` random candidates since |R| = 10^6),
membership inference on the canaries (the 10 inserted canary texts against fresh random values of
the same format, CRT A.5) and on ordinary examples (training vs held-out dialogues; loss attack).

Runs: the three arms without redaction do not depend on gamma and are trained once; the CRT arms are
trained once per gamma (crt and hush_hf_crt take 2T optimizer steps: T public, T DP), 3 + 3 x 4 = 15
models in all. crt's plan is evaluated at uniform_dp's sigma (calibrated higher only if that does
not certify every canary on the redacted rows).

Presets: ``offline`` (default): the Chit Chat Challenge dialogues (7,168 chats; 200 training chats
and 10 x 10 canary rows, so a canary row is 1 in 3 and is seen ~8 times in T = 16 steps), a
2-layer GPT-2 of width 64 with the GPT-2 vocabulary built from its config (no weights offline),
chats cut at 20 tokens, B = 16, T = 16, 200 exposure candidates. The 50,257-token vocabulary is
~97% of the cost of a token (output layer, softmax, its ghost norms), hence so few tokens: all 15
models fit in 10 minutes of CPU time (see docs/benchmarks.md). ``smoke``: 120 chats, T = 3, B = 8,
the KL accountant, uniform_dp planned (the CRT arm's noise) but not trained, the CRT arms at
gamma = 0.5 only: every arm's code path in about a minute. ``paper``: distilgpt2 (CRT's model) on
``--dataset_name``, B = 256, T = 1000.

Outputs in ``--output_dir`` (default ``outputs/gpt2_canary``): ``results.json``, ``results.md``,
``canaries.png``, ``crt_fig3.png`` (exposure and perplexity against gamma), ``plans/*.json`` and
``run.log``. The canary values are secrets: they are written
nowhere (canaries are referred to by index), unless ``--save_canaries`` asks for the private file
``canaries_PRIVATE.json``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    RESULTS_JSON,
    RESULTS_MARKDOWN,
    RecipeArguments,
    Stopwatch,
    check_int,
    check_number,
    collate_batches,
    describe_counts,
    fmt,
    markdown_table,
    mean_token_loss,
    new_figure,
    no_preprocessing_lp_c,
    non_private_config,
    recipe_main,
    refuse_recipe_owned_fields,
    run_config,
    save_figure,
    write_json,
)
from tqdm.auto import tqdm

RECIPE = "gpt2_canary"
BASE_METHODS = ("non_private", "uniform_dp", "hush_hf")
CRT_METHODS = ("non_private_redacted", "crt", "hush_hf_crt")  # one run per gamma
METHODS = BASE_METHODS + CRT_METHODS
SIX_DIGITS = r"(?<!\d)\d{6}(?!\d)"  # pi_c: every canary of the default space

PRESETS: dict[str, dict[str, Any]] = {
    # offline: the 15 models of CRT Fig. 3 (3 + 3 per gamma) within 10 minutes of one CPU core. The
    # GPT-2 vocabulary (50,257) is ~97% of the cost of a token, so few tokens: B x T x length is small.
    "offline": {
        "max_steps": 16,
        "expected_batch_size": 16.0,
        "per_device_train_batch_size": 16,
        "learning_rate": 3e-3,
        "logging_steps": 4,
        "max_seq_length": 20,
        "max_train_examples": 200,
        "canary_repetitions": 10,
        "max_test_examples": 64,
        "exposure_samples": 200,
        "canary_nonmembers": 50,
        "mia_examples": 32,
    },
    # smoke: every arm's code path once in about a minute; uniform_dp is planned (crt's noise), not trained
    "smoke": {
        "methods": ["non_private", "hush_hf", *CRT_METHODS],
        "accountant": "kl",  # calibrates in ms; the tight accountant has its own tests
        "max_steps": 3,
        "expected_batch_size": 8.0,
        "per_device_train_batch_size": 8,
        "learning_rate": 3e-3,
        "logging_steps": 1,
        "max_seq_length": 24,
        "max_train_examples": 120,
        "max_test_examples": 8,
        "exposure_samples": 40,
        "canary_nonmembers": 10,
        "mia_examples": 8,
        "model_width": 32,
        "gammas": [0.5],
    },
    "paper": {
        "model_name_or_path": "distilgpt2",
        "max_steps": 1000,
        "expected_batch_size": 256.0,
        "per_device_train_batch_size": 32,
        "learning_rate": 5e-4,
        "logging_steps": 50,
        "max_seq_length": 128,
        "max_test_examples": 2000,
        "exposure_samples": 20000,
        "canary_nonmembers": 1000,
        "mia_examples": 1000,
    },
}

logger = logging.getLogger("recipes.gpt2_canary")


@dataclass
class GPT2CanaryArguments(RecipeArguments):
    """Arguments of the recipe (training arguments are those of SecretProtectionConfig)."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset or local file; default: offline Chit Chat dialogues."}
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the dialogue text."})
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A causal LM checkpoint (e.g. distilgpt2); default: small GPT-2 config."},
    )
    model_layers: int = field(default=2, metadata={"help": "Layers of the GPT-2 built from its config."})
    model_width: int = field(default=64, metadata={"help": "Width of the GPT-2 built from its config."})
    model_heads: int = field(
        default=2, metadata={"help": "Attention heads of the GPT-2 built from its config."}
    )
    max_seq_length: int | None = field(default=None, metadata={"help": "Tokens per example (truncated)."})
    max_train_examples: int | None = field(default=None, metadata={"help": "Training dialogues kept."})
    test_fraction: float = field(default=0.1, metadata={"help": "Fraction of dialogues held out."})
    max_test_examples: int | None = field(default=None, metadata={"help": "At most N test dialogues."})
    num_canaries: int = field(default=10, metadata={"help": "Canaries inserted (CRT: 10)."})
    canary_repetitions: int = field(default=20, metadata={"help": "Copies of each canary (CRT: 20)."})
    canary_target: float = field(default=1e-3, metadata={"help": "Target posterior r of every canary."})
    canary_seed: int = field(default=0, metadata={"help": "Seed of the canary values, positions and split."})
    methods: list[str] = field(default_factory=lambda: list(METHODS), metadata={"help": "Models to train."})
    gammas: list[float] = field(
        default_factory=lambda: [0.0, 0.1, 0.3, 0.5],
        metadata={"help": "False-negative rates of the redaction policy (CRT arms, CRT Fig. 3)."},
    )
    crt_dedup: bool = field(default=True, metadata={"help": "CRT arms: dedup rows and sentences (Alg. 1)."})
    exposure_samples: int | None = field(default=None, metadata={"help": "Candidates for the exposure fit."})
    canary_nonmembers: int | None = field(
        default=None, metadata={"help": "Fresh canary-format texts for the canary membership attack."}
    )
    mia_examples: int | None = field(
        default=None, metadata={"help": "Training and held-out dialogues for the example membership attack."}
    )
    eval_batch_size: int = field(default=32, metadata={"help": "Batch size of evaluation and attacks."})
    save_canaries: bool = field(
        default=False,
        metadata={"help": "Write the canary values to canaries_PRIVATE.json (keep it private)."},
    )


def validate(args: GPT2CanaryArguments, config: Any) -> None:
    """ValueError naming the field and value for every bad choice, before any work."""
    refuse_recipe_owned_fields(
        config,
        {
            "noise_multiplier": "each DP model trains with its calibrated noise",
            "secrets_file": "the canaries are the secrets",
            "plan_file": "plans are computed for both DP models",
        },
    )
    if args.preset == "paper" and args.dataset_name is None:
        raise ValueError(
            "preset='paper' needs --dataset_name (the offline default is the smaller chit-chat run)"
        )
    for name in (
        "model_layers",
        "model_width",
        "model_heads",
        "num_canaries",
        "canary_repetitions",
        "eval_batch_size",
        "exposure_samples",
        "canary_nonmembers",
        "mia_examples",
    ):
        check_int(name, getattr(args, name), minimum=1)
    check_int("max_seq_length", args.max_seq_length, minimum=12)
    check_int("max_train_examples", args.max_train_examples, minimum=2, allow_none=True)
    check_int("max_test_examples", args.max_test_examples, minimum=2, allow_none=True)
    check_number("test_fraction", args.test_fraction, low=0.0, high=0.5)
    check_number("canary_target", args.canary_target, low=1e-6, high=1.0 - 1e-12)
    check_int("canary_seed", args.canary_seed, minimum=0)
    if not args.methods or len(set(args.methods)) != len(args.methods) or set(args.methods) - set(METHODS):
        raise ValueError(f"methods must be distinct names from {list(METHODS)}, got {args.methods!r}")
    if not args.gammas or any(not isinstance(g, float) or not 0 <= g < 1 for g in args.gammas):
        raise ValueError(f"gammas must be numbers in [0, 1), got {args.gammas!r}")
    if config.crt_schedule != "off":
        raise ValueError(
            f"crt_schedule={config.crt_schedule!r}: this recipe sets the CRT mode of its CRT arms"
        )
    if config.expected_batch_size is None or config.expected_batch_size != int(config.expected_batch_size):
        raise ValueError(
            f"expected_batch_size must be a whole number here (the non-private model trains "
            f"with batches of B), got {config.expected_batch_size!r}"
        )


# ----------------------------------------------------------------------------------- data
def load_dialogues(args: GPT2CanaryArguments) -> tuple[Any, Any, str]:
    """(train, test, description) with one ``text`` column; a seeded random split."""
    if args.dataset_name is None:
        from hush_hf.assets import chitchat_dialogues

        corpus, source = chitchat_dialogues(), "Chit Chat Challenge dialogues (offline)"
    else:
        from hush_hf.data import load_text_dataset

        corpus, source = load_text_dataset(args.dataset_name, split=args.dataset_split), args.dataset_name
    if args.text_column not in corpus.column_names:
        raise ValueError(
            f"text_column={args.text_column!r} is not a column of the dataset "
            f"(columns: {corpus.column_names})"
        )
    corpus = corpus.select_columns([args.text_column])
    if args.text_column != "text":
        corpus = corpus.rename_column(args.text_column, "text")
    corpus = corpus.filter(lambda row: len(row["text"].split()) >= 4, desc="Dropping near-empty dialogues")
    order = np.random.default_rng(args.canary_seed).permutation(len(corpus))
    n_test = max(2, round(args.test_fraction * len(corpus)))
    test = corpus.select(np.sort(order[:n_test])[: args.max_test_examples])
    train = corpus.select(np.sort(order[n_test:])[: args.max_train_examples])
    return train, test, source


def insert_canary_secrets(args: GPT2CanaryArguments, train: Any) -> tuple[Any, list[Any], Any]:
    """(train with canaries and ``secret_ids``, canaries, SecretSet): each canary is secret #k."""
    from hush_hf.audit.canaries import canary_secret_records, insert_canaries, make_canaries
    from hush_hf.secrets import SecretSet, tag_dataset, tagger_for

    canaries = make_canaries(args.num_canaries, args.canary_repetitions, seed=args.canary_seed)
    train, _ = insert_canaries(train, canaries, text_column="text", seed=args.canary_seed)
    secrets = SecretSet.from_records(canary_secret_records(canaries, args.canary_target))
    train = tag_dataset(train, tagger_for(secrets), text_column="text", num_secrets=len(secrets))
    return train, canaries, secrets


# ----------------------------------------------------------------------------------- planning
def make_plans(
    args: GPT2CanaryArguments, config: Any, secret_ids: Any, secrets: Any, sizes: np.ndarray, output_dir: Path
) -> dict[str, Any]:
    """The uniform DP-SGD plan (every w_i = 1) and the hush_hf plan (LP weights), both calibrated."""
    from hush_hf.accounting import lp_budget
    from hush_hf.planning.plan import plan_protection

    budget = lp_budget(secrets.priors, secrets.targets, "kl" if config.accountant == "kl" else "tight")
    lp_cs = {"uniform_dp": no_preprocessing_lp_c(sizes, budget), "hush_hf": config.lp_c}
    plans = {}
    wanted = [m for m in ("uniform_dp", "hush_hf") if m in args.methods]
    if "crt" in args.methods and "uniform_dp" not in wanted:
        wanted.insert(0, "uniform_dp")  # CRT's DP-SGD steps use uniform_dp's noise
    for method in tqdm(wanted, desc="Planning"):
        plans[method] = plan_protection(
            secret_ids,
            secrets.priors,
            secrets.targets,
            expected_batch_size=config.expected_batch_size,
            steps=config.max_steps,
            lp_c=lp_cs[method],
            accountant=config.accountant,
        )
        plans[method].save(output_dir / "plans" / f"{method}.json")
        logger.info(
            "%s plan: retained weight %.3f, sigma %.4g",
            method,
            plans[method].retained_weight_fraction,
            plans[method].noise_multiplier,
        )
    return plans


# ----------------------------------------------------------------------------------- CRT arms
def redacted_train(
    args: GPT2CanaryArguments,
    train_text: Any,
    canaries: list[Any],
    secrets: Any,
    gamma: float,
    *,
    mask: str,
    crt: bool,
) -> tuple[Any, dict[str, Any]]:
    """Training rows for a CRT arm at false-negative rate gamma, and what was done to them.

    pi masks the copies of the first (1 - gamma) share of the canaries; with ``crt``: Dedup first
    (``--crt_dedup``) and pi_c (any six-digit number) marks the private rows (column ``crt_public``).
    The rows are tagged with every canary (``secret_ids``): only the ones pi missed are still there.
    """
    import re

    from hush_hf.audit.canaries import canary_secret_records
    from hush_hf.crt import Policy, dedup_dataset, redact_dataset, secrets_policy
    from hush_hf.secrets import SecretSet, tag_dataset, tagger_for

    known = len(canaries) - round(gamma * len(canaries))
    data = train_text.remove_columns("secret_ids")
    record: dict[str, Any] = {"gamma": gamma, "canaries_missed": len(canaries) - known}
    if crt and args.crt_dedup:
        data, dedup = dedup_dataset(data, mask_token=mask)
        record["dedup_rows_removed"] = dedup.rows_in - dedup.rows_out
        record["dedup_sentences_masked"] = dedup.sentences_masked
    policies = []
    if known:
        known_secrets = SecretSet.from_records(canary_secret_records(canaries[:known], args.canary_target))
        policies.append(secrets_policy(known_secrets))
    pattern = re.compile(SIX_DIGITS)
    conservative = [Policy("six_digits", lambda t: [m.span() for m in pattern.finditer(t)])] if crt else []
    if policies or conservative:
        data, report = redact_dataset(data, policies, conservative_policies=conservative, mask_token=mask)
        data = data.remove_columns("crt_masked_spans")
        record.update(public_rows=report.public_rows, private_rows=report.private_rows)
        if not crt:
            data = data.remove_columns("crt_public")
    data = tag_dataset(data, tagger_for(secrets), text_column="text", num_secrets=len(secrets))
    return data, record


def crt_plans(
    args: GPT2CanaryArguments,
    config: Any,
    data: Any,
    secrets: Any,
    output_dir: Path,
    gamma: float,
    uniform_sigma: float,
) -> dict[str, Any]:
    """Plans of the CRT arms on the redacted rows: ``crt`` uniform (every w_i = 1) at uniform_dp's sigma
    (CRT's DP-SGD noise; calibrated higher only if that sigma does not certify every target here),
    ``hush_hf_crt`` the LP with its own calibrated sigma."""
    from hush_hf.planning.plan import plan_protection
    from hush_hf.trainer.plan_setup import column

    def plan(lp_c: float, sigma: float | None) -> Any:
        return plan_protection(
            column(data, "secret_ids"),
            secrets.priors,
            secrets.targets,
            expected_batch_size=config.expected_batch_size,
            steps=config.max_steps,
            lp_c=lp_c,
            accountant=config.accountant,
            noise_multiplier=sigma,
            allow_unmatched=True,  # redaction masked the known canaries: matching nothing is the point
        )

    plans = {}
    if "crt" in args.methods:  # c = 1e6 keeps every example
        plans["crt"] = plan(1e6, uniform_sigma)
        if not plans["crt"].meets_targets:
            plans["crt"] = plan(1e6, None)
    if "hush_hf_crt" in args.methods:
        plans["hush_hf_crt"] = plan(config.lp_c, None)
    for method, found in plans.items():
        found.save(output_dir / "plans" / f"{method}_gamma{gamma:g}.json")
    return plans


# ----------------------------------------------------------------------------------- models
def load_tokenizer(args: GPT2CanaryArguments) -> Any:
    if args.model_name_or_path is None:
        from hush_hf.assets import gpt2_tokenizer

        return gpt2_tokenizer()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_model(args: GPT2CanaryArguments, tokenizer: Any, seed: int) -> Any:
    from transformers import AutoModelForCausalLM, GPT2LMHeadModel, set_seed

    set_seed(seed)  # the same initialisation for every method
    if args.model_name_or_path is not None:
        return AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    from hush_hf.assets import gpt2_small_config

    config = gpt2_small_config(
        len(tokenizer),
        n_layer=args.model_layers,
        n_embd=args.model_width,
        n_head=args.model_heads,
        n_positions=max(64, args.max_seq_length),
    )
    return GPT2LMHeadModel(config)


def train_model(
    args: GPT2CanaryArguments,
    config: Any,
    plan: Any,
    *,
    train: Any,
    collator: Any,
    tokenizer: Any,
    run_dir: Path,
    **dp_overrides: Any,
) -> tuple[Any, dict[str, Any]]:
    """Train one model (``plan=None``: plain ``Trainer``, no clipping or noise); returns it and what the
    results record about the run. ``dp_overrides``: SecretProtectionConfig fields (CRT mode, sigma)."""
    import time

    from transformers import Trainer

    from hush_hf.trainer import SecretProtectionTrainer

    model = build_model(args, tokenizer, config.seed)
    if plan is None:
        trainer = Trainer(
            model=model,
            args=non_private_config(config, run_dir),
            train_dataset=train.remove_columns("secret_ids"),
            data_collator=collator,
        )
        sigma = None
    else:
        trainer = SecretProtectionTrainer(
            model=model,
            args=run_config(config, run_dir, **dp_overrides),
            train_dataset=train,
            data_collator=collator,
            plan=plan.bound_to(train),  # planned from train's secret_ids
        )
        sigma = trainer.dp.noise_multiplier
    start = time.perf_counter()
    result = trainer.train()
    return model, {
        "noise_multiplier": sigma,
        "train_loss": float(result.training_loss),
        "train_seconds": time.perf_counter() - start,
    }


def attack(
    model: Any,
    args: GPT2CanaryArguments,
    tokenizer: Any,
    canaries: list[Any],
    *,
    test_batches: list[Any],
    members: list[str],
    nonmembers: list[str],
    seed: int,
) -> dict[str, Any]:
    """Perplexity, canary exposure and the two membership attacks on one trained model."""
    from hush_hf.audit.exposure import canary_exposures, summarize_exposures
    from hush_hf.audit.membership import membership_attacks
    from hush_hf.trainer.losses import lm_per_example_loss

    model.eval()
    loss = mean_token_loss(model, test_batches, lm_per_example_loss, causal=True)
    exposures = summarize_exposures(
        canary_exposures(
            model,
            tokenizer,
            canaries,
            method="skewnorm",
            num_samples=args.exposure_samples,
            batch_size=args.eval_batch_size,
            seed=seed,
        )
    )
    space = canaries[0].space
    taken = {c.value for c in canaries}
    fresh = [
        v
        for v in space.random_values(4 * args.canary_nonmembers, np.random.default_rng(seed + 1))
        if v not in taken
    ][: args.canary_nonmembers]
    canary_mia = membership_attacks(
        model,
        tokenizer,
        [c.text for c in canaries],
        [space.text(v) for v in fresh],
        batch_size=args.eval_batch_size,
    )[0]
    example_mia = membership_attacks(
        model, tokenizer, members, nonmembers, max_length=args.max_seq_length, batch_size=args.eval_batch_size
    )[0]
    return {
        "test_loss": loss,
        "test_perplexity": math.exp(loss),
        "exposure_max": exposures["inserted"]["max"],
        "exposure_mean": exposures["inserted"]["mean"],
        "exposure_max_possible": exposures["max_possible"],
        "exposure_per_canary": [
            {"canary": c["index"], "exposure": c["exposure"]} for c in exposures["canaries"]
        ],
        "canary_mia": canary_mia.to_json(),
        "example_mia": example_mia.to_json(),
    }


# ----------------------------------------------------------------------------------- outputs
def plot_results(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    figure, axes = new_figure(1, 4, width=15, height=3.6)
    names = [r["method"] for r in rows]
    panels = [
        ("test_perplexity", "test perplexity"),
        ("exposure_max", "max canary exposure (bits)"),
        ("canary_mia_auc", "canary membership AUC"),
        ("example_mia_auc", "example membership AUC"),
    ]
    for ax, (key, label) in zip(axes.ravel(), panels, strict=True):
        ax.bar(names, [r[key] for r in rows], color=["tab:red", "tab:gray", "tab:blue"][: len(rows)])
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
        if key.endswith("auc"):
            ax.axhline(0.5, color="black", linestyle=":", linewidth=1)
            ax.set_ylim(0, 1)
    figure.suptitle(title, fontsize=10)
    return save_figure(figure, path)


def fig3_series(rows: list[dict[str, Any]], gammas: list[float], key: str) -> dict[str, list[Any]]:
    """Per arm, ``key`` at each gamma (arms without redaction repeat their one value)."""
    series: dict[str, list[Any]] = {}
    for method in METHODS:
        found = [r for r in rows if r["method"] == method]
        if found:
            by_gamma = {r["gamma"]: r[key] for r in found}
            series[method] = [by_gamma.get(g, by_gamma.get(None)) for g in gammas]
    return series


def plot_fig3(rows: list[dict[str, Any]], gammas: list[float], path: Path) -> Path:
    """CRT Fig. 3: max canary exposure, and test perplexity, against the policy's false-negative rate."""
    figure, axes = new_figure(1, 2, width=11, height=3.8)
    for ax, (key, label) in zip(
        axes.ravel(),
        [("exposure_max", "max canary exposure (bits)"), ("test_perplexity", "test perplexity")],
        strict=True,
    ):
        for method, values in fig3_series(rows, gammas, key).items():
            style = "-o" if method in CRT_METHODS else "--"
            ax.plot(gammas, values, style, label=method)
        ax.set_xlabel("false-negative rate gamma of the redaction policy")
        ax.set_title(label, fontsize=10)
    axes[0, 0].legend(fontsize=8)
    return save_figure(figure, path)


def results_markdown(results: dict[str, Any]) -> str:
    header = [
        "model",
        "sigma",
        "targets certified",
        "test PPL",
        "max exposure",
        "mean exposure",
        "canary MIA AUC",
        "example MIA AUC",
    ]
    table = [
        [
            r["method"],
            r["noise_multiplier"],
            r["certified"],
            r["test_perplexity"],
            r["exposure_max"],
            r["exposure_mean"],
            r["canary_mia_auc"],
            r["example_mia_auc"],
        ]
        for r in results["rows"]
    ]
    data, choices = results["data"], results["choices"]
    lines = [
        "# CRT canary experiment: GPT-2 on dialogues",
        "",
        f"Data: {data['source']}: {data['train_examples']} training rows "
        f"({data['canary_rows']} canary copies), {data['test_examples']} test dialogues. "
        f"{choices['num_canaries']} canaries x "
        f"{choices['canary_repetitions']} copies, p = 1/|R| = {data['canary_prior']:.3g}, target r = "
        f"{choices['canary_target']:g}.",
        f"Training: B = {choices['expected_batch_size']:g}, T = {choices['max_steps']}, C = "
        f"{choices['per_example_clip_norm']:g}, {choices['accountant']} accountant, hush_hf LP c = "
        f"{choices['lp_c']:g}. Exposure: max possible {fmt(results['exposure_max_possible'])} bits, "
        f"chance ~1.44 bits.",
        "",
        markdown_table(header, table),
        "",
        "![results](canaries.png)",
        "",
    ]
    if results["crt"]:
        gammas = results["choices"]["gammas"]
        header = ["model", *[f"gamma = {g:g}" for g in gammas]]
        for key, title in (
            ("exposure_max", "Max canary exposure (bits)"),
            ("test_perplexity", "Test perplexity"),
        ):
            series = fig3_series(results["rows"], gammas, key)
            lines += [
                f"### {title} against gamma (CRT Fig. 3)",
                "",
                markdown_table(header, [[m, *v] for m, v in series.items()]),
                "",
            ]
        lines += ["![CRT Fig. 3](crt_fig3.png)", ""]
    return "\n".join(lines + [f"- {note}" for note in results["notes"]]) + "\n"


# ----------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse and check the arguments, then run the experiment; returns what ``results.json`` holds."""
    return recipe_main(
        GPT2CanaryArguments, PRESETS, recipe_name=RECIPE, validate=validate, run=run, argv=argv
    )


def run(args: GPT2CanaryArguments, config: Any) -> dict[str, Any]:
    from transformers import DataCollatorForLanguageModeling

    from hush_hf.planning.memberships import membership_matrix
    from hush_hf.trainer.distributed import broadcast_object
    from hush_hf.trainer.plan_setup import column

    output_dir = Path(config.output_dir)
    main_process = config.process_index == 0
    watch = Stopwatch()
    with watch("data and canaries"):
        train_text, test_text, source = load_dialogues(args)
        train_text, canaries, secrets = insert_canary_secrets(args, train_text)
        secret_ids = column(train_text, "secret_ids")
        sizes = np.asarray(membership_matrix(secret_ids, len(secrets)).sum(axis=1)).ravel()
    with watch("planning"):
        planned = make_plans(args, config, secret_ids, secrets, sizes, output_dir) if main_process else None
        plans = broadcast_object(planned)
    with watch("tokenizing"):
        tokenizer = load_tokenizer(args)

        def encode(batch: dict[str, list[str]]) -> dict[str, Any]:
            return tokenizer(batch["text"], truncation=True, max_length=args.max_seq_length)

        train = train_text.map(encode, batched=True, remove_columns=["text"], desc="Tokenizing")
        test = test_text.map(encode, batched=True, remove_columns=["text"], desc="Tokenizing")
        collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
        test_batches = collate_batches(test, collator, args.eval_batch_size)
        canary_texts = {c.text for c in canaries}
        rng = np.random.default_rng(args.canary_seed)
        ordinary = [t for t in train_text["text"] if t not in canary_texts]
        members = [ordinary[k] for k in np.sort(rng.permutation(len(ordinary))[: args.mia_examples])]
        nonmembers = test_text["text"][: args.mia_examples]

    def train_and_attack(
        method: str, plan: Any, data: Any, run_dir: Path, gamma: float | None = None, **overrides: Any
    ) -> None:
        with watch(f"training {method}"):
            model, record = train_model(
                args,
                config,
                plan,
                train=data,
                collator=collator,
                tokenizer=tokenizer,
                run_dir=run_dir,
                **overrides,
            )
        with watch(f"attacks {method}"):
            found = attack(
                model,
                args,
                tokenizer,
                canaries,
                test_batches=test_batches,
                members=members,
                nonmembers=nonmembers,
                seed=args.canary_seed,
            )
        rows.append(
            {
                "method": method,
                "gamma": gamma,
                **record,
                "certified": plan is not None and plan.meets_targets,
                "bound_over_target_max": None if plan is None else plan.summary()["bound_over_target_max"],
                "retained_weight_fraction": None if plan is None else plan.retained_weight_fraction,
                **found,
                "canary_mia_auc": found["canary_mia"]["auc"],
                "example_mia_auc": found["example_mia"]["auc"],
            }
        )
        logger.info(
            "%s%s: perplexity %.4g, max exposure %.3g bits, canary MIA AUC %.3f",
            method,
            "" if gamma is None else f" (gamma {gamma:g})",
            found["test_perplexity"],
            found["exposure_max"],
            found["canary_mia"]["auc"],
        )

    rows: list[dict[str, Any]] = []
    for method in tqdm([m for m in args.methods if m in BASE_METHODS], desc="Models"):
        train_and_attack(method, plans.get(method), train, output_dir / "runs" / method)

    crt_methods = [m for m in args.methods if m in CRT_METHODS]
    crt_records = []
    mask = tokenizer.eos_token  # a token the tokenizer knows: the mask of Redact and Dedup

    def tokenized(data: Any) -> Any:
        return data.map(encode, batched=True, remove_columns=["text"], desc="Tokenizing")

    for gamma in tqdm(args.gammas if crt_methods else [], desc="CRT gammas"):
        with watch("CRT data and plans"):
            redacted = crt_data = None
            if "non_private_redacted" in crt_methods:
                redacted, record = redacted_train(
                    args, train_text, canaries, secrets, gamma, mask=mask, crt=False
                )
                crt_records.append({"arm": "non_private_redacted", **record})
                redacted = tokenized(redacted)
            gamma_plans: dict[str, Any] = {}
            if {"crt", "hush_hf_crt"} & set(crt_methods):
                crt_data, record = redacted_train(
                    args, train_text, canaries, secrets, gamma, mask=mask, crt=True
                )
                crt_records.append({"arm": "crt", **record})
                planned = None
                if main_process:
                    uniform_sigma = plans["uniform_dp"].noise_multiplier
                    planned = crt_plans(args, config, crt_data, secrets, output_dir, gamma, uniform_sigma)
                gamma_plans = broadcast_object(planned)
                crt_data = tokenized(crt_data)
        for method in crt_methods:
            run_dir = output_dir / "runs" / f"{method}_gamma{gamma:g}"
            if method == "non_private_redacted":
                train_and_attack(method, None, redacted, run_dir, gamma)
                continue
            plan = gamma_plans[method]
            train_and_attack(method, plan, crt_data, run_dir, gamma, crt_schedule="interleave")

    notes = [
        "Canaries are referred to by index; their values are secrets and are written nowhere"
        + (" except canaries_PRIVATE.json." if args.save_canaries else "."),
        "non_private trains with plain transformers.Trainer (no clipping, no noise); it has no guarantee.",
        "uniform_dp samples every example at rate B/n (no LP); hush_hf samples by the LP weights. Both "
        "calibrate sigma so that every canary's posterior bound is <= its target.",
        f"Exposure is estimated from {args.exposure_samples} random candidates (skew-normal fit); "
        "0 to ~1.44 bits is what an untrained model gets.",
    ]
    if args.model_name_or_path is None:
        notes.append(
            f"GPT-2 ({args.model_layers} layers, width {args.model_width}) is trained from its config "
            "with the GPT-2 vocabulary: no pretrained weights offline."
        )
    if crt_methods:
        notes.append(
            "CRT arms (CRT Fig. 3): pi misses the last gamma share of the canaries on purpose and masks the "
            "copies of the others with the EOS token; crt and hush_hf_crt dedup first"
            + (" (exact rows, repeated sentences)" if args.crt_dedup else " (off: --crt_dedup false)")
            + ", mark rows with a six-digit number private (pi_c) and interleave one ordinary public step "
            "(no clipping, no noise) before each DP step, so they take 2T optimizer steps. crt's DP steps "
            "use uniform sampling and uniform_dp's noise; hush_hf_crt plans for the canaries pi missed."
        )
    results = {
        "recipe": RECIPE,
        "choices": {
            **asdict(args),
            "max_steps": config.max_steps,
            "expected_batch_size": config.expected_batch_size,
            "per_example_clip_norm": config.per_example_clip_norm,
            "accountant": config.accountant,
            "lp_c": config.lp_c,
            "learning_rate": config.learning_rate,
            "seed": config.seed,
            "world_size": config.world_size,
        },
        "data": {
            "source": source,
            "train_examples": len(train),
            "canary_rows": int(sizes.sum()),
            "test_examples": len(test),
            "canary_prior": float(secrets.priors[0]),
            "examples_per_canary": describe_counts(sizes),
        },
        "exposure_max_possible": rows[0]["exposure_max_possible"] if rows else None,
        "rows": rows,
        "crt": crt_records,
        "notes": notes,
        "timings_seconds": {**watch.seconds, "total": watch.total()},
        "timings_cpu_seconds": {**watch.cpu_seconds, "total": watch.total_cpu()},
        "files": [RESULTS_JSON, RESULTS_MARKDOWN, "canaries.png", "plans/", "run.log"]
        + (["crt_fig3.png"] if crt_methods else []),
    }
    if main_process:
        if crt_methods:
            plot_fig3(rows, args.gammas, output_dir / "crt_fig3.png")
        plot_results(
            [r for r in rows if r["gamma"] is None],
            output_dir / "canaries.png",
            f"CRT canaries ({args.preset}): B={config.expected_batch_size:g}, T={config.max_steps}",
        )
        if args.save_canaries:
            from hush_hf.audit.canaries import save_canaries

            save_canaries(output_dir / "canaries_PRIVATE.json", canaries)
        results["timings_seconds"]["total"] = watch.total()
        results["timings_cpu_seconds"]["total"] = watch.total_cpu()
        write_json(output_dir / RESULTS_JSON, results)
        (output_dir / RESULTS_MARKDOWN).write_text(results_markdown(results), encoding="utf-8")
        logger.info("Results in %s (%.0f s, CPU %.0f s)", output_dir, watch.total(), watch.total_cpu())
    return results


if __name__ == "__main__":
    main()
