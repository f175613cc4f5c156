"""Experiments as scripts state them: presets, arguments, validation, a run and its results.

An experiment (four recipes in ``recipes/`` are) is a dataclass of arguments over ``SecretProtectionConfig``,
named presets (``offline`` by default, ``smoke``, ``paper``), a ``validate`` that refuses bad values
before any work, and a ``run`` that returns what ``results.json`` holds; :class:`Experiment` parses,
validates, logs to ``run.log`` and runs it, and :class:`Session` writes ``results.json`` and
``results.md``. One module per concept: ``experiment`` (the skeleton), ``arguments`` (presets,
parsing), ``checks`` (one-line refusals), ``launch`` (launches the DP step cannot run), ``logs``
(logging, stopwatch), ``data`` (corpora, held-out split, tokenizing, secrets per example),
``canaries`` (planting, exposure), ``models`` (causal LMs, BERT masked LMs), ``training`` (one run,
private or not), ``evaluation`` (token loss), ``frozen_encoder`` (a frozen encoder's
test outputs computed once), ``attacks`` (exposure, membership, reconstruction),
``planning`` (plans at the run's B and T, in parallel), ``sweep`` (the LP constant of Hush Fig. 1),
``crt_arms`` (CRT Fig. 3's redacted arms), ``fingerprints`` (keyed names), ``results``
(``results.json``, ``results.md``, tables) and ``figures`` (PNG plots). Secrets are referred to by
index only: nothing here writes a secret string.
"""

from hush_hf.experiments.arguments import (
    ExperimentArguments,
    TextExperimentArguments,
    check_text_arguments,
    non_private_config,
    parse_experiment_arguments,
    refuse_owned_fields,
    run_config,
)
from hush_hf.experiments.attacks import (
    causal_lm_attacks,
    length_matched_alternatives,
    membership_rows,
    probed_secrets,
    reconstruction_attack_summary,
)
from hush_hf.experiments.canaries import exposure, plant_canaries, tag_with_canaries, uniform_targets
from hush_hf.experiments.checks import (
    check_choice,
    check_int,
    check_names,
    check_number,
    check_pair,
    check_whole_batch_size,
)
from hush_hf.experiments.crt_arms import (
    NO_LP,
    SIX_DIGITS,
    crt_plans,
    fig3_figure,
    fig3_rows,
    fig3_sections,
    redacted_arms,
    redacted_rows,
)
from hush_hf.experiments.data import (
    chunk_texts,
    describe_counts,
    load_corpus,
    secret_counts,
    secret_ids_column,
    split_held_out,
    tokenize_text,
)
from hush_hf.experiments.evaluation import collate_batches, mean_token_loss
from hush_hf.experiments.experiment import Experiment, Session
from hush_hf.experiments.figures import (
    bar_panels,
    bounds_figure,
    comparison,
    line_panels,
    new_figure,
    save_figure,
    series_by,
)
from hush_hf.experiments.fingerprints import keyed_fingerprints
from hush_hf.experiments.frozen_encoder import FrozenEncoderTestLoss
from hush_hf.experiments.launch import refuse_unsupported_launch
from hush_hf.experiments.logs import Stopwatch, experiment_logger, experiment_logging, loud
from hush_hf.experiments.models import (
    MASKED_LM_TRAINABLE,
    bert_masked_lm,
    causal_model,
    causal_tokenizer,
    copied_builds,
    gemma2_model,
)
from hush_hf.experiments.planning import no_preprocessing_lp_c, plan_for_config, plan_many
from hush_hf.experiments.pretraining import (
    BYTE_VOCAB,
    ByteTokens,
    block_dataset,
    fig2_fig3_figure,
    make_blocks,
    split_blocks,
)
from hush_hf.experiments.results import (
    finish,
    fmt,
    json_ready,
    markdown_table,
    pivot_table,
    results_page,
    run_choices,
    secret_rows,
)
from hush_hf.experiments.sweep import (
    FIG1_SETTINGS,
    SweepArguments,
    accounting_scale_warning,
    c_unit_for,
    check_sweep_arguments,
    gap_closed,
    plan_sweep,
    same_run,
    sweep_arms,
    sweep_figure,
    sweep_table,
    train_sweep,
)
from hush_hf.experiments.training import train_model

__all__ = [
    "BYTE_VOCAB",
    "ByteTokens",
    "Experiment",
    "ExperimentArguments",
    "FrozenEncoderTestLoss",
    "FIG1_SETTINGS",
    "MASKED_LM_TRAINABLE",
    "NO_LP",
    "SIX_DIGITS",
    "Session",
    "Stopwatch",
    "SweepArguments",
    "TextExperimentArguments",
    "accounting_scale_warning",
    "bar_panels",
    "bert_masked_lm",
    "block_dataset",
    "bounds_figure",
    "c_unit_for",
    "causal_lm_attacks",
    "causal_model",
    "causal_tokenizer",
    "copied_builds",
    "check_choice",
    "check_int",
    "check_names",
    "check_number",
    "check_pair",
    "check_sweep_arguments",
    "check_text_arguments",
    "check_whole_batch_size",
    "chunk_texts",
    "collate_batches",
    "comparison",
    "crt_plans",
    "describe_counts",
    "experiment_logger",
    "experiment_logging",
    "exposure",
    "fig2_fig3_figure",
    "fig3_figure",
    "fig3_rows",
    "fig3_sections",
    "finish",
    "fmt",
    "gap_closed",
    "gemma2_model",
    "json_ready",
    "keyed_fingerprints",
    "length_matched_alternatives",
    "line_panels",
    "load_corpus",
    "loud",
    "make_blocks",
    "markdown_table",
    "mean_token_loss",
    "membership_rows",
    "new_figure",
    "no_preprocessing_lp_c",
    "non_private_config",
    "parse_experiment_arguments",
    "pivot_table",
    "plan_for_config",
    "plan_many",
    "plan_sweep",
    "plant_canaries",
    "probed_secrets",
    "reconstruction_attack_summary",
    "redacted_arms",
    "redacted_rows",
    "refuse_owned_fields",
    "refuse_unsupported_launch",
    "results_page",
    "run_choices",
    "run_config",
    "same_run",
    "save_figure",
    "secret_counts",
    "secret_ids_column",
    "secret_rows",
    "series_by",
    "split_blocks",
    "split_held_out",
    "sweep_arms",
    "sweep_figure",
    "sweep_table",
    "tag_with_canaries",
    "tokenize_text",
    "train_model",
    "train_sweep",
    "uniform_targets",
]
