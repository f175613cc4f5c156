"""``Trainer`` methods a subclass may not override under DP training: the DP step never calls them.

A ``Trainer`` subclass customises training by overriding its methods, but the DP step takes over the
loss and the batches: ``compute_loss`` is never called (each example's loss comes from the per-example
loss, whose gradient is clipped on its own) and ``get_train_dataloader`` is the plan's weighted Poisson
sampler (:mod:`hush_hf.trainer.routing`), whose sampling probabilities the accounting rests on. An
override of either was ignored silently (``compute_loss``) or failed inside ``train()`` with an error
that did not say why (``get_train_dataloader``); so a trainer whose class (or instance) overrides one is
refused before any work, naming the class and what to do instead. transformers' own classes, hush_hf's
(``SecretProtectionTrainer`` defines ``get_train_dataloader`` as the DP loader) and TRL's ``SFTTrainer``
(its ``compute_loss`` scores tokens as the per-example loss does, docs/trl.md) are not overrides.
"""

from __future__ import annotations

from typing import Any

SUPPORTED_OWNERS = ("transformers.", "hush_hf.", "trl.trainer.sft_trainer.SFTTrainer")
"""Prefixes of ``module.qualname`` of the classes whose definitions of these methods are supported."""

IGNORED = {
    "compute_loss": (
        "the loss must be per example and the DP step never calls compute_loss; override "
        "compute_per_example_loss(model, inputs) of SecretProtectionTrainer instead (or pass "
        "per_example_loss= to GhostClippingCallback.attach)"
    ),
    "get_train_dataloader": (
        "the DP trainer builds its own Poisson-sampled dataloader from the plan (each row drawn with its "
        "sampling probability, which the accounting rests on), so an overridden get_train_dataloader is "
        "not supported; remove the override (shape the batches with data_collator)"
    ),
}
"""Method name -> why an override cannot be honoured, and what to do instead."""


def _owner(trainer: Any, name: str) -> str | None:
    """``module.qualname`` of the class defining ``name`` for ``trainer``; None when the instance sets it."""
    if name in vars(trainer):
        return None
    for cls in type(trainer).__mro__:
        if name in vars(cls):
            return f"{cls.__module__}.{cls.__qualname__}"
    return ""


def check_no_ignored_overrides(trainer: Any) -> None:
    """ValueError naming the class when ``trainer`` overrides a method of :data:`IGNORED`."""
    for name, why in IGNORED.items():
        owner = _owner(trainer, name)
        if owner is None:
            raise ValueError(
                f"{type(trainer).__name__}.{name} is set on the instance: not supported with DP training: "
                f"{why}"
            )
        if owner and not owner.startswith(SUPPORTED_OWNERS):
            raise ValueError(
                f"{owner.rpartition('.')[2]}.{name} overrides Trainer.{name} ({type(trainer).__name__}): not "
                f"supported with DP training: {why}"
            )
