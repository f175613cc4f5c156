"""Arguments of every recipe: a dataclass of its own plus ``SecretProtectionConfig``, with presets.

A recipe parses its argument dataclass (extending :class:`RecipeArguments`) together with
:class:`~hush_hf.trainer.SecretProtectionConfig` (every ``TrainingArguments`` field works:
``--learning_rate``, ``--bf16``, ...) through ``HfArgumentParser``; a *preset* (``offline`` by
default, ``smoke``, ``paper``) supplies the defaults of both, and any flag given on the command line
wins. Bad values are refused with one line naming the field and the value, before any work.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from common.logs import recipe_logging

OUTPUT_ROOT = Path("outputs")

# TrainingArguments defaults that suit every recipe (each preset may override them).
BASE_TRAINING_DEFAULTS: dict[str, Any] = {
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 10,
    "lr_scheduler_type": "constant",
    "dataloader_pin_memory": False,
    "seed": 0,
}


# ------------------------------------------------------------------------------------ arguments
@dataclass
class RecipeArguments:
    """The fields every recipe has; each recipe's argument dataclass extends it (and may redefine
    ``dataset_name`` for its own help text). Training arguments are those of SecretProtectionConfig."""

    preset: str = field(default="offline", metadata={"help": "offline (default), smoke or paper."})
    smoke: bool = field(default=False, metadata={"help": "Tiny run (< 60 s) for CI: same as --preset smoke."})
    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset or local file; default: the recipe's offline corpus."}
    )
    dataset_split: str = field(default="train", metadata={"help": "Split of --dataset_name to use."})



@dataclass
class TextRecipeArguments(RecipeArguments):
    """The fields of a recipe that trains a language model on a text column, held-out test split included."""

    text_column: str = field(default="text", metadata={"help": "Column holding the text."})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Hub checkpoint or local folder; default: the offline model."}
    )
    max_seq_length: int | None = field(default=None, metadata={"help": "Tokens per example (truncated)."})
    max_train_examples: int | None = field(default=None, metadata={"help": "Keep the first N training rows."})
    test_fraction: float | None = field(default=None, metadata={"help": "Fraction held out for testing."})
    max_test_examples: int | None = field(default=None, metadata={"help": "At most N test examples."})
    eval_batch_size: int = field(default=32, metadata={"help": "Batch size of evaluation and attacks."})
    num_canaries: int | None = field(default=None, metadata={"help": "Canaries planted (declared secrets)."})
    canary_repetitions: int | None = field(default=None, metadata={"help": "Copies of each canary."})
    exposure_samples: int | None = field(
        default=None, metadata={"help": "Random candidates the canary exposure is extrapolated from."}
    )


def check_text_arguments(args: TextRecipeArguments, *, min_seq_length: int) -> None:
    """ValueError naming the field and value for a bad :class:`TextRecipeArguments` field."""
    for name, minimum in (
        ("max_seq_length", min_seq_length),
        ("max_test_examples", 1),
        ("eval_batch_size", 1),
        ("num_canaries", 0),
        ("canary_repetitions", 1),
        ("exposure_samples", 2),
    ):
        check_int(name, getattr(args, name), minimum=minimum)
    check_int("max_train_examples", args.max_train_examples, minimum=2, allow_none=True)
    check_number("test_fraction", args.test_fraction, low=0.0, high=0.5)


def recipe_main(
    recipe_class: type,
    presets: Mapping[str, Mapping[str, Any]],
    *,
    recipe_name: str,
    validate: Callable[[Any, Any], None],
    run: Callable[[Any, Any], dict[str, Any]],
    argv: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The one entry point of every recipe: parse (:func:`parse_recipe_arguments`), ``validate`` before
    any work, then ``run`` with the recipe's logging; returns what ``results.json`` holds."""
    args, config = parse_recipe_arguments(recipe_class, presets, recipe_name=recipe_name, argv=argv)
    validate(args, config)
    with recipe_logging(Path(config.output_dir), main_process=config.process_index == 0):
        return run(args, config)


def parse_recipe_arguments(
    recipe_class: type,
    presets: Mapping[str, Mapping[str, Any]],
    *,
    recipe_name: str,
    argv: Sequence[str] | None = None,
) -> tuple[Any, Any]:
    """``(recipe_args, dp_config)`` parsed from ``argv`` (default ``sys.argv[1:]``).

    ``recipe_class`` must have the fields ``preset`` (str) and ``smoke`` (bool; ``--smoke`` is
    ``--preset smoke``). The chosen preset's values become the parser's defaults (keys may be fields
    of ``recipe_class`` or of ``SecretProtectionConfig``); flags given explicitly win. The default
    ``--output_dir`` is ``outputs/<recipe_name>`` (``outputs/<recipe_name>_smoke`` for ``--smoke``).
    """
    from transformers import HfArgumentParser

    from hush_hf.trainer import SecretProtectionConfig

    argv = list(sys.argv[1:] if argv is None else argv)
    # First pass: only the preset (help is left to the full parser, which lists every flag).
    first = HfArgumentParser(recipe_class, add_help=False)
    (early,) = first.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)[:1]
    preset_name = "smoke" if early.smoke else early.preset
    if early.smoke and early.preset not in ("offline", "smoke"):
        raise ValueError(f"--smoke conflicts with preset={early.preset!r}; give one of them")
    if preset_name not in presets:
        raise ValueError(f"preset={preset_name!r} is not one of {sorted(presets)}")
    suffix = "_smoke" if preset_name == "smoke" else ""
    defaults = {
        **BASE_TRAINING_DEFAULTS,
        "output_dir": str(OUTPUT_ROOT / f"{recipe_name}{suffix}"),
        "use_cpu": not torch.cuda.is_available(),
        **presets[preset_name],
        "preset": preset_name,
    }
    refuse_unsupported_launch()
    parser = HfArgumentParser((recipe_class, SecretProtectionConfig))
    parser.set_defaults(**defaults)
    recipe_args, config = parser.parse_args_into_dataclasses(args=argv)
    return recipe_args, config


def refuse_unsupported_launch(environ: Mapping[str, str] | None = None) -> None:
    """ValueError, before any work, when ``accelerate launch`` set up DeepSpeed or an FSDP setting the DP
    step cannot run exactly (the trainer refuses them too, but only once built, after the planning, which
    can take minutes). FSDP2 in float32 or bf16 without offloading runs (``configs/accelerate/fsdp.yaml``);
    the full list of refused FSDP options is :func:`hush_hf.trainer.fsdp.check_fsdp_plugin`.
    """
    import os

    environ = os.environ if environ is None else environ

    def requested(variable: str) -> bool:
        return str(environ.get(variable, "")).lower() in ("1", "true", "yes")

    if requested("ACCELERATE_USE_DEEPSPEED"):
        raise ValueError(
            f"ACCELERATE_USE_DEEPSPEED={environ['ACCELERATE_USE_DEEPSPEED']!r}: DeepSpeed is not supported "
            "with DP training (it owns the backward and the gradient reduction, which the DP step must "
            "drive); launch with configs/accelerate/fsdp.yaml (FSDP2), multi_gpu.yaml (DDP) or "
            "single_gpu.yaml instead"
        )
    if not requested("ACCELERATE_USE_FSDP"):
        return
    version = environ.get("FSDP_VERSION", "1")  # accelerate's default
    if version != "2":
        raise ValueError(
            f"FSDP_VERSION={version!r}: FSDP1 is not supported with DP training (it flattens the parameters, "
            "which per-layer ghost clipping cannot see); set fsdp_version: 2 (configs/accelerate/fsdp.yaml)"
        )
    for variable, why in (
        ("FSDP_OFFLOAD_PARAMS", "offloaded shards are not verified"),
        (
            "FSDP_ACTIVATION_CHECKPOINTING",
            "checkpointed clipping runs two backward passes per micro-batch and FSDP would reduce-scatter "
            "the gradients in each (not verified); use DDP with gradient_checkpointing=True",
        ),
    ):
        if requested(variable):
            raise ValueError(
                f"{variable}={environ[variable]!r} is not supported with DP training under FSDP: {why}"
            )
    precision = str(environ.get("ACCELERATE_MIXED_PRECISION", "no")).lower()
    if precision not in ("no", "fp32", "bf16"):
        raise ValueError(
            f"ACCELERATE_MIXED_PRECISION={precision!r} is not supported with DP training under FSDP: use "
            "mixed_precision: bf16 or 'no' (fp16's loss scaler does not see the DP step's backward passes)"
        )


def refuse_recipe_owned_fields(config: Any, owned: Mapping[str, str]) -> None:
    """ValueError for a ``SecretProtectionConfig`` field that the recipe sets itself per run.

    ``owned`` maps a field name to the flag the user should use instead.
    """
    from hush_hf.trainer import SecretProtectionConfig

    defaults = {f.name: f.default for f in dataclasses.fields(SecretProtectionConfig)}
    for name, instead in owned.items():
        value = getattr(config, name)
        if value != defaults[name]:
            raise ValueError(f"{name}={value!r}: this recipe sets {name} for every run itself; {instead}")


def check_int(field: str, value: Any, *, minimum: int, allow_none: bool = False) -> None:
    """ValueError naming ``field`` and ``value`` unless it is an integer >= ``minimum`` (or allowed None)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")


def check_number(field: str, value: Any, *, low: float, high: float, allow_none: bool = False) -> None:
    """ValueError naming ``field`` and ``value`` unless it is a finite number in (low, high]."""
    if value is None and allow_none:
        return
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low < value <= high:
        raise ValueError(f"{field} must be a number in ({low:g}, {high:g}], got {value!r}")


def check_choice(field: str, value: Any, choices: Sequence[Any]) -> None:
    """ValueError naming ``field`` and ``value`` unless it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{field} must be one of {list(choices)}, got {value!r}")


def check_names(field: str, values: Any, choices: Sequence[str]) -> None:
    """ValueError unless ``values`` is a non-empty list of distinct names from ``choices``."""
    if not values or len(set(values)) != len(values) or set(values) - set(choices):
        raise ValueError(f"{field} must be distinct names from {list(choices)}, got {values!r}")


def check_pair(field: str, value: Any, *, kind: type, allow_none: bool = False) -> None:
    """ValueError unless ``value`` is two numbers of ``kind`` with lo <= hi (or an allowed None)."""
    if value is None and allow_none:
        return
    ok = (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
        and value[0] <= value[1]
    )
    if not ok:
        raise ValueError(f"{field} must be two {kind.__name__} values lo <= hi, got {value!r}")


def run_config(base: Any, output_dir: Path, **overrides: Any) -> Any:
    """A copy of the parsed ``SecretProtectionConfig`` for one training run (validated again)."""
    return dataclasses.replace(base, output_dir=str(output_dir), **overrides)


def non_private_config(base: Any, output_dir: Path) -> Any:
    """The run's arguments for a plain ``transformers.Trainer`` baseline: batches of B in total
    (B / world_size per process), shuffled, no clipping, no noise."""
    per_process = max(1, round(float(base.expected_batch_size) / base.world_size))
    return run_config(base, output_dir, per_device_train_batch_size=per_process)
