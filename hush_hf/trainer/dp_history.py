"""Which run took DP steps on a parameter in this process: a run on weights another run trained is refused.

A run's training record counts its own DP steps (:meth:`GhostClippingCallback.steps_behind`). A new trainer
built on a model object that another run already trained (after a crash, or to retry with another learning
rate, in a notebook) starts from weights that went through that run's steps too, so a card stating only the
new run's steps would understate what the published weights went through: with T steps of one plan twice,
the true bound is the one at 2T. Resuming a run (same run id) continues its count and is allowed.

Keyed by the parameter tensors themselves (weakly, so nothing is kept alive): the same weights under another
wrapper (a PEFT model around the trained base, a plain ``Trainer`` after ``SecretProtectionTrainer``) are
found too. Weights saved and loaded again are new tensors: this sees only one process's memory. A model
loaded from a folder a DP run saved (its ``hush_plan.json`` holds a training record) gets a loud warning
instead (:func:`warn_if_loaded_from_dp_run`): continuing on new data is legitimate, and that run's own card
covers its secrets, but secrets both runs train on are covered by neither card alone.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterable
from pathlib import Path

from torch import Tensor, nn

_TRAINED_BY: dict[int, tuple[weakref.ref, str, int]] = {}
"""id(parameter) -> (weak reference to it, run id, optimizer steps that run took on it). By identity: a
``WeakKeyDictionary`` would compare tensors with ``==``, elementwise."""


def record_step(params: Iterable[Tensor], run_id: str, steps: int) -> None:
    """``params`` went through ``steps`` optimizer steps of run ``run_id``."""
    for key in [k for k, (ref, _, _) in _TRAINED_BY.items() if ref() is None]:
        del _TRAINED_BY[key]  # parameters that no longer exist (their ids may be reused)
    for param in params:
        _TRAINED_BY[id(param)] = (weakref.ref(param), run_id, steps)


def _trained_by(param: Tensor) -> tuple[str, int] | None:
    entry = _TRAINED_BY.get(id(param))
    if entry is None or entry[0]() is not param:
        return None
    return entry[1], entry[2]


def check_not_trained_by_another_run(model: nn.Module, run_id: str) -> None:
    """ValueError if a parameter of ``model`` took steps of a run other than ``run_id`` in this process; a
    loud warning if ``model`` was loaded from a folder a DP run saved (:func:`warn_if_loaded_from_dp_run`)."""
    warn_if_loaded_from_dp_run(model)
    other = {by for by in map(_trained_by, model.parameters()) if by is not None and by[0] != run_id}
    if other:
        steps = max(count for _, count in other)
        raise ValueError(
            f"this model's weights already went through {steps} optimizer step(s) of another DP run in "
            "this process; this run's training record would count only its own steps, so the card would "
            "understate what the saved weights went through. Start from a fresh copy of the initial "
            "weights, or continue that run with train(resume_from_checkpoint=...)"
        )


def dp_steps_of_folder(folder: object) -> int | None:
    """The DP steps the training record of ``folder``/hush_plan.json states, if ``folder`` is a local folder
    holding a plan with a training record; None otherwise (a Hub name, no plan, an unreadable one)."""
    if not isinstance(folder, (str, Path)) or not str(folder):
        return None
    path = Path(folder) / "hush_plan.json"
    try:
        training = json.loads(path.read_text(encoding="utf-8")).get("training")
    except (OSError, ValueError, AttributeError):
        return None
    steps = training.get("dp_steps") if isinstance(training, dict) else None
    return steps if isinstance(steps, int) else None


def warn_if_loaded_from_dp_run(model: nn.Module) -> None:
    """A loud warning when ``model`` was loaded (``from_pretrained``, its ``name_or_path``) from a folder
    a DP run saved: this run's record counts only its own steps."""
    from hush_hf.trainer.plan_setup import loud_warning

    folder = getattr(model, "name_or_path", None)
    steps = dp_steps_of_folder(folder)
    if steps:
        loud_warning(
            f"the model was loaded from {str(folder)!r}, whose hush_plan.json records {steps} DP step(s) of "
            "an earlier run: this run's card counts only its own steps, so a secret both runs train on is "
            "protected less than either card states (their bounds compose); continue that run with "
            "train(resume_from_checkpoint=...), or train on data holding none of its secrets"
        )

