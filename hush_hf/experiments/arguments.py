"""Arguments of an experiment: a dataclass of its own plus ``SecretProtectionConfig``, with presets.

An experiment parses its argument dataclass (extending :class:`ExperimentArguments`) together with
:class:`~hush_hf.trainer.SecretProtectionConfig` (every ``TrainingArguments`` field works:
``--learning_rate``, ``--bf16``, ...) through ``HfArgumentParser``; a *preset* (``offline`` by
default, ``smoke``, ``paper``) supplies the defaults of both, and any flag given on the command line
wins. Bad values are refused with one line naming the field and the value, before any work.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hush_hf.experiments.checks import check_int, check_number
from hush_hf.experiments.launch import refuse_unsupported_launch

OUTPUT_ROOT = Path("outputs")

# TrainingArguments defaults that suit every experiment (each preset may override them).
BASE_TRAINING_DEFAULTS: dict[str, Any] = {
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 10,
    "lr_scheduler_type": "constant",
    "dataloader_pin_memory": False,
    "seed": 0,
}


@dataclass
class ExperimentArguments:
    """The fields every experiment has; each experiment's argument dataclass extends it (and may redefine
    ``dataset_name`` for its own help text). Training arguments are those of SecretProtectionConfig."""

    preset: str = field(default="offline", metadata={"help": "offline (default), smoke or paper."})
    smoke: bool = field(default=False, metadata={"help": "Tiny run (< 60 s) for CI: same as --preset smoke."})
    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset or local file; default: the recipe's offline corpus."}
    )
    dataset_split: str = field(default="train", metadata={"help": "Split of --dataset_name to use."})


@dataclass
class TextExperimentArguments(ExperimentArguments):
    """The fields of an experiment that trains a language model on a text column, with a held-out test
    split and planted canaries."""

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


def check_text_arguments(args: TextExperimentArguments, *, min_seq_length: int) -> None:
    """ValueError naming the field and value for a bad :class:`TextExperimentArguments` field."""
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


def parse_experiment_arguments(
    arguments_class: type,
    presets: Mapping[str, Mapping[str, Any]],
    *,
    name: str,
    argv: Sequence[str] | None = None,
) -> tuple[Any, Any]:
    """``(experiment_args, dp_config)`` parsed from ``argv`` (default ``sys.argv[1:]``).

    ``arguments_class`` must have the fields ``preset`` (str) and ``smoke`` (bool; ``--smoke`` is
    ``--preset smoke``). The chosen preset's values become the parser's defaults (keys may be fields
    of ``arguments_class`` or of ``SecretProtectionConfig``); flags given explicitly win. The default
    ``--output_dir`` is ``outputs/<name>`` (``outputs/<name>_smoke`` for ``--smoke``). A launch the DP
    step cannot run (:func:`~hush_hf.experiments.refuse_unsupported_launch`) is refused here.
    """
    import torch
    from transformers import HfArgumentParser

    from hush_hf.trainer import SecretProtectionConfig

    argv = list(sys.argv[1:] if argv is None else argv)
    # First pass: only the preset (help is left to the full parser, which lists every flag).
    first = HfArgumentParser(arguments_class, add_help=False)
    (early,) = first.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)[:1]
    preset_name = "smoke" if early.smoke else early.preset
    if early.smoke and early.preset not in ("offline", "smoke"):
        raise ValueError(f"--smoke conflicts with preset={early.preset!r}; give one of them")
    if preset_name not in presets:
        raise ValueError(f"preset={preset_name!r} is not one of {sorted(presets)}")
    suffix = "_smoke" if preset_name == "smoke" else ""
    defaults = {
        **BASE_TRAINING_DEFAULTS,
        "output_dir": str(OUTPUT_ROOT / f"{name}{suffix}"),
        "use_cpu": not torch.cuda.is_available(),
        **presets[preset_name],
        "preset": preset_name,
    }
    refuse_unsupported_launch()
    parser = HfArgumentParser((arguments_class, SecretProtectionConfig))
    parser.set_defaults(**defaults)
    experiment_args, config = parser.parse_args_into_dataclasses(args=argv)
    return experiment_args, config


def refuse_owned_fields(config: Any, owned: Mapping[str, str]) -> None:
    """ValueError for a ``SecretProtectionConfig`` field that the experiment sets itself per run.

    ``owned`` maps a field name to the flag the user should use instead.
    """
    from hush_hf.trainer import SecretProtectionConfig

    defaults = {f.name: f.default for f in dataclasses.fields(SecretProtectionConfig)}
    for name, instead in owned.items():
        value = getattr(config, name)
        if value != defaults[name]:
            raise ValueError(f"{name}={value!r}: this recipe sets {name} for every run itself; {instead}")


def run_config(base: Any, output_dir: Path, **overrides: Any) -> Any:
    """A copy of the parsed ``SecretProtectionConfig`` for one training run (validated again)."""
    return dataclasses.replace(base, output_dir=str(output_dir), **overrides)


def non_private_config(base: Any, output_dir: Path) -> Any:
    """The run's arguments for a plain ``transformers.Trainer`` baseline: batches of B in total
    (B / world_size per process), shuffled, no clipping, no noise."""
    per_process = max(1, round(float(base.expected_batch_size) / base.world_size))
    return run_config(base, output_dir, per_device_train_batch_size=per_process)
