"""Shared pieces of the recipes: arguments with presets, logging, result files, evaluation.

Recipes are scripts (``accelerate launch recipes/<name>.py``), not part of the ``hush_hf`` package;
they import this module from their own folder. Every recipe

- parses its own argument dataclass together with :class:`~hush_hf.trainer.SecretProtectionConfig`
  (every ``TrainingArguments`` field works: ``--learning_rate``, ``--bf16``, ...) through
  ``HfArgumentParser``; a *preset* (``offline`` by default, ``smoke``, ``paper``) supplies the
  defaults of both, and any flag given on the command line wins;
- writes ``results.json``, ``results.md`` and PNG plots into ``--output_dir``
  (default ``outputs/<recipe>/``);
- refers to secrets by index only: no secret string reaches a log, an error or a result file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import numbers
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

OUTPUT_ROOT = Path("outputs")
RESULTS_JSON = "results.json"
RESULTS_MARKDOWN = "results.md"
PRESETS = ("offline", "smoke", "paper")

# TrainingArguments defaults that suit every recipe (each preset may override them).
BASE_TRAINING_DEFAULTS: dict[str, Any] = {
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 10,
    "lr_scheduler_type": "constant",
    "dataloader_pin_memory": False,
    "seed": 0,
}

logger = logging.getLogger("recipes")


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


# ------------------------------------------------------------------------------------ logging
@contextlib.contextmanager
def recipe_logging(output_dir: Path, *, main_process: bool) -> Iterator[logging.Logger]:
    """INFO logs of the recipe (and hush_hf) to stderr and ``output_dir/run.log`` on the main process.

    The handlers and levels are restored on exit, so a recipe's ``main()`` can run inside another
    program (or a test) without changing its logging.
    """
    import datasets
    import transformers

    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(output_dir / "run.log", mode="w", encoding="utf-8"))
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    named = [logging.getLogger(name) for name in ("recipes", "hush_hf")]
    saved = [(log, log.level) for log in named]
    saved_verbosity = (transformers.utils.logging.get_verbosity(), datasets.utils.logging.get_verbosity())
    for handler in handlers:
        handler.setFormatter(formatter)
        for log in named:
            log.addHandler(handler)
    for log in named:
        log.setLevel(logging.INFO if main_process else logging.WARNING)
    transformers.utils.logging.set_verbosity_warning()
    datasets.utils.logging.set_verbosity_warning()
    try:
        yield logger
    finally:
        for handler in handlers:
            for log in named:
                log.removeHandler(handler)
            handler.close()
        for log, level in saved:
            log.setLevel(level)
        transformers.utils.logging.set_verbosity(saved_verbosity[0])
        datasets.utils.logging.set_verbosity(saved_verbosity[1])


def loud(message: str) -> str:
    """Log ``message`` as a framed warning (hard to miss in a long log) and return it."""
    rule = "!" * 100
    logger.warning("\n%s\n%s\n%s", rule, message, rule)
    return message


class Stopwatch:
    """Seconds per named phase: ``with watch("planning"): ...``; ``watch.seconds`` holds the wall-clock
    time and ``watch.cpu_seconds`` the process CPU time (all threads; on a shared machine it is the one
    that says what the work costs)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}
        self._start = time.perf_counter()
        self._cpu_start = time.process_time()

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            self.seconds[phase] = self.seconds.get(phase, 0.0) + wall
            self.cpu_seconds[phase] = self.cpu_seconds.get(phase, 0.0) + cpu
            logger.info("%s: %.1f s (CPU %.1f s)", phase, wall, cpu)

    def total(self) -> float:
        return time.perf_counter() - self._start

    def total_cpu(self) -> float:
        return time.process_time() - self._cpu_start


# ------------------------------------------------------------------------------------ outputs
def json_ready(value: Any) -> Any:
    """``value`` with numpy scalars/arrays, paths and non-finite floats made JSON-safe."""
    import numpy as np

    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    if isinstance(value, np.generic):
        return json_ready(value.item())
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_ready(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def fmt(value: Any, spec: str = ".4g") -> str:
    """A table cell: numbers with ``spec``, None as an em dash, the rest as text."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Real):
        return "—" if not math.isfinite(value) else format(value, spec)
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def new_figure(rows: int, cols: int, *, width: float, height: float) -> tuple[Any, Any]:
    """A matplotlib figure on the Agg canvas (no pyplot state, works without a display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, cols, squeeze=False)
    return figure, axes


def save_figure(figure: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path)
    return path


# ------------------------------------------------------------------------------------ evaluation
PerExampleLoss = Callable[[torch.nn.Module, dict[str, Any]], torch.Tensor]


def collate_batches(
    dataset: Any, collate_fn: Callable[[list[Any]], dict[str, Any]], batch_size: int
) -> list[dict[str, Any]]:
    """The dataset collated once into fixed batches (so every model is scored on the same masks)."""
    check_int("batch_size", batch_size, minimum=1)
    rows = [dataset[i] for i in range(len(dataset))]
    return [collate_fn(rows[k : k + batch_size]) for k in range(0, len(rows), batch_size)]


@torch.no_grad()
def mean_token_loss(
    model: torch.nn.Module,
    batches: Sequence[dict[str, Any]],
    per_example_loss: PerExampleLoss,
    *,
    causal: bool,
) -> float:
    """Token-weighted mean cross-entropy: sum_i n_i loss_i / sum_i n_i over every target token.

    ``loss_i`` is ``per_example_loss`` (a mean over example i's n_i target tokens), so this is the
    corpus-level loss transformers reports, independent of how the rows are batched.
    """
    from hush_hf.trainer.losses import model_inputs

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, tokens = 0.0, 0
    try:
        for batch in batches:
            labels = batch["labels"]
            targets = labels[:, 1:] if causal else labels
            n = (targets != -100).sum(dim=1)
            losses = per_example_loss(model, model_inputs(model, batch, device))
            total += float((losses.double().cpu() * n.double()).sum())
            tokens += int(n.sum())
    finally:
        model.train(was_training)
    if tokens == 0:
        raise ValueError("the evaluation set has no target tokens")
    return total / tokens


def no_preprocessing_lp_c(sizes: Any, budget: Any) -> float:
    """The smallest LP constant c at which every weight w_i = 1 is feasible in Hush eq. (1).

    All ones are feasible exactly when |D_j| <= c * budget_j for every secret j, i.e. for
    c >= max_j |D_j| / budget_j: from there on the LP keeps every example (uniform sampling).
    """
    import numpy as np

    sizes, budget = np.asarray(sizes, dtype=np.float64), np.asarray(budget, dtype=np.float64)
    used = sizes > 0
    if not used.any():
        raise ValueError("no training example contains any secret")
    return float(np.max(sizes[used] / budget[used]))


def _timed_plan(kwargs: dict[str, Any]) -> tuple[Any, str | None, float]:
    """``plan_protection(**kwargs)`` -> (plan or None, error message or None, seconds); runs in a worker."""
    from hush_hf.planning.plan import plan_protection

    start = time.perf_counter()
    try:
        return plan_protection(**kwargs), None, time.perf_counter() - start
    except ValueError as error:  # e.g. the LP keeps too little weight to fill a batch of B
        return None, str(error), time.perf_counter() - start


def plan_many(
    jobs: Sequence[dict[str, Any]], *, workers: int, desc: str = "Planning"
) -> list[tuple[Any, str | None, float]]:
    """``plan_protection`` for every keyword set in ``jobs``, in ``workers`` processes, in order.

    Planning is single-threaded NumPy/HiGHS work, so separate processes use separate cores (the tight
    calibration of one plan takes 1-15 s on the demo). A ``ValueError`` (an infeasible plan) becomes the
    job's error message; anything else is raised.
    """
    from tqdm.auto import tqdm

    check_int("planning_workers", workers, minimum=1)
    if workers == 1 or len(jobs) < 2:
        return [_timed_plan(dict(job)) for job in tqdm(jobs, desc=desc)]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        return list(tqdm(pool.map(_timed_plan, [dict(job) for job in jobs]), total=len(jobs), desc=desc))


def describe_counts(counts: Any) -> dict[str, float]:
    """min / median / max / mean of a vector of counts (e.g. examples per secret)."""
    import numpy as np

    counts = np.asarray(counts)
    if counts.size == 0:
        return {"min": 0, "median": 0, "max": 0, "mean": 0}
    return {
        "min": int(counts.min()),
        "median": float(np.median(counts)),
        "max": int(counts.max()),
        "mean": float(counts.mean()),
    }
