"""The one table of ``Trainer`` methods the DP step takes over, shared by both ways in.

Why a callback alone cannot run DP-SGD (transformers 5 ``Trainer``): no event sees the inputs or the
loss, and ``training_step`` back-propagates one batch-mean loss; the batch gradient norm is computed and
logged before ``on_pre_optimizer_step`` (it would publish the pre-noise gradient); no event chooses the
batch sampler; the resume checkpoint is not known before the data loader is iterated; and
``push_to_hub`` uploads all of ``output_dir``. So each method in :data:`ROUTES` is replaced:
``SecretProtectionTrainer`` defines them from the table (:func:`define_routes`), and
:meth:`GhostClippingCallback.attach <hush_hf.trainer.GhostClippingCallback.attach>` sets them on a plain
``Trainer`` instance, TRL's ``SFTTrainer`` included (:func:`route_instance`). A new hook is one entry.

A route is ``route(dp, trainer, originals, *args, **kwargs)``: ``dp`` the trainer's
:class:`~hush_hf.trainer.GhostClippingCallback`, ``originals[name]`` the method the route replaces (the
parent class's, or the instance's before routing), so routes call what the trainer would have called.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from hush_hf.trainer import publishing
from hush_hf.trainer.published_text import check_published_text, published_text_files
from hush_hf.trainer.tokenizer_secrets import check_added_tokens
from hush_hf.trainer.trained_weights import remember
from hush_hf.trainer.transformers_api import GRAD_NORM, NUM_ITEMS, PUSH_FROM_CHECKPOINT, check_trainer_api

#: Trainer's statistics of the drawn batches: total_flos is 6 x parameters x tokens actually drawn.
BATCH_STATISTICS = ("total_flos", "num_input_tokens_seen", "train_tokens_per_second")

Originals = Mapping[str, Callable[..., Any]]


def without_batch_statistics(output: Any) -> Any:
    """``Trainer.train``'s output with ``total_flos`` and token counts taken out of its metrics."""
    metrics = getattr(output, "metrics", None)
    if isinstance(metrics, dict):
        for key in BATCH_STATISTICS:
            metrics.pop(key, None)
    return output


def _artifacts(dp: Any, trainer: Any) -> Callable[..., dict[str, Path]]:
    """The trainer's ``write_protection_artifacts`` without its checks, which the saves run themselves
    (SecretProtectionTrainer's adds its CRT arguments), else the callback's at the trainer's step."""
    own = getattr(trainer, "_write_protection_artifacts", None)
    if own is not None:
        return own
    return lambda output_dir, **kwargs: dp.write_protection_artifacts(
        output_dir, global_step=trainer.state.global_step, **kwargs
    )


# ----------------------------------------------------------------------------- one run, one step
def train(
    dp: Any,
    trainer: Any,
    originals: Originals,
    resume_from_checkpoint: Any = None,
    trial: Any = None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Set up the secret seed (fresh, or the checkpoint's run's), train, take the hooks off. The weights as
    the run left them are remembered (at its ``on_train_end``, or here where it raised): a final save of
    weights changed since is refused (:mod:`hush_hf.trainer.trained_weights`)."""
    dp.prepare_run(trainer, resume_from_checkpoint, trial)
    dp.trained_weights = None
    try:
        output = originals["train"](resume_from_checkpoint, trial, *args, **kwargs)
    except BaseException:
        if dp.trained_weights is None:  # raised before on_train_end: the weights as the error left them
            dp.trained_weights = remember(trainer.model)
        raise
    finally:
        dp.finish_run()
    return without_batch_statistics(output)


def check_publishable(dp: Any, trainer: Any, what: str, *, weights: bool = True) -> None:
    """ValueError if the weights changed since the last run ended (nothing to compare before any run), or
    if the tokenizer saved with them spells one of the trainer's secrets in an added token."""
    if weights and dp.trained_weights is not None:
        dp.trained_weights.check(trainer.model, what)
    check_added_tokens(trainer.processing_class, dp.evaluation.secrets, what)  # the trainer's secrets


def text_check(dp: Any, what: str) -> publishing.CheckFiles:
    """``check_files`` of an upload: no published text file spells one of the trainer's secrets."""
    return lambda folder, names: check_published_text(folder, names, dp.evaluation.secrets, what)


def get_train_dataloader(dp: Any, trainer: Any, originals: Originals) -> Any:
    """The plan's weighted Poisson batches, one row per drawn example (never accelerate's padded shards)."""
    return dp.train_dataloader(trainer)


def training_step(
    dp: Any,
    trainer: Any,
    originals: Originals,
    model: nn.Module,
    inputs: dict[str, Any],
    num_items_in_batch: Any = None,
) -> Any:
    """The clipped per-example backward passes of the drawn share (the DP step, engine.py)."""
    return dp.training_step(trainer, model, inputs)


def get_grad_norm(
    dp: Any, trainer: Any, originals: Originals, model: nn.Module, grad_norm: Any = None
) -> None:
    """None: Trainer computes this before ``on_pre_optimizer_step``, i.e. from the pre-noise gradient."""
    return None


def get_num_items_in_batch(
    dp: Any, trainer: Any, originals: Originals, batch_samples: Any, device: Any = None
) -> None:
    """None: the token count of the drawn batches is unused by the DP step, and its cross-rank gather
    would run only on ranks with a non-empty share."""
    return None


def floating_point_ops(dp: Any, trainer: Any, originals: Originals, inputs: Any) -> int:
    """0: Trainer sums it into ``total_flos`` (6 x parameters x the tokens actually drawn), which the
    noise does not hide; the key is also dropped from the logs and the train metrics."""
    return 0


def log(
    dp: Any, trainer: Any, originals: Originals, logs: dict[str, float], start_time: float | None = None
) -> None:
    """Trainer's log with sigma and the drawn batch size added, and no gradient norm."""
    originals["log"](dp.add_log_fields(logs), start_time)


def set_initial_training_values(
    dp: Any, trainer: Any, originals: Originals, *args: Any, **kwargs: Any
) -> tuple:
    """CRT mode: the run takes the T DP steps plus the public steps."""
    return dp.training_values(originals["set_initial_training_values"](*args, **kwargs))


# ----------------------------------------------------------------------------- metrics outside the plan
def evaluate(
    dp: Any,
    trainer: Any,
    originals: Originals,
    eval_dataset: Any = None,
    ignore_keys: Any = None,
    metric_key_prefix: str = "eval",
) -> Any:
    """Trainer's evaluate; metrics on rows holding secrets are recorded for the card (evaluation.py)."""
    dp.evaluation.evaluating(eval_dataset, metric_key_prefix, trainer.eval_dataset)
    return originals["evaluate"](eval_dataset, ignore_keys, metric_key_prefix)


def predict(
    dp: Any,
    trainer: Any,
    originals: Originals,
    test_dataset: Any,
    ignore_keys: Any = None,
    metric_key_prefix: str = "test",
) -> Any:
    """Trainer's predict; predictions on rows holding secrets are recorded as evaluations are."""
    dp.evaluation.predicting(test_dataset, metric_key_prefix)
    return originals["predict"](test_dataset, ignore_keys, metric_key_prefix)


# ----------------------------------------------------------------------------- publishing
def save_model(
    dp: Any, trainer: Any, originals: Originals, output_dir: str | None = None, _internal_call: bool = False
) -> None:
    """Save the weights, and beside them the plan, the privacy report and the model card.

    Checkpoints (``_internal_call`` with a folder) get only the weights and the DP state;
    ``save_model()`` and ``push_to_hub()`` get the full protection artifacts (FSDP2 with a sharded
    state dict: the full state dict is gathered and saved; see :func:`publishing.save_model`). A final
    save of weights changed since DP training ended is refused (:func:`check_publishable`), and so is a
    saved text file that spells one of the trainer's secrets (:mod:`hush_hf.trainer.published_text`).
    """
    final = output_dir is None or not _internal_call
    if final:
        check_publishable(dp, trainer, "save_model")
    publishing.save_model(
        trainer,
        output_dir,
        _internal_call,
        save_weights=originals["save_model"],
        write_artifacts=_artifacts(dp, trainer),
    )
    if final and trainer.args.should_save:
        folder = output_dir or trainer.args.output_dir
        text_check(dp, "save_model")(folder, published_text_files(folder))


def create_model_card(dp: Any, trainer: Any, originals: Originals, *args: Any, **kwargs: Any) -> None:
    """The trainer's own README.md (Trainer's or TRL's), with the Secret protection section added back."""
    publishing.create_model_card(
        trainer,
        *args,
        write_card=originals["create_model_card"],
        write_artifacts=_artifacts(dp, trainer),
        **kwargs,
    )
    if trainer.is_world_process_zero():
        text_check(dp, "create_model_card")(trainer.args.output_dir, ["README.md"])


def push_to_hub(
    dp: Any,
    trainer: Any,
    originals: Originals,
    commit_message: str | None = "End of training",
    blocking: bool = True,
    token: str | None = None,
    revision: str | None = None,
    private: bool | None = None,
    *,
    extra_files: Sequence[str] = (),
    **kwargs: Any,
) -> Any:
    """Upload the model, config, tokenizer, card, plan and privacy report, and nothing else.

    Same steps as ``Trainer.push_to_hub`` (save, model card, one commit), but the commit holds only
    the files :func:`hush_hf.trainer.publishing.publishable_files` allows: never trainer_state.json,
    ``*_results.json``, ``runs/``, training_args.bin or checkpoints, unless listed in ``extra_files``
    (paths relative to ``output_dir``). Weights changed since DP training ended are refused, and so is a
    tokenizer that spells a secret (:func:`check_publishable`).
    """
    check_publishable(dp, trainer, "push_to_hub")
    return publishing.push_to_hub(
        trainer,
        commit_message,
        blocking,
        token,
        revision,
        private,
        save_weights=originals["save_model"],
        extra_files=extra_files,
        check_files=text_check(dp, "push_to_hub"),
        **kwargs,
    )


def push_from_checkpoint(dp: Any, trainer: Any, originals: Originals, checkpoint_folder: str) -> None:
    """``hub_strategy="every_save"``: push the current model with its artifacts, through the allow-list
    (Trainer's version uploads all of ``output_dir``); never a tokenizer that spells a secret."""
    check_publishable(dp, trainer, "push_to_hub (hub_strategy='every_save')", weights=False)  # mid-run
    publishing.push_from_checkpoint(
        trainer,
        checkpoint_folder,
        save_weights=originals["save_model"],
        write_artifacts=_artifacts(dp, trainer),
        check_files=text_check(dp, "push_to_hub (hub_strategy='every_save')"),
    )


ROUTES: dict[str, Callable[..., Any]] = {
    "train": train,
    "get_train_dataloader": get_train_dataloader,
    "training_step": training_step,
    GRAD_NORM: get_grad_norm,
    NUM_ITEMS: get_num_items_in_batch,
    "floating_point_ops": floating_point_ops,
    "log": log,
    "set_initial_training_values": set_initial_training_values,
    "evaluate": evaluate,
    "predict": predict,
    "save_model": save_model,
    "create_model_card": create_model_card,
    "push_to_hub": push_to_hub,
    PUSH_FROM_CHECKPOINT: push_from_checkpoint,
}
"""Trainer method name -> route: the complete list of what the DP step takes over."""


class _ParentMethods(Mapping[str, Callable[..., Any]]):
    """``originals`` of a class defined by :func:`define_routes`: the next class's method in the MRO."""

    def __init__(self, owner: type, instance: Any) -> None:
        self.owner, self.instance = owner, instance

    def __getitem__(self, name: str) -> Callable[..., Any]:
        return getattr(super(self.owner, self.instance), name)

    def __iter__(self):
        return iter(ROUTES)

    def __len__(self) -> int:
        return len(ROUTES)


def define_routes(cls: type) -> type:
    """Class decorator: ``cls`` gets every method of :data:`ROUTES`, routed through ``self.dp``; a subclass
    of ``cls`` may still override any of them and call ``super()``."""

    def method(name: str, route: Callable[..., Any]) -> Callable[..., Any]:
        def routed(self: Any, *args: Any, **kwargs: Any) -> Any:
            return route(self.dp, self, _ParentMethods(cls, self), *args, **kwargs)

        routed.__name__, routed.__qualname__, routed.__doc__ = name, f"{cls.__name__}.{name}", route.__doc__
        signature = inspect.signature(route)  # shown as the method's own: self, then the route's arguments
        self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        own = list(signature.parameters.values())[3:]  # past (dp, trainer, originals)
        routed.__signature__ = signature.replace(parameters=[self_parameter, *own])  # type: ignore[attr-defined]
        return routed

    for name, route in ROUTES.items():
        setattr(cls, name, method(name, route))
    return cls


def route_instance(dp: Any, trainer: Any) -> None:
    """Set every method of :data:`ROUTES` on ``trainer`` (a plain or TRL trainer instance), each calling
    the method the instance had before."""
    check_trainer_api(trainer)
    originals = {name: getattr(trainer, name) for name in ROUTES}
    for name, route in ROUTES.items():
        setattr(trainer, name, functools.partial(route, dp, trainer, originals))
