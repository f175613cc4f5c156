"""Shared pieces of the recipes (``accelerate launch recipes/<name>.py``).

Recipes are scripts, not part of the ``hush_hf`` package; they import this package from their own folder
(``from common import ...``). One module per concept: ``arguments`` (presets, parsing, checks), ``logs``
(logging, stopwatch), ``data`` (corpora, held-out split), ``planning`` (plans in parallel), ``training``
(one run, private or not), ``models`` (causal LMs), ``evaluation`` (token loss), ``canaries``
(planting, exposure), ``sweep`` (the LP constant of Hush Fig. 1) and ``outputs`` (results, plots).
What users need outside the recipes lives in ``hush_hf``.
"""

from common.arguments import (
    RecipeArguments,
    TextRecipeArguments,
    check_choice,
    check_int,
    check_names,
    check_number,
    check_pair,
    check_text_arguments,
    non_private_config,
    parse_recipe_arguments,
    recipe_main,
    refuse_recipe_owned_fields,
    refuse_unsupported_launch,
    run_config,
)
from common.canaries import exposure, plant_canaries, uniform_targets
from common.data import describe_counts, load_corpus, split_held_out, tokenize_text
from common.evaluation import collate_batches, mean_token_loss
from common.logs import Stopwatch, loud, recipe_logging
from common.models import causal_model, causal_tokenizer
from common.outputs import (
    comparison,
    finish,
    fmt,
    json_ready,
    line_panels,
    markdown_table,
    new_figure,
    pivot_table,
    results_page,
    run_choices,
    save_figure,
    series_by,
)
from common.planning import no_preprocessing_lp_c, plan_many
from common.sweep import c_unit_for, plan_sweep, same_run, sweep_figure, sweep_table
from common.training import train_model

__all__ = [
    "RecipeArguments",
    "TextRecipeArguments",
    "Stopwatch",
    "c_unit_for",
    "causal_model",
    "causal_tokenizer",
    "check_choice",
    "check_int",
    "check_names",
    "check_number",
    "check_pair",
    "check_text_arguments",
    "collate_batches",
    "comparison",
    "describe_counts",
    "exposure",
    "finish",
    "fmt",
    "json_ready",
    "line_panels",
    "load_corpus",
    "loud",
    "markdown_table",
    "mean_token_loss",
    "new_figure",
    "no_preprocessing_lp_c",
    "non_private_config",
    "parse_recipe_arguments",
    "pivot_table",
    "plan_many",
    "plan_sweep",
    "plant_canaries",
    "recipe_logging",
    "recipe_main",
    "refuse_recipe_owned_fields",
    "refuse_unsupported_launch",
    "results_page",
    "run_choices",
    "run_config",
    "same_run",
    "save_figure",
    "series_by",
    "split_held_out",
    "tokenize_text",
    "sweep_figure",
    "sweep_table",
    "train_model",
    "uniform_targets",
]
