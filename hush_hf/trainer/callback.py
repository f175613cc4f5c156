"""GhostClippingCallback: DP-SGD with weighted Poisson sampling inside transformers' ``Trainer``.

One optimizer step is one DP step (Hush Alg. 2, lines 8-11): draw the logical batch with the
plan's per-example probabilities, split it into micro-batches, add each micro-batch's clipped
per-example gradients ``sum_i min(1, C/||g_i||) g_i`` (ghost clipping), sum them over ranks, add
``N(0, sigma^2 C^2 I)`` once, divide by the *expected* batch size B, then let the user's optimizer
and scheduler step.

Why a callback alone cannot do it (transformers 5.23 ``Trainer._run_epoch``): no event sees the
inputs or the loss, and ``training_step`` back-propagates one batch-mean loss (no per-example
gradients); the batch gradient norm is computed and written to ``log_history`` before
``on_pre_optimizer_step`` (it would publish the pre-noise gradient); there is no event to choose
the batch sampler, and the resume checkpoint is not known before the data loader is iterated. So
the callback carries the DP step, and six trainer methods route to it: ``train`` (sets up the
secret seed, fresh or from the checkpoint), ``get_train_dataloader`` (the Poisson batch sampler,
not prepared by accelerate, which would pad), ``training_step`` (clipped micro-batch backward
passes), ``_get_grad_norm`` (returns None: nothing computes the pre-noise norm),
``_get_num_items_in_batch`` (returns None: the token count is unused, and its cross-rank gather runs
only on ranks with a non-empty share) and ``log`` (adds sigma and the drawn batch size).
``SecretProtectionTrainer`` overrides them; a plain ``Trainer`` gets them from
:meth:`GhostClippingCallback.attach`, with the publishing methods (``save_model``, ``create_model_card``,
``push_to_hub``: the plan, privacy report and card section beside the weights, and an upload allow-list;
:mod:`hush_hf.trainer.publishing`). The events do the rest: ``on_train_begin``
hooks the model, ``on_pre_optimizer_step`` reduces and adds the noise, ``on_save`` writes the run id,
step and plan into the checkpoint and the secret seed into the private ``dp_state_dir`` (never into
``output_dir``: :mod:`hush_hf.trainer.seed_store`). Every example must stand alone: left padding is moved
to the right (:mod:`hush_hf.trainer.padding`) and the first step checks independence
(:mod:`hush_hf.trainer.independence`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint, seed_worker

from hush_hf.clipping import GhostClipper, clipped_sums
from hush_hf.planning.plan import ProtectionPlan
from hush_hf.planning.verification import Verification
from hush_hf.sampling import WeightedPoissonSampler, draw_dp_seed
from hush_hf.sampling.seeds import check_dp_seed
from hush_hf.trainer import publishing
from hush_hf.trainer.crt import CrtBatchSampler, CrtSchedule, build_schedule
from hush_hf.trainer.distributed import (
    all_reduce_sum_,
    broadcast_module_state_,
    broadcast_object,
    check_process_group_matches_launch,
    check_replicas_agree,
    destroy_process_group_at_exit,
    rank_and_world_size,
    replicated,
)
from hush_hf.trainer.evaluation import EvaluationCoverage
from hush_hf.trainer.fsdp import check_fsdp_plugin, filler_micro_batches, is_sharded, max_across_ranks
from hush_hf.trainer.independence import RTOL, alone, check_rows, coupled_rows, precision
from hush_hf.trainer.losses import PerExampleLoss, lm_per_example_loss, model_inputs, unwrap_model
from hush_hf.trainer.micro_batches import batch_size, split_micro_batches
from hush_hf.trainer.noise import privatize_gradients_
from hush_hf.trainer.padding import right_align
from hush_hf.trainer.plan_setup import (
    SECRET_IDS_COLUMN,
    check_plan_fits,
    column,
    column_names,
    is_plan_column,
    load_plan,
    loud_warning,
    plan_digest,
    verify_plan_for_training,
)
from hush_hf.trainer.run_state import RunState, load_run_state, same_sampling, save_run_state
from hush_hf.trainer.seed_store import (
    load_dp_seed,
    new_run_id,
    resolve_dp_state_dir,
    save_dp_seed,
    seed_commitment,
)
from hush_hf.trainer.validation import (
    check_dp_training_arguments,
    check_noise_multiplier,
    check_positive,
    check_single_process_devices,
)

logger = logging.getLogger(__name__)

LOG_NOISE_MULTIPLIER = "dp_noise_multiplier"
LOG_BATCH_SIZE = "dp_batch_size"
#: Trainer's statistics of the drawn batches: total_flos is 6 x parameters x tokens actually drawn.
BATCH_STATISTICS = ("total_flos", "num_input_tokens_seen", "train_tokens_per_second")


def check_clippable(model: nn.Module, clip_norm: float) -> None:
    """UnsupportedLayerError now, not mid-training, if a trainable layer has no ghost-norm rule."""
    GhostClipper(model, clip_norm).remove()


def check_optimizer_params(optimizer: Any, model_param_ids: set[int]) -> None:
    """ValueError if the optimizer steps a trainable parameter that is not one of the model's.

    The DP step clips and noises the gradients of the model's trainable parameters only; any other
    parameter the optimizer holds (e.g. a temperature used by an overridden per-example loss) would
    be updated with its raw, unclipped and noise-free gradient. Matched by identity.
    """
    if optimizer is None:
        return
    for g, group in enumerate(optimizer.param_groups):
        for k, param in enumerate(group["params"]):
            if param.requires_grad and id(param) not in model_param_ids:
                raise ValueError(
                    f"optimizer param_groups[{g}]['params'][{k}] (shape {tuple(param.shape)}) is trainable "
                    "but is not one of the model's trainable parameters: the DP step clips and noises only "
                    "the model's gradients, so it would be updated without clipping or noise. Make it a "
                    "parameter of the model (in a layer ghost clipping supports), freeze it "
                    "(requires_grad=False) or leave it out of the optimizer"
                )


class SkipEmptyCollator:
    """The user's collator, except that an empty draw collates to ``{}`` (a noise-only step)."""

    def __init__(self, collate_fn: Any) -> None:
        self.collate_fn = collate_fn

    def __call__(self, features: list[Any]) -> Any:
        return self.collate_fn(features) if features else {}


class GhostClippingCallback(TrainerCallback):
    """Applies per-example clipping and calibrated Gaussian noise to every optimizer step.

    ``plan``: the :class:`ProtectionPlan` (or its JSON path) whose sampling probabilities, expected
    batch size B, steps T and noise multiplier the run uses. ``clip_norm``: C. ``noise_multiplier``:
    None uses the plan's calibrated sigma; a smaller value (0 = no noise, for baselines) is allowed
    with a loud warning that the certified targets do not hold. ``dp_seed``: the secret seed of the
    sampling and noise; None (recommended) draws 128 bits from the OS at train start. Anyone who
    knows it can subtract the noise. ``dp_state_dir``: the private folder the seed is kept in for
    resuming (default ``$HUSH_HF_DP_STATE_DIR`` or ``~/.cache/hush_hf/dp_state``; never inside
    ``output_dir``; see :mod:`hush_hf.trainer.seed_store`).
    ``per_example_loss(model, inputs) -> Tensor[b]``: default mean token cross-entropy per example
    (masked or causal LM). ``crt_schedule``, ``crt_public_column``, ``crt_public_batch_size``: the CRT
    mode (see
    :class:`~hush_hf.trainer.SecretProtectionConfig` and :mod:`hush_hf.trainer.crt`).

    Each example must stand alone (its clipped gradient a function of it only, or C bounds nothing):
    left-padded batches are re-padded to the right, exactly, or refused where that cannot be exact
    (:mod:`hush_hf.trainer.padding`); the first step of every run checks, before any gradient, that a
    few training rows get the same per-example loss inside a batch and alone
    (:mod:`hush_hf.trainer.independence`), and refuses to train otherwise.

    With a plain ``Trainer`` (``max_grad_norm=0``, ``max_steps=T``)::

        GhostClippingCallback.attach(trainer, plan, clip_norm=1.0)
        trainer.train()
    """

    def __init__(
        self,
        plan: ProtectionPlan | str | Path,
        *,
        clip_norm: float = 1.0,
        noise_multiplier: float | None = None,
        dp_seed: int | None = None,
        dp_state_dir: str | Path | None = None,
        per_example_loss: PerExampleLoss | None = None,
        crt_schedule: str = "off",
        crt_public_column: str = "crt_public",
        crt_public_batch_size: int | None = None,
    ) -> None:
        self.plan = load_plan(plan)
        self.crt_schedule, self.crt_public_column = crt_schedule, crt_public_column
        self.crt_public_batch_size = crt_public_batch_size
        self.crt: CrtSchedule | None = None  # built against the data in install()
        self._public_rows = np.zeros(0, dtype=np.int64)
        check_positive("clip_norm", clip_norm)
        self.clip_norm = float(clip_norm)
        check_noise_multiplier(noise_multiplier)
        self._requested_noise = noise_multiplier
        self.noise_multiplier: float | None = None  # resolved against the data in install()
        self.verification: Verification | None = None  # bounds recomputed at that sigma in install()
        self._configured_seed = None if dp_seed is None else check_dp_seed(dp_seed)
        if self._configured_seed is not None:
            loud_warning(
                "dp_seed was given explicitly: anyone who knows it can reproduce the batches and subtract "
                "the noise, which removes all protection. Use it only for tests; leave it None in real runs."
            )
        self.per_example_loss = per_example_loss or lm_per_example_loss
        self.dp_state_dir = dp_state_dir
        self._installed = False
        self._dp_seed: int | None = None
        self._run_id: str | None = None
        self._state_dir: Path | None = None  # dp_state_dir resolved against output_dir
        self._start_step = 0
        self._steps_run = 0
        self._clipper: GhostClipper | None = None
        self._model: nn.Module | None = None
        self._params: list[nn.Parameter] = []
        self._param_ids: set[int] = set()
        self._pending: tuple[int, int, bool] | None = None  # (step, examples on this rank, public)
        self._sharded = False  # FSDP2: the model's parameters are shards (set in on_train_begin)
        self._filler_source: tuple[Any, Any] | None = None  # (dataset, collator) of the filler row
        self._drawn_since_log: list[int] = []
        #: The eval datasets and the evaluations that ran on rows holding secrets (stated on the card).
        self.evaluation = EvaluationCoverage()
        self._independence_checked = False  # this run's first-step check (see independence.py)
        self._told_left_padding = False

    def __repr__(self) -> str:  # no seed
        return (
            f"GhostClippingCallback(B={self.plan.expected_batch_size:g}, T={self.plan.steps}, "
            f"C={self.clip_norm:g}, sigma={self.noise_multiplier})"
        )

    @property
    def public_rows(self) -> np.ndarray:
        """CRT mode: the indices of the public rows (empty otherwise)."""
        return self._public_rows

    @property
    def expected_batch_size(self) -> float:
        return self.plan.expected_batch_size

    def steps_behind(self, global_step: int) -> tuple[int, int]:
        """(DP steps, CRT public steps) among the first ``global_step`` optimizer steps: what weights
        saved at that step went through (``global_step`` counts resumed steps too).

        A trainer that took no step (``global_step`` 0: e.g. a model trained elsewhere, saved by a
        fresh trainer) cannot know what the weights went through; the plan's T is counted, which is
        never less than a run of this plan took, so the bounds stated are never more favourable.
        """
        if global_step <= 0:
            logger.warning(
                "no DP step was taken by this trainer: the protection artifacts certify the plan's T=%d "
                "steps (true only if the weights went through at most T steps of this plan)", self.plan.steps
            )
            return self.plan.steps, 0
        if self.crt is None:
            return int(global_step), 0
        private = int(np.count_nonzero(~self.crt.public[:global_step]))
        return private, int(global_step) - private

    # ------------------------------------------------------------------------- what is published
    #: Each secret's rows and unique occurrences for the report's CRT section (CRT Prop. 7), e.g.
    #: ``callback.crt_occurrences = hush_hf.crt.occurrence_counts(text_dataset, secret_set)``.
    crt_occurrences: Any = None

    def write_protection_artifacts(
        self, output_dir: str | Path, *, global_step: int, **kwargs: Any
    ) -> dict[str, Path]:
        """README.md card section, hush_plan.json and privacy_report.{json,md,png} (see hush_hf.audit),
        beside the weights already saved in ``output_dir``.

        The plan written carries the training record: the sigma used, the DP steps the weights went
        through (:meth:`steps_behind` of the trainer's ``global_step``, CRT public steps apart) and the
        weights' digests. Every bound stated is recomputed at them (``self.verification``, made when
        training was set up, is reused when the run took the plan's T steps); none is read from the plan
        file. ``crt``: the report's CRT section (default :meth:`crt_report_section`); ``evaluation``: the
        evaluations run on rows holding secrets (default ``self.evaluation``).
        """
        from hush_hf.audit import write_protection_artifacts

        if "crt" not in kwargs:
            kwargs["crt"] = self.crt_report_section(occurrences=self.crt_occurrences)
        if "evaluation" not in kwargs:
            kwargs["evaluation"] = self.evaluation.card_section()
        dp_steps, public_steps = self.steps_behind(global_step)
        return write_protection_artifacts(
            output_dir,
            self.plan,
            clip_norm=self.clip_norm,
            noise_multiplier=self.noise_multiplier,
            dp_steps=dp_steps,
            public_steps=public_steps,
            verification=self.verification,
            **kwargs,
        )

    def crt_report_section(
        self,
        *,
        recall: float | None = None,
        conservative_recall: float | None = None,
        occurrences: Any = None,
    ) -> dict[str, Any] | None:
        """The report's CRT section: the CRT-mode counts, the ``occurrences`` and, with ``recall``,
        CRT Thm. 8.3 (``hush_hf.crt.crt_section``); None when there is nothing to state."""
        if self.crt is None and recall is None and occurrences is None:
            return None
        from hush_hf.crt import crt_section

        training = {}
        if self.crt is not None:
            training = {
                "schedule": self.crt_schedule,
                "public_rows": int(self.public_rows.size),
                "public_steps": self.crt.public_steps,
            }
        return crt_section(
            self.plan,
            recall=recall,
            conservative_recall=conservative_recall,
            noise_multiplier=self.noise_multiplier,
            training=training,
            occurrences=occurrences,
        )

    # ------------------------------------------------------------------------- installation
    @classmethod
    def attach(
        cls, trainer: Trainer, plan: ProtectionPlan | str | Path, **kwargs: Any
    ) -> GhostClippingCallback:
        """Make a plain ``Trainer`` (or TRL's ``SFTTrainer``) train with DP and publish like
        ``SecretProtectionTrainer``: validates, routes the trainer's methods, adds the callback."""
        callback = cls(plan, **kwargs)
        callback.install(trainer, route_methods=True)
        return callback

    def install(self, trainer: Trainer, *, route_methods: bool) -> None:
        """Validate ``trainer`` against the plan and register this callback on it.

        ``route_methods=True`` replaces ``train``, ``get_train_dataloader``, ``training_step``,
        ``_get_grad_norm``, ``_get_num_items_in_batch`` and ``log`` on this trainer instance (a plain
        ``Trainer``), and its publishing methods (``save_model``, ``create_model_card``, ``push_to_hub``,
        ``_push_from_checkpoint``); ``SecretProtectionTrainer`` overrides them itself and passes False.
        """
        if self._installed:
            raise ValueError("this GhostClippingCallback is already installed on a trainer")
        args = trainer.args
        check_dp_training_arguments(args)
        check_single_process_devices(args)
        self._state_dir = resolve_dp_state_dir(self.dp_state_dir, args.output_dir)
        if trainer.is_deepspeed_enabled:
            raise ValueError(
                "DeepSpeed is not supported with DP training: it owns the backward and the gradient "
                "reduction, which the DP step must drive; launch with FSDP2 (configs/accelerate/fsdp.yaml) "
                "or DDP (configs/accelerate/multi_gpu.yaml) instead"
            )
        if trainer.is_fsdp_enabled:
            check_fsdp_plugin(trainer.accelerator.state.fsdp_plugin)
            if self.crt_schedule != "off":
                raise ValueError(
                    f"crt_schedule={self.crt_schedule!r} is not supported under FSDP: its public steps run a "
                    "plain backward, which FSDP would average over ranks; use DDP for CRT mode"
                )
        if getattr(trainer, "padding_free", False):
            raise ValueError(
                "padding-free batches (TRL's padding_free=True, or packing with the default 'bfd' strategy) "
                "concatenate all examples of a batch into one row, so per-example clipping cannot separate "
                "them; use SFTConfig(packing_strategy='wrapped') or packing=False with padding_free=False"
            )
        if trainer.compute_loss_func is not None:
            raise ValueError(
                "compute_loss_func is not supported with DP training: the loss must be per example; "
                "pass per_example_loss= (or override SecretProtectionTrainer.compute_per_example_loss)"
            )
        if trainer.model is not None:
            check_clippable(trainer.model, self.clip_norm)
        dataset = trainer.train_dataset
        check_plan_fits(self.plan, steps=args.max_steps, dataset=dataset)
        secret_ids = (
            column(dataset, SECRET_IDS_COLUMN) if SECRET_IDS_COLUMN in column_names(dataset) else None
        )
        self.noise_multiplier, self.verification = verify_plan_for_training(
            self.plan, self._requested_noise, secret_ids=secret_ids
        )
        if self.crt_schedule != "off":
            self._setup_crt(dataset, secret_ids)
        if route_methods:
            self._route_methods(trainer)
            self.evaluation.register(trainer.eval_dataset)  # SecretProtectionTrainer registers its own
        trainer.add_callback(self)
        # First in line: every other callback's on_pre_optimizer_step then sees the noised gradient only.
        callbacks = trainer.callback_handler.callbacks
        callbacks.insert(0, callbacks.pop(callbacks.index(self)))
        self._installed = True
        logger.info(
            "DP training: B=%g, T=%d, C=%g, noise multiplier %.6g, %d examples",
            self.plan.expected_batch_size,
            self.plan.steps,
            self.clip_norm,
            self.noise_multiplier,
            self.plan.num_examples,
        )

    def _setup_crt(self, dataset: Any, secret_ids: Any) -> None:
        """The public rows (verified to hold no tagged secret) and the CRT step schedule."""
        name = self.crt_public_column
        if name not in column_names(dataset):
            raise ValueError(
                f"crt_schedule={self.crt_schedule!r} needs a bool column {name!r} marking the public rows "
                "(hush_hf.crt.redact_dataset adds 'crt_public'); train_dataset has none"
            )
        if secret_ids is None:
            raise ValueError(
                f"crt_schedule={self.crt_schedule!r} needs the '{SECRET_IDS_COLUMN}' column to verify that "
                "no public row holds a tagged secret; keep the column the plan was computed from"
            )
        flags, ids = (_as_list(column(dataset, name)), _as_list(secret_ids))
        for row, flag in enumerate(flags):
            if not isinstance(flag, (bool, np.bool_)):
                raise ValueError(f"column {name!r} must hold bools; row {row} has a {type(flag).__name__}")
            if flag and ids[row]:
                raise ValueError(
                    f"row {row} is marked public ({name}=True) but holds {len(ids[row])} tagged "
                    "secret(s): public steps train without noise, so it must be private"
                )
        public = np.flatnonzero(np.asarray(flags, dtype=bool))
        batch = self.crt_public_batch_size or max(1, round(self.plan.expected_batch_size))
        self.crt_public_batch_size = batch
        self._public_rows = public
        self.crt = build_schedule(
            self.crt_schedule,
            private_steps=self.plan.steps,
            num_public=int(public.size),
            num_private=len(flags) - int(public.size),
            public_batch_size=batch,
            expected_batch_size=self.plan.expected_batch_size,
        )
        if not public.size:
            loud_warning(f"CRT mode: no row is public ({name}), so every step is a DP step")
        logger.info(
            "CRT mode (%s): %d public rows, %d public steps of %d rows around the %d DP steps",
            self.crt_schedule,
            public.size,
            self.crt.public_steps,
            batch,
            self.crt.private_steps,
        )

    def training_values(self, values: tuple) -> tuple:
        """``Trainer.set_initial_training_values`` under CRT mode: max_steps = all optimizer steps."""
        if self.crt is None:
            return values
        return (*values[:-1], self.crt.total_steps)

    def _route_methods(self, trainer: Trainer) -> None:
        original_train, original_log, original_evaluate = trainer.train, trainer.log, trainer.evaluate

        @functools.wraps(original_train)
        def train(resume_from_checkpoint: str | bool | None = None, trial: Any = None, **kwargs: Any) -> Any:
            self.prepare_run(trainer, resume_from_checkpoint, trial)
            try:
                output = original_train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)
            finally:
                self.finish_run()
            return without_batch_statistics(output)

        def training_step(model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None) -> Tensor:
            return self.training_step(trainer, model, inputs)

        def log(logs: dict[str, float], start_time: float | None = None) -> None:
            original_log(self.add_log_fields(logs), start_time)

        trainer.train = train
        trainer.get_train_dataloader = functools.partial(self.train_dataloader, trainer)
        trainer.training_step = training_step
        trainer._get_grad_norm = no_grad_norm
        trainer._get_num_items_in_batch = no_num_items_in_batch
        trainer.floating_point_ops = no_floating_point_ops
        trainer.log = log

        @functools.wraps(original_evaluate)
        def evaluate(eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"):
            # Metrics on rows holding secrets are outside the plan: recorded for the card (evaluation.py).
            self.evaluation.evaluating(eval_dataset, metric_key_prefix, trainer.eval_dataset)
            return original_evaluate(eval_dataset, ignore_keys, metric_key_prefix)

        trainer.evaluate = evaluate
        original_values = trainer.set_initial_training_values
        trainer.set_initial_training_values = lambda *a, **k: self.training_values(original_values(*a, **k))
        self._route_publishing(trainer)

    def _route_publishing(self, trainer: Trainer) -> None:
        """``save_model``, ``create_model_card``, ``push_to_hub`` and the pushes during training publish what
        ``SecretProtectionTrainer`` publishes (:mod:`hush_hf.trainer.publishing`), around the trainer's own
        methods (TRL's model card included)."""
        save_weights, write_card = trainer.save_model, trainer.create_model_card

        def write(output_dir: str | Path, **kwargs: Any) -> dict[str, Path]:
            step = trainer.state.global_step
            return self.write_protection_artifacts(output_dir, global_step=step, **kwargs)


        def save_model(output_dir: str | None = None, _internal_call: bool = False) -> None:
            publishing.save_model(
                trainer, output_dir, _internal_call, save_weights=save_weights, write_artifacts=write
            )

        def create_model_card(*args: Any, **kwargs: Any) -> None:
            publishing.create_model_card(
                trainer, *args, write_card=write_card, write_artifacts=write, **kwargs
            )

        def push_to_hub(
            commit_message: str | None = "End of training",
            blocking: bool = True,
            token: str | None = None,
            revision: str | None = None,
            private: bool | None = None,
            *,
            extra_files: tuple[str, ...] | list[str] = (),
            **kwargs: Any,
        ) -> Any:
            return publishing.push_to_hub(
                trainer, commit_message, blocking, token, revision, private,
                save_weights=save_weights, extra_files=extra_files, **kwargs,
            )  # fmt: skip

        def push_from_checkpoint(checkpoint_folder: str) -> None:
            publishing.push_from_checkpoint(
                trainer, checkpoint_folder, save_weights=save_weights, write_artifacts=write
            )

        trainer.save_model = save_model
        trainer.create_model_card = create_model_card
        trainer.push_to_hub = push_to_hub
        trainer._push_from_checkpoint = push_from_checkpoint

    # ------------------------------------------------------------------------- one run
    def prepare_run(self, trainer: Trainer, resume_from_checkpoint: str | bool | None, trial: Any) -> None:
        """Before ``Trainer.train``: the secret seed (fresh, or the checkpoint's) and the start step."""
        if not self._installed:
            raise RuntimeError("install the GhostClippingCallback first (GhostClippingCallback.attach)")
        check_dp_training_arguments(trainer.args)  # again: args and the environment may have changed
        if trial is not None:
            raise ValueError("hyperparameter search (trial=) is not supported with DP training")
        check_process_group_matches_launch()
        destroy_process_group_at_exit()
        self._state_dir = resolve_dp_state_dir(self.dp_state_dir, trainer.args.output_dir)
        digest = plan_digest(self.plan)
        if broadcast_object(digest) != digest:
            raise RuntimeError(
                "the ranks hold different protection plans; every rank must train with rank 0's plan"
            )
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(trainer.args.output_dir)
            if checkpoint is None:
                raise ValueError(
                    f"no checkpoint found in output_dir {trainer.args.output_dir!r} to resume from"
                )
        if checkpoint and self.crt is not None:
            raise ValueError("resuming a CRT-mode run (crt_schedule) from a checkpoint is not supported")
        if checkpoint:
            saved, saved_plan = load_run_state(checkpoint)
            if not same_sampling(saved_plan, self.plan):
                raise ValueError(
                    "cannot resume: the checkpoint's plan samples differently from this run's plan; pass the "
                    "plan the checkpoint's run trained with (its local plan file, or, for the same rows, "
                    f"ProtectionPlan.load('{Path(checkpoint) / 'hush_plan.json'}').bound_to(train_dataset))"
                )
            saved.check_continues(self._run_state(run_id=saved.run_id, step=saved.global_step))
            state_dir = self._state_dir
            seed = on_rank_zero(lambda: load_dp_seed(state_dir, saved.run_id, checkpoint=checkpoint,
                                                     commitment=saved.seed_digest))
            if self._configured_seed is not None and self._configured_seed != seed:
                raise ValueError(
                    "dp_seed was given but is not the seed the checkpoint's run was trained with (values not "
                    "shown); leave dp_seed unset to resume: the seed is read from dp_state_dir"
                )
            run_id, start = saved.run_id, saved.global_step
        else:
            if self._steps_run > 0:
                raise ValueError(
                    f"this trainer already took {self._steps_run} DP steps; training again from step 0 would "
                    f"use the data beyond the T={self.plan.steps} steps the plan certifies. Resume from a "
                    "checkpoint (train(resume_from_checkpoint=...)) or start from a fresh model."
                )
            seed = self._configured_seed if self._configured_seed is not None else draw_dp_seed()
            run_id, start = new_run_id(), 0
        self._dp_seed, self._run_id = broadcast_object((seed, run_id))  # rank 0's on every rank
        self._start_step = start

    def finish_run(self) -> None:
        """After ``Trainer.train`` (also when it raised): take the hooks off the model."""
        if self._clipper is not None:
            self._clipper.remove()
        self._clipper = None
        self._pending = None

    def _run_state(self, *, run_id: str, step: int) -> RunState:
        return RunState(
            run_id=run_id,
            global_step=step,
            noise_multiplier=float(self.noise_multiplier),
            clip_norm=self.clip_norm,
            expected_batch_size=self.plan.expected_batch_size,
            steps=self.plan.steps,
        )

    # ------------------------------------------------------------------------- routed methods
    def train_dataloader(self, trainer: Trainer) -> DataLoader:
        """Batches of the weighted Poisson sampler (this rank's share); ``len`` = T steps.

        Not passed through ``accelerator.prepare``: its ``BatchSamplerShard`` would split and pad the
        batches. Trainer's resume skips the first k batches with accelerate's ``SkipBatchSampler``,
        which draws and discards them, so batch t still meets step t.
        """
        import datasets

        if self._dp_seed is None:
            raise RuntimeError("the DP data loader is built inside train(); call trainer.train()")
        args = trainer.args
        dataset = trainer.train_dataset
        # Again here: train_dataset may have been replaced since install().
        check_plan_fits(self.plan, steps=args.max_steps, dataset=dataset)
        if self.crt_schedule != "off":  # and its public rows with it
            names = column_names(dataset)
            ids = column(dataset, SECRET_IDS_COLUMN) if SECRET_IDS_COLUMN in names else None
            self._setup_crt(dataset, ids)
        collate_fn = trainer.data_collator
        if isinstance(dataset, datasets.Dataset):
            dataset = trainer._remove_unused_columns(dataset, description="training")
            crt = self.crt_public_column if self.crt is not None else None
            dataset = dataset.remove_columns(
                [c for c in dataset.column_names if is_plan_column(c) or c == crt]
            )
        else:
            collate_fn = trainer._get_collator_with_removed_columns(collate_fn, description="training")
        rank, world_size = rank_and_world_size()
        if (rank, world_size) != (args.process_index, args.world_size):
            raise RuntimeError(
                f"process group (rank {rank} of {world_size}) disagrees with TrainingArguments "
                f"(process_index {args.process_index} of world_size {args.world_size})"
            )
        sampler = WeightedPoissonSampler(
            self.plan.sampling_probs,
            num_steps=self.plan.steps,
            seed=self._dp_seed,
            num_replicas=world_size,
            rank=rank,
        )
        if self.crt is not None:
            sampler = CrtBatchSampler(
                sampler,
                self.crt,
                self._public_rows,
                public_batch_size=self.crt_public_batch_size,
                seed=args.seed,
                num_replicas=world_size,
                rank=rank,
            )
        self._filler_source = (dataset, collate_fn)
        workers = args.dataloader_num_workers
        return DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=SkipEmptyCollator(collate_fn),
            num_workers=workers,
            pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers and workers > 0,
            prefetch_factor=args.dataloader_prefetch_factor if workers > 0 else None,
            worker_init_fn=functools.partial(seed_worker, num_workers=workers, rank=rank),
        )

    def training_step(self, trainer: Trainer, model: nn.Module, inputs: dict[str, Any]) -> Tensor:
        """Accumulate ``sum_i clip(g_i, C)`` over this rank's share into ``p.grad`` (in float32 beside a
        bf16/fp16 parameter, :mod:`hush_hf.clipping.clipped_sums`); return its mean loss.

        The forward runs on the unwrapped model (under DDP's ``no_sync``): DDP's averaging hook must
        not touch the clipped sums. A left-padded share is re-padded to the right first (exact, see
        :mod:`hush_hf.trainer.padding`); the first step of a run checks that each example's loss
        depends on that example alone (:mod:`hush_hf.trainer.independence`). Under FSDP2 every rank
        runs as many micro-batches as the busiest one, padding with zero-weight fillers
        (:mod:`hush_hf.trainer.fsdp`). The returned loss is the mean per-example loss of the share (NaN
        for an empty share, which Trainer's ``logging_nan_inf_filter`` skips); fillers are not counted
        in it.
        """
        if self._clipper is None or self._model is None:
            raise RuntimeError("the DP step is not set up: train through trainer.train()")
        module = self._model
        if trainer.accelerator.unwrap_model(model) is not module:
            raise RuntimeError("training_step got a different model than the one the clipping hooks are on")
        args = trainer.args
        step = trainer.state.global_step
        module.train()
        if callable(getattr(trainer.optimizer, "train", None)):
            trainer.optimizer.train()
        clipped_sums.discard_(self._params)  # only this step's clipped sum may reach the optimizer
        self._clipper.reset()
        if not self._independence_checked:
            self._check_independence(trainer)
            self._independence_checked = True
        inputs = self._right_aligned({k: v for k, v in inputs.items() if not is_plan_column(k)})
        if self.crt is not None:
            inputs.pop(self.crt_public_column, None)
            if self.crt.is_public(step):
                return self._public_step(trainer, model, inputs)
        loss_sum = torch.zeros((), dtype=torch.float64, device=args.device)
        count = 0
        micros = split_micro_batches(inputs, args.per_device_train_batch_size)
        real = len(micros)
        if self._sharded:
            # FSDP's all-gathers and the engine's reduce-scatters are collectives: every rank runs as many
            # micro-batches as the busiest one, padding with zero-weight fillers (exactly 0, see fsdp.py).
            busiest = max_across_ranks(real, args.device)
            fillers = filler_micro_batches(real, busiest)
            if busiest and not self._clipper.verified:
                self._self_check_on_filler(trainer)
            micros += [self._filler_batch()] * fillers
        with trainer.accelerator.no_sync(model):
            for k, micro in enumerate(micros):
                losses = self._per_example_losses(trainer, micro)
                if k >= real:  # a filler: its examples weigh 0
                    self._clipper.clipped_backward(losses * 0.0)
                    continue
                self._clipper.clipped_backward(losses)
                loss_sum += losses.detach().sum().to(torch.float64)
                count += losses.shape[0]
        self._pending = (step, count, False)
        mean = loss_sum / count if count else torch.tensor(math.nan, dtype=torch.float64, device=args.device)
        return mean.to(torch.float32)

    def _per_example_losses(self, trainer: Trainer, micro: dict[str, Any]) -> Tensor:
        """``per_example_loss`` of one micro-batch, as the DP step computes it (shape checked: (rows,))."""
        module = self._model
        rows = batch_size(micro)
        batch = model_inputs(module, micro, trainer.args.device)
        with trainer.compute_loss_context_manager():
            losses = self.per_example_loss(module, batch)
        if not isinstance(losses, Tensor) or tuple(losses.shape) != (rows,):
            shape = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
            raise ValueError(f"per_example_loss must return a tensor of shape ({rows},), got {shape}")
        return losses

    @property
    def _encoder_decoder(self) -> bool:
        return bool(getattr(getattr(unwrap_model(self._model), "config", None), "is_encoder_decoder", False))

    def _right_aligned(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch with left padding moved to the right (exact; refused where it cannot be, see
        :mod:`hush_hf.trainer.padding`); said once per callback."""
        aligned = right_align(batch, encoder_decoder=self._encoder_decoder)
        if aligned is not batch and not self._told_left_padding:
            logger.info(
                "left-padded batches are re-padded to the right before the DP step (a left-padded row's "
                "loss depends on the other rows' lengths); set tokenizer.padding_side = 'right' to skip this"
            )
            self._told_left_padding = True
        return aligned

    def _collated(self, rows: list[Any]) -> dict[str, Any]:
        """Training rows collated like every batch, plan columns dropped, right-aligned."""
        if self._filler_source is None:
            raise RuntimeError("the DP data loader is built inside train(); call trainer.train()")
        _, collate_fn = self._filler_source
        batch = collate_fn(rows).items()
        return self._right_aligned(
            {k: v for k, v in batch if not is_plan_column(k) and k != self.crt_public_column}
        )

    def _filler_batch(self) -> dict[str, Any]:
        """Row 0 of the training set, collated like every batch: the input of a filler micro-batch."""
        if self._filler_source is None:
            raise RuntimeError("the DP data loader is built inside train(); call trainer.train()")
        dataset, _ = self._filler_source
        return split_micro_batches(self._collated([dataset[0]]), 1)[0]

    def _check_independence(self, trainer: Trainer) -> None:
        """ValueError unless each check row's per-example loss is the same inside a batch and alone.

        See :mod:`hush_hf.trainer.independence`. Runs at the first step of a run, before any gradient,
        on every rank at once (the rows do not depend on the draw; under FSDP the forwards are
        collectives) and every rank raises if any rank found a difference.
        """
        if self._filler_source is None:
            raise RuntimeError("the DP data loader is built inside train(); call trainer.train()")
        dataset, _ = self._filler_source
        indices = check_rows(dataset)
        with preserved_random_state(trainer.args.device):  # a masking collator draws from the global RNGs
            batch = self._collated([dataset[i] for i in indices])
        module, args = self._model, trainer.args
        tf32 = args.device.type == "cuda" and torch.get_float32_matmul_precision() != "highest"
        mixed = trainer.accelerator.mixed_precision not in (None, "no") or args.bf16 or args.fp16
        kind = precision([p.dtype for p in module.parameters()], mixed_precision=bool(mixed), tf32=tf32)
        in_batch: list[float] = []
        by_itself: list[float] = []
        module.eval()  # dropout would make the two forwards differ
        try:
            with torch.no_grad():
                for micro in split_micro_batches(batch, args.per_device_train_batch_size):
                    in_batch += self._per_example_losses(trainer, micro).double().tolist()
                    for row in range(batch_size(micro)):
                        single = alone(micro, row, encoder_decoder=self._encoder_decoder)
                        by_itself += self._per_example_losses(trainer, single).double().tolist()
        finally:
            module.train()
        coupled = coupled_rows(in_batch, by_itself, RTOL[kind])
        if max_across_ranks(int(bool(coupled)), args.device):
            rows = sorted(indices[i] for i in coupled)
            where = f"training rows {rows}" if coupled else "another rank's rows"
            raise ValueError(
                f"example independence check failed: {where} get a different per_example_loss inside a batch "
                f"of {len(indices)} than alone (beyond {RTOL[kind]:g} relative, {kind} precision), so one "
                "example's clipped gradient depends on the others and C no longer bounds its influence; look "
                "for a per_example_loss normalised over the batch, labels on padding positions (make them "
                "-100), packed rows without a per-row attention mask, or a model whose forward mixes rows"
            )

    def _self_check_on_filler(self, trainer: Trainer) -> None:
        """FSDP: run the clipper's first-call self-check on every rank at once, on the same row.

        The self-check runs one extra backward (FSDP all-gathers in it) on the first call whose gradient
        is nonzero; a rank whose first micro-batch is a filler (gradient 0) would run it later than the
        others and the collectives would no longer match. Checked here on the filler row with weight 1,
        identically on every rank; ``p.grad`` is not touched (``per_example_norms``).
        """
        losses = self._per_example_losses(trainer, self._filler_batch())
        self._clipper.per_example_norms(losses)
        del losses
        if not self._clipper.verified:
            raise RuntimeError(
                "FSDP: the clipping self-check could not run on row 0 of the training set (its loss has a "
                "zero gradient); every rank must run it at the same step: put a row with a nonzero loss first"
            )

    def _public_step(self, trainer: Trainer, model: nn.Module, inputs: dict[str, Any]) -> Tensor:
        """CRT public step: the plain backward of this rank's summed loss (no clipping, no noise); the
        sum is reduced over ranks and divided by the public batch size in ``on_pre_optimizer_step``."""
        args = trainer.args
        loss_sum = torch.zeros((), dtype=torch.float64, device=args.device)
        count = 0
        with trainer.accelerator.no_sync(model):
            for micro in split_micro_batches(inputs, args.per_device_train_batch_size):
                losses = self._per_example_losses(trainer, micro)
                self._clipper.reset()  # the hooks recorded this forward; a public step does not clip
                losses.sum().backward()
                loss_sum += losses.detach().sum().to(torch.float64)
                count += losses.shape[0]
        self._pending = (trainer.state.global_step, count, True)
        mean = loss_sum / count if count else torch.tensor(math.nan, dtype=torch.float64, device=args.device)
        return mean.to(torch.float32)

    def add_log_fields(self, logs: dict[str, float]) -> dict[str, float]:
        """Training logs get sigma and the mean drawn batch size since the last log; never a grad norm."""
        logs = {k: v for k, v in logs.items() if k not in BATCH_STATISTICS}
        if logs.pop("grad_norm", None) is not None:
            logger.warning("dropped 'grad_norm' from the logs: it is a statistic of the pre-noise gradient")
        if "loss" in logs and self._drawn_since_log:
            logs[LOG_NOISE_MULTIPLIER] = float(self.noise_multiplier)
            logs[LOG_BATCH_SIZE] = sum(self._drawn_since_log) / len(self._drawn_since_log)
            self._drawn_since_log = []
        return logs

    # ------------------------------------------------------------------------- events
    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kwargs: Any
    ):
        if self._dp_seed is None:
            raise RuntimeError(
                "GhostClippingCallback was added without routing train(): "
                "use GhostClippingCallback.attach(trainer)"
            )
        if state.global_step != self._start_step:
            raise RuntimeError(
                f"Trainer starts at step {state.global_step} but the DP state is at step {self._start_step}"
            )
        self.finish_run()
        params = [p for p in model.parameters() if p.requires_grad]
        check_optimizer_params(kwargs.get("optimizer"), {id(p) for p in params})
        broadcast_module_state_(model)  # one model on every rank (FSDP2 shards are left as they are)
        self._sharded = is_sharded(model)
        if self._sharded and self.crt is not None:
            raise ValueError(
                f"crt_schedule={self.crt_schedule!r} is not supported under FSDP: its public steps run a "
                "plain backward, which FSDP would average over ranks; use DDP for CRT mode"
            )
        self._clipper = GhostClipper(model, self.clip_norm)
        self._independence_checked = False
        self._model = model
        self._params = params
        self._param_ids = {id(p) for p in params}
        self._drawn_since_log = []

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """Sum the clipped gradients over ranks, add N(0, sigma^2 C^2 I) once, divide by B."""
        if self._pending is None or self._pending[0] != state.global_step:
            raise RuntimeError(
                f"optimizer step {state.global_step} was not preceded by a DP training step; refusing to "
                "apply gradients that were not clipped and noised"
            )
        check_optimizer_params(kwargs.get("optimizer"), self._param_ids)  # param groups added mid-run
        step, count, public = self._pending
        self._pending = None
        sums = clipped_sums.clipped_sums_for_noise(self._params)  # float32 for bf16/fp16 parameters
        if public:
            self._finish_public_step(count, sums)
            clipped_sums.round_into_grads_(self._params)
            return
        count = self._reduce_across_ranks(count, sums)
        privatize_gradients_(
            self._params,
            noise_multiplier=float(self.noise_multiplier),
            clip_norm=self.clip_norm,
            expected_batch_size=self.plan.expected_batch_size,
            dp_seed=self._dp_seed,
            step=step if self.crt is None else int(self.crt.private_index[step]),
        )
        check_replicas_agree(replicated([p.grad for p in self._params]))  # FSDP2 shards differ by design
        self._drawn_since_log.append(count)
        self._steps_run = step + 1

    def _reduce_across_ranks(self, count: int, sums: list[Tensor]) -> int:
        """Sum every rank's gradient sums (in place) and drawn-row counts; returns the total count. FSDP2
        shards already hold the sum over ranks (the clipping engine reduce-scatters each clipped sum)."""
        _, world_size = rank_and_world_size()
        if world_size == 1:
            return count
        all_reduce_sum_(replicated(sums))
        drawn = torch.tensor([float(count)], dtype=torch.float64, device=self._params[0].device)
        all_reduce_sum_([drawn])
        return int(drawn.item())

    def _finish_public_step(self, count: int, sums: list[Tensor]) -> None:
        """CRT public step: the summed gradient of all ranks divided by the rows drawn (a mean)."""
        count = self._reduce_across_ranks(count, sums)
        with torch.no_grad():
            for grad in sums:
                grad.div_(max(count, 1))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """Write the seed into ``dp_state_dir`` (once per run), and the run id, step and plan into the
        checkpoint Trainer just saved (main process only)."""
        if args.should_save:
            save_dp_seed(self._state_dir, self._run_id, self._dp_seed)
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            run_state = replace(self._run_state(run_id=self._run_id, step=state.global_step),
                                seed_digest=seed_commitment(self._state_dir, self._run_id))
            save_run_state(folder, run_state, self.plan)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self.finish_run()


@contextlib.contextmanager
def preserved_random_state(device: torch.device) -> Iterator[None]:
    """Python's, NumPy's and torch's global random states (CPU and ``device``) are restored on exit: a
    check that calls the collator once more leaves the training batches (e.g. MLM masks) as they were."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = []
    if device.type == "cuda":
        devices = [torch.cuda.current_device() if device.index is None else device.index]
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def on_rank_zero(load: Any) -> Any:
    """``load()`` run on rank 0 only, its result on every rank; its ValueError raised on every rank (a
    rank that raised alone would leave the others waiting in the broadcast)."""
    result, error = None, None
    if rank_and_world_size()[0] == 0:
        try:
            result = load()
        except ValueError as err:
            error = str(err)
    result, error = broadcast_object((result, error))
    if error is not None:
        raise ValueError(error)
    return result


def _as_list(values: Any) -> list[Any]:
    """A column as Python values (Arrow arrays from ``column`` included)."""
    return values.to_pylist() if hasattr(values, "to_pylist") else list(values)


def no_floating_point_ops(inputs: Any) -> int:
    """Stands in for ``Trainer.floating_point_ops``: Trainer sums it into ``total_flos`` (trainer_state.json,
    train_results.json), i.e. 6 x parameters x the tokens of the batches actually drawn, which the noise
    does not hide. Counted as 0, and the key is dropped from the logs and the train metrics."""
    return 0


def without_batch_statistics(output: Any) -> Any:
    """``Trainer.train``'s output with ``total_flos`` and token counts taken out of its metrics."""
    metrics = getattr(output, "metrics", None)
    if isinstance(metrics, dict):
        for key in BATCH_STATISTICS:
            metrics.pop(key, None)
    return output


def no_num_items_in_batch(batch_samples: Any, device: Any = None) -> None:
    """Stands in for ``Trainer._get_num_items_in_batch``: the DP step does not use the token count, and
    Trainer gathers it across ranks only on ranks whose share is non-empty (a rank with an empty Poisson
    share would skip the collective and the others would wait forever)."""
    return None


def no_grad_norm(model: nn.Module, grad_norm: Any = None) -> None:
    """Stands in for ``Trainer._get_grad_norm``: the pre-noise gradient norm is never computed or logged."""
    return None
