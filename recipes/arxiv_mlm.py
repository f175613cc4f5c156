"""Hush Fig. 1: BERT-Tiny masked LM, the LP constant c vs retained data, noise and test loss.

    accelerate launch recipes/arxiv_mlm.py                  # offline default, <= 10 min on 2 CPU cores
    accelerate launch recipes/arxiv_mlm.py --smoke          # < 60 s, what CI runs
    accelerate launch --config_file configs/accelerate/single_gpu.yaml recipes/arxiv_mlm.py --preset paper \
        --dataset_name <arXiv abstracts on the Hub> --text_column abstract

The experiment of Hush (Ganesh et al. 2025) Sec. 5.1: secrets are the words of a document-frequency
band, each with prior p = 1e-10 and a target posterior r ~ U[2e-4, 1e-3]; examples without a secret
are discarded (as in the paper; ``--keep_secretless`` keeps them); for every c = 2^k the LP (eq. 1)
weights the examples and the noise is calibrated so that every secret's posterior stays <= r. Per c the
recipe reports (Fig. 1a-d): the fraction of examples retained, the noise multiplier sigma, the test
loss trained without noise and the test loss trained with sigma; for two settings side by side:

- ``paper``: the paper's LP budget ``c * mu_j`` (mu_j = KL(Bern(r_j) || Bern(p_j))) and its KL
  accountant (Lemma 3.2);
- ``hush_hf``: hush_hf's defaults, the budget ``c * g_j`` and the ``tight`` accountant (Hayes et al.
  2023, blow-up function from a pessimistic PLD).

Units of c (``--c_unit``). The paper states that c = 2^4 keeps every example. With mu_j taken
literally (0.003 to 0.016 for these targets) a secret in 50-100 examples would need c in the
thousands for that, so by default (``relative``) c is measured in units that make the paper's
statement true on the corpus at hand: ``lp_c = c * max_j(|D_j| / budget_j) / 2^4``. The sweep then
spans the same range, "c = 2^4 = no preprocessing" down to "c = 2^-6 keeps ~1 example per secret",
in both settings; ``results.json`` gives every plan's absolute ``lp_c`` too. ``--c_unit absolute``
uses ``lp_c = c``.

Presets (every value can be overridden by its flag):

- ``offline`` (default): the 12,840 paragraphs of ACLSum (250 ACL papers) stand in for arXiv; 2% of
  the papers (whole papers) are held out for the test loss (at most 256 paragraphs); secrets are the
  words found in 50 to 100 training paragraphs (~780 words: the paper's band, "each in ~50-100
  documents", which its ranks 50,001-150,000 give on 1.7M abstracts); BERT uncased vocabulary,
  BERT-Tiny (L=2, H=128, A=2) built from its config (no weights offline); paragraphs cut at 64
  tokens (an example still counts as containing every secret of its full text: more protection,
  never less); B = 32, T = 40, AdamW at lr 2e-3; c in {2^-6, 2^0, 2^2, 2^4} planned and
  {2^-6, 2^0, 2^4} trained (with and without noise: 11 runs, as the no-noise run at c = 2^4 is the
  same in both settings). Chosen to finish within 10 minutes on 2 CPU cores: a run takes ~20 s (a
  step ~0.015 CPU-seconds per example with the head at the masked positions only, see
  ``hush_hf.trainer.masked_positions``) and a plan of the tight accountant 10 s to 3 min (2 planning
  processes); at
  small c the tight plans coincide (the LP solution scales with c), hence no 2^-3 by default.
- ``smoke``: 600 paragraphs, 20 secrets, T = 3, B = 8, two values of c (one trained); under a minute (CI).
- ``paper``: the paper's full settings for a GPU: ``--dataset_name`` (required; e.g. arXiv abstracts),
  ``google/bert_uncased_L-2_H-128_A-2``, words ranked 50,000-150,000 by document frequency,
  B = 2048, T = 2000, c = 2^-6 ... 2^4 all trained, and the paper's x10 accounting scale.

``--accounting_scale s`` (the paper's s = 10: "we assume our batch size and dataset size are 10
times larger, which is equivalent to reducing the noise multiplier by a factor of 10") trains with
sigma / s. The certified bounds then hold ONLY for the simulated s-times larger setting, NOT for the
model this run trains; the logs, ``results.json`` and ``results.md`` say so in capitals.

Outputs in ``--output_dir`` (default ``outputs/arxiv_mlm``): ``results.json`` (every choice, the
data, one row per setting and c, timings), ``results.md`` (the table), ``fig1.png`` (panels a-d),
``plans/*.json`` (the plans trained with; secrets by index only) and ``run.log``.
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
    check_pair,
    collate_batches,
    describe_counts,
    fmt,
    loud,
    markdown_table,
    mean_token_loss,
    new_figure,
    no_preprocessing_lp_c,
    plan_many,
    recipe_main,
    refuse_recipe_owned_fields,
    run_config,
    save_figure,
    write_json,
)
from tqdm.auto import tqdm

RECIPE = "arxiv_mlm"
PAPER_MODEL = "google/bert_uncased_L-2_H-128_A-2"
SETTINGS = {
    # name: (LP budget, accountant)
    "paper": ("paper", "kl"),
    "hush_hf": ("tight", "tight"),
}
NO_PREPROCESSING_C = 2.0**4  # the paper: at c = 2^4 the LP keeps every example

PRESETS: dict[str, dict[str, Any]] = {
    "offline": {
        "max_steps": 40,
        "expected_batch_size": 32.0,
        "per_device_train_batch_size": 32,
        "learning_rate": 2e-3,
        "logging_steps": 10,
        "max_seq_length": 64,
        "test_fraction": 0.02,
        "max_test_examples": 256,
        "secret_selection": "df",
        "secret_band": [50, 100],
        "planning_workers": 2,
        "c_exponents": [-6, 0, 2, 4],
        "train_c_exponents": [-6, 0, 4],
        "accounting_scale": 1.0,
    },
    "smoke": {
        "max_steps": 3,
        "expected_batch_size": 8.0,
        "per_device_train_batch_size": 8,
        "learning_rate": 2e-3,
        "logging_steps": 1,
        "max_seq_length": 32,
        "max_train_examples": 600,
        "test_fraction": 0.02,
        "max_test_examples": 32,
        "secret_selection": "df",
        "secret_band": [4, 8],
        "max_secrets": 20,
        "planning_workers": 1,
        "c_exponents": [2, 4],
        "train_c_exponents": [4],
        "accounting_scale": 1.0,
    },
    "paper": {
        "model_name_or_path": PAPER_MODEL,
        "max_steps": 2000,
        "expected_batch_size": 2048.0,
        "per_device_train_batch_size": 256,
        "learning_rate": 1e-3,
        "logging_steps": 50,
        "max_seq_length": 128,
        "test_fraction": 0.05,
        "max_test_examples": 10_000,
        "secret_selection": "rank",
        "secret_band": [50_000, 150_000],
        "planning_workers": 4,
        "c_exponents": list(range(-6, 5)),
        "train_c_exponents": list(range(-6, 5)),
        "accounting_scale": 10.0,
    },
}

logger = logging.getLogger("recipes.arxiv_mlm")


@dataclass
class ArxivMLMArguments(RecipeArguments):
    """Arguments of the recipe (training arguments are those of SecretProtectionConfig)."""

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Hub dataset or local file (json/jsonl/csv/parquet/txt); default: offline ACLSum."},
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the text."})
    group_column: str | None = field(
        default=None,
        metadata={"help": "Hold out whole groups (e.g. papers) for the test set; offline default: doc_id."},
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "BERT MLM checkpoint (e.g. google/bert_uncased_L-2_H-128_A-2); "
            "default: BERT-Tiny from its config."
        },
    )
    max_seq_length: int | None = field(default=None, metadata={"help": "Tokens per example (truncated)."})
    max_train_examples: int | None = field(default=None, metadata={"help": "Keep the first N training rows."})
    test_fraction: float | None = field(default=None, metadata={"help": "Fraction held out for testing."})
    max_test_examples: int | None = field(default=None, metadata={"help": "At most N test examples."})
    secret_selection: str | None = field(
        default=None, metadata={"help": "df: words with lo <= df <= hi; rank: df ranks lo..hi-1 (the paper)."}
    )
    secret_band: list[int] | None = field(default=None, metadata={"help": "lo hi of --secret_selection."})
    max_secrets: int | None = field(default=None, metadata={"help": "Keep a random subset of N secrets."})
    secret_prior: float = field(default=1e-10, metadata={"help": "p_j of every secret."})
    secret_target_range: list[float] = field(
        default_factory=lambda: [2e-4, 1e-3], metadata={"help": "r_j ~ U[lo, hi]."}
    )
    secret_seed: int = field(default=0, metadata={"help": "Seed of the targets r_j and the test split."})
    keep_secretless: bool = field(
        default=False, metadata={"help": "Train on examples without secrets too (the paper discards them)."}
    )
    settings: list[str] = field(
        default_factory=lambda: list(SETTINGS), metadata={"help": "paper (mu_j budget + kl) and/or hush_hf."}
    )
    c_exponents: list[int] | None = field(default=None, metadata={"help": "Plan c = 2^k for these k."})
    train_c_exponents: list[int] | None = field(
        default=None, metadata={"help": "Train (with and without noise) for these k (among c_exponents)."}
    )
    c_unit: str = field(
        default="relative", metadata={"help": "relative: c = 2^4 keeps every example; absolute: lp_c = c."}
    )
    accounting_scale: float | None = field(
        default=None,
        metadata={"help": "Train with sigma / s: bounds then hold only for an s-times larger B and dataset."},
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "Fraction of tokens masked."})
    eval_batch_size: int = field(default=64, metadata={"help": "Batch size of the test-loss evaluation."})
    planning_workers: int | None = field(default=None, metadata={"help": "Processes computing the plans."})
    save_models: bool = field(default=False, metadata={"help": "Save every trained model under runs/."})


# ----------------------------------------------------------------------------------- validation
def validate(args: ArxivMLMArguments, config: Any) -> None:
    """ValueError naming the field and value for every bad choice, before any work."""
    refuse_recipe_owned_fields(
        config,
        {
            "noise_multiplier": "use --accounting_scale to train with less noise than certified",
            "secrets_file": "secrets are chosen by --secret_selection/--secret_band",
            "plan_file": "plans are computed for every c",
            "lp_c": "use --c_exponents",
            "accountant": "use --settings",
        },
    )
    if args.preset == "paper" and args.dataset_name is None:
        raise ValueError("preset='paper' needs --dataset_name (no arXiv corpus exists offline)")
    check_int("max_seq_length", args.max_seq_length, minimum=8)
    check_int("max_train_examples", args.max_train_examples, minimum=2, allow_none=True)
    check_number("test_fraction", args.test_fraction, low=0.0, high=0.5)
    check_int("max_test_examples", args.max_test_examples, minimum=1)
    if args.secret_selection not in ("df", "rank"):
        raise ValueError(f"secret_selection must be 'df' or 'rank', got {args.secret_selection!r}")
    check_pair("secret_band", args.secret_band, kind=int)
    check_int("secret_band[0]", args.secret_band[0], minimum=0 if args.secret_selection == "rank" else 1)
    check_int("max_secrets", args.max_secrets, minimum=1, allow_none=True)
    check_pair("secret_target_range", args.secret_target_range, kind=float)
    check_int("secret_seed", args.secret_seed, minimum=0)
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown or not args.settings or len(set(args.settings)) != len(args.settings):
        raise ValueError(f"settings must be distinct names from {sorted(SETTINGS)}, got {args.settings!r}")
    if not args.c_exponents:
        raise ValueError(f"c_exponents must name at least one k, got {args.c_exponents!r}")
    for name in ("c_exponents", "train_c_exponents"):
        for k in getattr(args, name) or []:
            check_int(f"{name} entry", k, minimum=-60)
    missing = sorted(set(args.train_c_exponents or []) - set(args.c_exponents))
    if missing:
        raise ValueError(f"train_c_exponents {missing} are not in c_exponents={args.c_exponents!r}")
    if args.c_unit not in ("relative", "absolute"):
        raise ValueError(f"c_unit must be 'relative' or 'absolute', got {args.c_unit!r}")
    check_number("accounting_scale", args.accounting_scale, low=0.0, high=math.inf)
    if args.accounting_scale < 1:
        raise ValueError(
            f"accounting_scale must be >= 1 (1 = train with the certified noise), "
            f"got {args.accounting_scale!r}"
        )
    check_number("mlm_probability", args.mlm_probability, low=0.0, high=1.0)
    check_int("eval_batch_size", args.eval_batch_size, minimum=1)
    check_int("planning_workers", args.planning_workers, minimum=1)
    if config.expected_batch_size is None:
        raise ValueError("expected_batch_size (B) must be set")


def scale_warning(scale: float) -> str | None:
    if scale == 1:
        return None
    return (
        f"ACCOUNTING SCALE {scale:g}: EVERY MODEL IS TRAINED WITH sigma / {scale:g}. THE CERTIFIED "
        f"PER-SECRET BOUNDS HOLD ONLY FOR THE SIMULATED SETTING WITH A {scale:g}x LARGER BATCH AND "
        "DATASET, NOT FOR THE MODELS THIS RUN TRAINS (Hush Sec. 5.1 reproduction). Do not publish these "
        "models as protected."
    )


# ----------------------------------------------------------------------------------- data
def load_corpus(args: ArxivMLMArguments) -> tuple[Any, Any, str]:
    """(train, test, description): whole groups held out when a group column exists."""
    if args.dataset_name is None:
        from hush_hf.assets import aclsum_paragraphs

        corpus, source = aclsum_paragraphs(), "ACLSum paragraphs (offline stand-in for arXiv abstracts)"
        group_column = args.group_column or "doc_id"
    else:
        from hush_hf.data import load_text_dataset

        corpus = load_text_dataset(args.dataset_name, split=args.dataset_split)
        source, group_column = f"{args.dataset_name} [{args.dataset_split}]", args.group_column
    if args.text_column not in corpus.column_names:
        raise ValueError(
            f"text_column={args.text_column!r} is not a column of the dataset "
            f"(columns: {corpus.column_names})"
        )
    if group_column is not None and group_column not in corpus.column_names:
        raise ValueError(f"group_column={group_column!r} is not a column of the dataset")
    rng = np.random.default_rng(args.secret_seed)
    if group_column is None:
        order = rng.permutation(len(corpus))
        n_test = max(1, round(args.test_fraction * len(corpus)))
        test_rows, train_rows = np.sort(order[:n_test]), np.sort(order[n_test:])
    else:
        groups = np.asarray(corpus[group_column])
        names = np.unique(groups)
        n_test = max(1, round(args.test_fraction * names.size))
        held_out = np.isin(groups, rng.permutation(names)[:n_test])
        test_rows, train_rows = np.flatnonzero(held_out), np.flatnonzero(~held_out)
    train = corpus.select(train_rows[: args.max_train_examples])
    test = corpus.select(test_rows[: args.max_test_examples])
    keep = [args.text_column]
    train = train.select_columns(keep)
    test = test.select_columns(keep)
    if len(train) < 2 or len(test) < 1:
        raise ValueError(f"the split left {len(train)} training and {len(test)} test examples")
    logger.info("Corpus: %s; %d training and %d test examples", source, len(train), len(test))
    return train, test, source


def choose_secrets(args: ArxivMLMArguments, train: Any) -> Any:
    from hush_hf.secrets import select_by_document_frequency

    band = tuple(args.secret_band)
    secrets = select_by_document_frequency(
        train,
        text_column=args.text_column,
        rank_range=band if args.secret_selection == "rank" else None,
        df_range=band if args.secret_selection == "df" else None,
        prior=args.secret_prior,
        target_range=tuple(args.secret_target_range),
        seed=args.secret_seed,
        max_secrets=args.max_secrets,
    )
    logger.info(
        "Secrets: %d words (%s band %s), p = %g, r ~ U%s",
        len(secrets),
        args.secret_selection,
        list(band),
        args.secret_prior,
        list(args.secret_target_range),
    )
    return secrets


# ----------------------------------------------------------------------------------- planning
def c_unit_for(sizes: np.ndarray, budget: np.ndarray, c_unit: str) -> float:
    """The factor k with lp_c = c * k; ``relative``: c = 2^4 is exactly where the LP keeps every example."""
    if c_unit == "absolute":
        return 1.0
    try:
        return no_preprocessing_lp_c(sizes, budget) / NO_PREPROCESSING_C
    except ValueError:
        raise ValueError("no training example contains any secret; widen --secret_band") from None


def plan_sweep(
    args: ArxivMLMArguments, config: Any, secret_ids: Any, secrets: Any, sizes: np.ndarray, output_dir: Path
) -> tuple[list[dict[str, Any]], dict[tuple[str, int], Any]]:
    """One plan per (setting, c): rows for the table and the plans of the c's to train.

    ``sizes[j]`` = |D_j|, the number of training examples containing secret j. Plans are computed in
    ``--planning_workers`` processes, the slow ones (tight accountant, small c) first.
    """
    from hush_hf.accounting import lp_budget

    rows, jobs = [], []
    for setting in args.settings:
        budget_kind, accountant = SETTINGS[setting]
        unit = c_unit_for(sizes, lp_budget(secrets.priors, secrets.targets, budget_kind), args.c_unit)
        for k in args.c_exponents:
            c = 2.0**k
            rows.append(
                {
                    "setting": setting,
                    "c_exponent": k,
                    "c": c,
                    "lp_c": c * unit,
                    "budget": budget_kind,
                    "accountant": accountant,
                }
            )
            jobs.append(
                {
                    "secret_ids": secret_ids,
                    "priors": secrets.priors,
                    "targets": secrets.targets,
                    "expected_batch_size": config.expected_batch_size,
                    "steps": config.max_steps,
                    "lp_c": c * unit,
                    "accountant": accountant,
                    "budget": budget_kind,
                    "drop_secretless": not args.keep_secretless,
                }
            )
    order = sorted(range(len(jobs)), key=lambda n: (jobs[n]["accountant"] != "tight", rows[n]["c_exponent"]))
    outcomes = dict(
        zip(
            order,
            plan_many([jobs[n] for n in order], workers=args.planning_workers, desc="Planning (setting, c)"),
            strict=True,
        )
    )
    plans = {}
    for n, row in enumerate(rows):
        plan, error, seconds = outcomes[n]
        row["plan_seconds"] = seconds
        if plan is None:  # e.g. the retained weight cannot fill a batch of B: the trade-off ends here
            row["error"] = error
            logger.info("%s, c = 2^%d: no plan (%s)", row["setting"], row["c_exponent"], error)
            continue
        summary = plan.summary()
        row.update(
            retained_fraction=plan.retained_fraction,
            retained_weight_fraction=plan.retained_weight_fraction,
            noise_multiplier=plan.noise_multiplier,
            noise_multiplier_trained=plan.noise_multiplier / args.accounting_scale,
            meets_targets=plan.meets_targets,
            bound_over_target_max=summary["bound_over_target_max"],
            lp_gap=summary["lp_gap"],
        )
        logger.info(
            "%s, c = 2^%d: retained %.3f, sigma %.4g (%.0f s)",
            row["setting"],
            row["c_exponent"],
            plan.retained_fraction,
            plan.noise_multiplier,
            seconds,
        )
        if row["c_exponent"] in (args.train_c_exponents or []):
            plans[(row["setting"], row["c_exponent"])] = plan
            plan.save(output_dir / "plans" / f"{row['setting']}_c{row['c_exponent']:+d}.json")
    return rows, plans


# ----------------------------------------------------------------------------------- model and training
def load_tokenizer(args: ArxivMLMArguments) -> Any:
    if args.model_name_or_path is None:
        from hush_hf.assets import bert_uncased_tokenizer

        return bert_uncased_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(args.model_name_or_path)


def build_model(args: ArxivMLMArguments, tokenizer: Any, seed: int) -> Any:
    """BERT with the head at the masked positions: from the checkpoint, else BERT-Tiny from its config."""
    from transformers import AutoConfig, set_seed

    from hush_hf.trainer.masked_positions import BertForMaskedPositionsLM

    set_seed(seed)  # the same initialisation in every run
    if args.model_name_or_path is None:
        from hush_hf.assets import bert_tiny_config

        return BertForMaskedPositionsLM(bert_tiny_config(len(tokenizer)))
    model_type = AutoConfig.from_pretrained(args.model_name_or_path).model_type
    if model_type != "bert":
        raise ValueError(
            f"model_name_or_path={args.model_name_or_path!r} is a {model_type!r} model; "
            "this recipe trains BERT masked LMs"
        )
    return BertForMaskedPositionsLM.from_pretrained(args.model_name_or_path)


def tokenize(dataset: Any, tokenizer: Any, args: ArxivMLMArguments, keep: list[str]) -> Any:
    def encode(batch: dict[str, list[Any]]) -> dict[str, Any]:
        return tokenizer(batch[args.text_column], truncation=True, max_length=args.max_seq_length)

    drop = [c for c in dataset.column_names if c not in keep]
    return dataset.map(encode, batched=True, remove_columns=drop, desc="Tokenizing")


def same_run(plan: Any, sigma: float, other_plan: Any, other_sigma: float) -> bool:
    """Runs with the same sigma and the same sampling probabilities (to 1e-9, the LP's rounding) are
    the same experiment, trained once (e.g. c = 2^4 keeps every example in both settings)."""
    return sigma == other_sigma and np.allclose(
        plan.sampling_probs, other_plan.sampling_probs, rtol=1e-9, atol=0
    )


def train_and_test(
    args: ArxivMLMArguments,
    config: Any,
    plan: Any,
    sigma: float,
    *,
    name: str,
    train: Any,
    collator: Any,
    tokenizer: Any,
    test_batches: list[Any],
    output_dir: Path,
) -> dict[str, Any]:
    """Train one model with ``plan`` at noise ``sigma`` (0 = none); return its test loss and timings."""
    import time

    from hush_hf.trainer.masked_positions import MaskedPositionsTrainer, masked_positions_loss

    model = build_model(args, tokenizer, config.seed)
    run_dir = output_dir / "runs" / name
    trainer = MaskedPositionsTrainer(
        model=model,
        args=run_config(config, run_dir, noise_multiplier=sigma),
        train_dataset=train,
        data_collator=collator,
        plan=plan.bound_to(train),  # planned from train's secret_ids (in worker processes)
    )
    start = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - start
    test_loss = mean_token_loss(model, test_batches, masked_positions_loss, causal=False)
    if args.save_models and trainer.is_world_process_zero():
        model.config.architectures = ["BertForMaskedLM"]
        trainer.save_model(str(run_dir))
    return {"test_loss": test_loss, "train_loss": float(result.training_loss), "train_seconds": seconds}


def train_sweep(
    args: ArxivMLMArguments,
    config: Any,
    rows: list[dict[str, Any]],
    plans: dict[tuple[str, int], Any],
    **run_kwargs: Any,
) -> list[dict[str, Any]]:
    """Train each planned (setting, c) without noise and with its sigma; the test losses go into ``rows``.

    Returns the runs actually trained: a run equal to an earlier one (``same_run``) is reused.
    """
    jobs = []
    for row in rows:
        plan = plans.get((row["setting"], row["c_exponent"]))
        if plan is not None:
            jobs += [
                (row, "test_loss_no_noise", plan, 0.0),
                (row, "test_loss_noise", plan, row["noise_multiplier_trained"]),
            ]
    trained: list[tuple[Any, float, dict[str, Any]]] = []
    for row, key, plan, sigma in tqdm(jobs, desc="Training runs"):
        name = f"{row['setting']}_c{row['c_exponent']:+d}_{'noise' if sigma else 'no_noise'}"
        record = next((r for p, s, r in trained if same_run(plan, sigma, p, s)), None)
        if record is None:
            logger.info("Run %s (sigma = %.4g)", name, sigma)
            record = {
                "name": name,
                "sigma": sigma,
                **train_and_test(args, config, plan, sigma, name=name, **run_kwargs),
            }
            trained.append((plan, sigma, record))
        row[key] = record["test_loss"]
        row[key.replace("test_loss", "run")] = record["name"]
    return [record for _, _, record in trained]


# ----------------------------------------------------------------------------------- outputs
def plot_fig1(rows: list[dict[str, Any]], path: Path, *, init_loss: float, title: str) -> Path:
    figure, axes = new_figure(2, 2, width=11, height=8)
    panels = [
        ("retained_fraction", "fraction of examples with w > 0", "(a) retained examples"),
        ("test_loss_no_noise", "test loss", "(b) test loss, trained without noise"),
        ("noise_multiplier", "noise multiplier sigma", "(c) calibrated noise"),
        ("test_loss_noise", "test loss", "(d) test loss, trained with sigma"),
    ]
    for ax, (key, ylabel, panel_title) in zip(axes.ravel(), panels, strict=True):
        for setting, marker in zip(SETTINGS, ("o", "s"), strict=True):
            points = [(r["c"], r[key]) for r in rows if r["setting"] == setting and r.get(key) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                budget, accountant = SETTINGS[setting]
                ax.plot(xs, ys, marker=marker, label=f"{setting} (budget {budget}, {accountant})")
        if key == "test_loss_noise":  # (b) stays on its own, much finer scale
            ax.axhline(init_loss, color="gray", linestyle=":", label="at initialisation")
        if key == "noise_multiplier":
            ax.set_yscale("log")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="LP constant c", ylabel=ylabel, title=panel_title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    return save_figure(figure, path)


def results_markdown(results: dict[str, Any]) -> str:
    rows = results["rows"]
    settings = results["choices"]["settings"]
    by_key = {(r["setting"], r["c_exponent"]): r for r in rows}
    header = ["c"]
    for key in ("retained", "sigma", "loss (no noise)", "loss (sigma)"):
        header += [f"{key} [{s}]" for s in settings]
    table = []
    for k in results["choices"]["c_exponents"]:
        line: list[Any] = [f"2^{k}"]
        for key in ("retained_fraction", "noise_multiplier", "test_loss_no_noise", "test_loss_noise"):
            line += [by_key.get((s, k), {}).get(key) for s in settings]
        table.append(line)
    parts = []
    if results.get("warning"):
        parts.append(f"> **WARNING: {results['warning']}**\n")
    choices = results["choices"]
    parts += [
        "# Hush Fig. 1: BERT masked LM, LP constant c",
        "",
        f"Data: {results['data']['source']}: {results['data']['train_examples']} training / "
        f"{results['data']['test_examples']} test examples; {results['data']['secrets']} secrets "
        f"(examples per secret: {results['data']['examples_per_secret']}).",
        f"Training: B = {choices['expected_batch_size']:g}, T = {choices['max_steps']}, "
        f"clip norm C = {choices['per_example_clip_norm']:g}, learning rate {choices['learning_rate']:g}; "
        f"test loss at initialisation {fmt(results['init_test_loss'])}.",
        "Settings: "
        + "; ".join(f"`{s}` = LP budget {SETTINGS[s][0]}, {SETTINGS[s][1]} accountant" for s in settings)
        + ".",
        f"c is {results['choices']['c_unit']} (see results.json: `lp_c` per row). A dash: not trained "
        "(see train_c_exponents) or no feasible plan (see `error`).",
        "",
        markdown_table(header, table),
        "",
        "![Fig. 1](fig1.png)",
        "",
        "Timings (wall seconds, process CPU seconds in brackets): "
        + ", ".join(
            f"{phase} {seconds:.0f} [{results['cpu_seconds'].get(phase, float('nan')):.0f}]"
            for phase, seconds in results["timings_seconds"].items()
        )
        + "; per plan: `plan_seconds` in results.json.",
        "",
    ]
    for note in results["notes"]:
        parts.append(f"- {note}")
    return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse and check the arguments, then run the experiment; returns what ``results.json`` holds."""
    return recipe_main(ArxivMLMArguments, PRESETS, recipe_name=RECIPE, validate=validate, run=run, argv=argv)


def run(args: ArxivMLMArguments, config: Any) -> dict[str, Any]:
    output_dir = Path(config.output_dir)
    main_process = config.process_index == 0
    watch = Stopwatch()
    warning = scale_warning(args.accounting_scale)
    if warning:
        loud(warning)
    logger.info(
        "Preset %s: B = %g, T = %d, c = 2^k for k in %s (trained: %s)",
        args.preset,
        config.expected_batch_size,
        config.max_steps,
        args.c_exponents,
        args.train_c_exponents,
    )

    from transformers import DataCollatorForLanguageModeling

    from hush_hf.planning.memberships import membership_matrix
    from hush_hf.secrets import tag_dataset, tagger_for
    from hush_hf.trainer.distributed import broadcast_object
    from hush_hf.trainer.plan_setup import column

    with watch("data and secrets"):
        train_text, test_text, source = load_corpus(args)
        secrets = choose_secrets(args, train_text)
        train_text = tag_dataset(
            train_text, tagger_for(secrets), text_column=args.text_column, num_secrets=len(secrets)
        )
        secret_ids = column(train_text, "secret_ids")
        membership = membership_matrix(secret_ids, len(secrets))
        sizes = np.asarray(membership.sum(axis=1)).ravel()
    with watch("planning"):
        # The main process plans (the LP and the calibration are the slow part); every rank trains
        # with exactly its plans.
        planned = plan_sweep(args, config, secret_ids, secrets, sizes, output_dir) if main_process else None
        rows, plans = broadcast_object(planned)
    with watch("tokenizing"):
        tokenizer = load_tokenizer(args)
        train = tokenize(train_text, tokenizer, args, keep=["secret_ids"])
        test = tokenize(test_text, tokenizer, args, keep=[])
        collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=args.mlm_probability)
        eval_collator = DataCollatorForLanguageModeling(
            tokenizer, mlm_probability=args.mlm_probability, seed=args.secret_seed
        )
        test_batches = collate_batches(test, eval_collator, args.eval_batch_size)

    from hush_hf.trainer.masked_positions import masked_positions_loss

    init_model = build_model(args, tokenizer, config.seed)
    init_loss = mean_token_loss(init_model, test_batches, masked_positions_loss, causal=False)
    with watch("training"):
        runs = train_sweep(
            args,
            config,
            rows,
            plans,
            train=train,
            collator=collator,
            tokenizer=tokenizer,
            test_batches=test_batches,
            output_dir=output_dir,
        )

    notes = [
        "Secrets are referred to by index only; the secret words are not written anywhere.",
        f"c unit: {args.c_unit}"
        + (
            " (c = 2^4 keeps every example; lp_c = c * max_j(|D_j| / budget_j) / 2^4 per setting)"
            if args.c_unit == "relative"
            else " (lp_c = c)"
        ),
        "Examples without any secret are " + ("kept." if args.keep_secretless else "discarded (the paper)."),
        f"Texts are cut at {args.max_seq_length} tokens; an example counts as containing every secret of its "
        "full text (more protection, never less).",
    ]
    if args.model_name_or_path is None:
        notes.append(
            "BERT-Tiny is trained from its config (no pretrained weights offline); the paper "
            "fine-tunes the pretrained checkpoint: absolute losses are not comparable with Fig. 1."
        )
    if warning:
        notes.insert(0, warning)
    results = {
        "recipe": RECIPE,
        "certified_for_this_run": warning is None,
        "warning": warning,
        "choices": {
            **asdict(args),
            "max_steps": config.max_steps,
            "expected_batch_size": config.expected_batch_size,
            "per_example_clip_norm": config.per_example_clip_norm,
            "learning_rate": config.learning_rate,
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "seed": config.seed,
            "world_size": config.world_size,
        },
        "data": {
            "source": source,
            "train_examples": len(train),
            "test_examples": len(test),
            "secrets": len(secrets),
            "examples_with_a_secret": int(np.count_nonzero(membership.sum(axis=0))),
            "examples_per_secret": describe_counts(sizes),
        },
        "init_test_loss": init_loss,
        "rows": rows,
        "runs": runs,
        "notes": notes,
        "timings_seconds": {**watch.seconds, "total": watch.total()},
        "cpu_seconds": {**watch.cpu_seconds, "total": watch.total_cpu()},
        "files": [RESULTS_JSON, RESULTS_MARKDOWN, "fig1.png", "plans/", "run.log"],
    }
    if main_process:
        title = f"Hush Fig. 1 ({args.preset}): B={config.expected_batch_size:g}, T={config.max_steps}"
        if warning:
            title += f" | NOISE / {args.accounting_scale:g}: BOUNDS NOT VALID FOR THESE MODELS"
        plot_fig1(rows, output_dir / "fig1.png", init_loss=init_loss, title=title)
        results["timings_seconds"]["total"] = watch.total()
        results["cpu_seconds"]["total"] = watch.total_cpu()
        write_json(output_dir / RESULTS_JSON, results)
        (output_dir / RESULTS_MARKDOWN).write_text(results_markdown(results), encoding="utf-8")
        logger.info("Results in %s (%.0f s)", output_dir, watch.total())
        if warning:
            loud(warning)
    return results


if __name__ == "__main__":
    main()
