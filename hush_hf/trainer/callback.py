"""GhostClippingCallback: what a protection plan certifies, kept true through a ``Trainer`` run.

The callback is the run's observer and book-keeper: it validates the trainer against the plan
(:meth:`GhostClippingCallback.install`), resolves the noise multiplier and recomputes every bound at it,
draws or restores the secret seed (:meth:`prepare_run`; kept in the private ``dp_state_dir``, never in
``output_dir``: :mod:`hush_hf.trainer.seed_store`), builds the weighted Poisson sampler and the CRT
schedule, hands each optimizer step to the DP step (:class:`hush_hf.trainer.engine.DPStep`: draw ->
micro-batches -> per-example losses -> clipped sums -> noise), adds sigma and the drawn batch size to the
logs, writes the run id, step and plan into each checkpoint (``on_save``) and the protection artifacts
beside published weights. Which ``Trainer`` methods are taken over, and why, is one table:
:mod:`hush_hf.trainer.routing`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor, nn
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from hush_hf.clipping import GhostClipper
from hush_hf.planning.plan import ProtectionPlan
from hush_hf.planning.verification import Verification
from hush_hf.sampling import WeightedPoissonSampler, draw_dp_seed
from hush_hf.sampling.seeds import check_dp_seed
from hush_hf.trainer.crt import CrtBatchSampler, CrtSchedule, build_schedule
from hush_hf.trainer.distributed import (
    broadcast_module_state_,
    broadcast_object,
    check_process_group_matches_launch,
    destroy_process_group_at_exit,
    on_rank_zero,
    rank_and_world_size,
)
from hush_hf.trainer.dp_history import check_not_trained_by_another_run, record_step
from hush_hf.trainer.engine import DPStep
from hush_hf.trainer.evaluation import EvaluationCoverage, check_no_metric_feedback
from hush_hf.trainer.fsdp import check_fsdp_plugin, is_sharded
from hush_hf.trainer.losses import PerExampleLoss, lm_per_example_loss
from hush_hf.trainer.overrides import check_no_ignored_overrides
from hush_hf.trainer.plan_setup import (
    SECRET_IDS_COLUMN,
    check_plan_fits,
    column,
    column_names,
    load_plan,
    loud_warning,
    plan_digest,
    verify_plan_for_training,
)
from hush_hf.trainer.routing import BATCH_STATISTICS, route_instance
from hush_hf.trainer.run_state import RunState, load_run_state, same_sampling, save_run_state
from hush_hf.trainer.seed_store import (
    load_dp_seed,
    load_dp_seed_source,
    new_run_id,
    resolve_dp_state_dir,
    save_dp_seed,
    seed_commitment,
)
from hush_hf.trainer.trained_weights import TrainedWeights, remember, versions, written_between_steps
from hush_hf.trainer.transformers_api import check_trainer_api
from hush_hf.trainer.validation import (
    check_dp_training_arguments,
    check_model_not_compiled,
    check_model_not_tensor_parallel,
    check_noise_multiplier,
    check_optimizer_params,
    check_positive,
    check_single_process_devices,
)

logger = logging.getLogger(__name__)

LOG_NOISE_MULTIPLIER = "dp_noise_multiplier"
LOG_BATCH_SIZE = "dp_batch_size"


def check_clippable(model: nn.Module, clip_norm: float) -> None:
    """Now, not mid-training: ValueError if compiled, UnsupportedLayerError if a layer has no rule."""
    check_model_not_compiled(model)
    GhostClipper(model, clip_norm).remove()


class GhostClippingCallback(TrainerCallback):
    """Applies per-example clipping and calibrated Gaussian noise to every optimizer step.

    ``plan``: the :class:`ProtectionPlan` (or its JSON path) whose sampling probabilities, expected
    batch size B, steps T and noise multiplier the run uses. ``clip_norm``: C. ``noise_multiplier``:
    None uses the plan's calibrated sigma; a smaller value (0 = no noise, for baselines) is allowed
    with a loud warning that the certified targets do not hold. ``dp_seed``: the secret seed of the
    sampling and noise; None (recommended) draws 128 bits from the OS at train start. Anyone who
    knows it can subtract the noise; the training record, card and ``hush verify`` say a seed was set by
    the user (``dp_seed_source``). ``dp_state_dir``: the private folder the seed is kept in for
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
                "the noise, which removes all protection. Use it only for tests; leave it None in real runs. "
                "The model card and `hush verify` will say the seed was set by the user."
            )
        self.dp_state_dir = dp_state_dir
        self._installed = False
        self._dp_seed: int | None = None
        self._dp_seed_source: str | None = None  # "drawn", "user"; None: unknown (the training record's)
        self._run_id: str | None = None
        self._state_dir: Path | None = None  # dp_state_dir resolved against output_dir
        self._start_step = 0
        self._steps_run = 0
        self._drawn_since_log: list[int] = []
        #: The eval datasets and the evaluations that ran on rows holding secrets (stated on the card).
        self.evaluation = EvaluationCoverage()
        #: The DP step itself (engine.py): draw, micro-batches, per-example losses, clipped sums, noise.
        self.step = DPStep(self.clip_norm, per_example_loss or lm_per_example_loss, (crt_public_column,))

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
    #: The weights as the last run left them: a final save of other weights is refused (trained_weights.py).
    trained_weights: TrainedWeights | None = None
    _step_versions: list[int] | None = None  # the trainable parameters' versions after the last step

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
        dp_steps, public_steps = self.steps_behind(max(global_step, self._steps_run))  # errors mid-step
        return write_protection_artifacts(
            output_dir,
            self.plan,
            clip_norm=self.clip_norm,
            noise_multiplier=self.noise_multiplier,
            dp_steps=dp_steps,
            public_steps=public_steps,
            dp_seed_source=self._dp_seed_source,
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

        ``route_methods=True`` sets every method of :data:`hush_hf.trainer.routing.ROUTES` on this
        trainer instance (a plain ``Trainer``, TRL's); ``SecretProtectionTrainer`` defines them from the
        same table and passes False.
        """
        if self._installed:
            raise ValueError("this GhostClippingCallback is already installed on a trainer")
        check_trainer_api(trainer)
        check_no_ignored_overrides(trainer)
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
        if trainer.compute_loss_func is not None:
            raise ValueError(
                "compute_loss_func is not supported with DP training: the loss must be per example; "
                "pass per_example_loss= (or override SecretProtectionTrainer.compute_per_example_loss)"
            )
        if trainer.model is not None:
            check_clippable(trainer.model, self.clip_norm)
        dataset = trainer.train_dataset
        check_plan_fits(self.plan, steps=args.max_steps, dataset=dataset, tokenizer=trainer.processing_class)
        secret_ids = (
            column(dataset, SECRET_IDS_COLUMN) if SECRET_IDS_COLUMN in column_names(dataset) else None
        )
        self.noise_multiplier, self.verification = verify_plan_for_training(
            self.plan, self._requested_noise, secret_ids=secret_ids
        )
        if self.crt_schedule != "off":
            self._setup_crt(dataset, secret_ids)
        if route_methods:
            route_instance(self, trainer)
            self.evaluation.follow(trainer.eval_dataset)  # SecretProtectionTrainer registers its own
        trainer.add_callback(self)
        # First in line: every other callback's on_pre_optimizer_step then sees the noised gradient only.
        callbacks = trainer.callback_handler.callbacks
        callbacks.insert(0, callbacks.pop(callbacks.index(self)))
        self._installed = True
        logger.info("DP training: B=%g, T=%d, C=%g, noise multiplier %.6g, %d examples",
                    self.plan.expected_batch_size, self.plan.steps, self.clip_norm, self.noise_multiplier,
                    self.plan.num_examples)

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

    # ------------------------------------------------------------------------- one run
    def prepare_run(self, trainer: Trainer, resume_from_checkpoint: str | bool | None, trial: Any) -> None:
        """Before ``Trainer.train``: the secret seed (fresh, or the checkpoint's) and the start step."""
        if not self._installed:
            raise RuntimeError("install the GhostClippingCallback first (GhostClippingCallback.attach)")
        check_dp_training_arguments(trainer.args)  # again: args and the environment may have changed
        if trial is not None:
            raise ValueError("hyperparameter search (trial=) is not supported with DP training")
        self.evaluation.follow(trainer.eval_dataset)
        check_no_metric_feedback(self.evaluation, trainer.args, trainer.callback_handler.callbacks)
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
            seed, source = on_rank_zero(lambda: (
                load_dp_seed(state_dir, saved.run_id, checkpoint=checkpoint, commitment=saved.seed_digest),
                load_dp_seed_source(state_dir, saved.run_id)))
            if self._configured_seed is not None and self._configured_seed != seed:
                raise ValueError(
                    "dp_seed was given but is not the seed the checkpoint's run was trained with (values not "
                    "shown); leave dp_seed unset to resume: the seed is read from dp_state_dir"
                )
            if source is None and self._configured_seed is not None:
                source = "user"  # an older seed file: the user knew the seed, so it counts as set by them
            run_id, start = saved.run_id, saved.global_step
        else:
            if self._steps_run > 0:
                raise ValueError(
                    f"this trainer already took {self._steps_run} DP steps; training again from step 0 would "
                    f"use the data beyond the T={self.plan.steps} steps the plan certifies. Resume from a "
                    "checkpoint (train(resume_from_checkpoint=...)) or start from a fresh model."
                )
            seed = self._configured_seed if self._configured_seed is not None else draw_dp_seed()
            source = "user" if self._configured_seed is not None else "drawn"
            run_id, start = new_run_id(), 0
        # rank 0's on every rank
        self._dp_seed, self._dp_seed_source, self._run_id = broadcast_object((seed, source, run_id))
        self._start_step = start

    def finish_run(self) -> None:
        """After ``Trainer.train`` (also when it raised): take the hooks off the model."""
        self.step.end()

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
        """Batches of the weighted Poisson sampler (this rank's share), one row per drawn example; ``len`` =
        T steps (CRT: all steps). Built inside ``train()``, once the secret seed is known."""
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
        return self.step.data_loader(trainer, sampler)

    def training_step(self, trainer: Trainer, model: nn.Module, inputs: dict[str, Any]) -> Tensor:
        """One optimizer step's clipped per-example backward passes (:meth:`DPStep.run`). A parameter
        written since the last step is refused before them; with several processes the refusal is held
        until the ranks next meet, where every rank raises (:meth:`DPStep.hold`)."""
        try:
            self._refuse_writes_between_steps(self.step.model or model, trainer.state.global_step)
        except ValueError as refusal:
            self.step.hold(refusal)
        public = self.crt is not None and self.crt.is_public(trainer.state.global_step)
        return self.step.run(trainer, model, inputs, public=public)

    def _refuse_writes_between_steps(self, model: nn.Module, step: int, *, raise_now: bool = True) -> None:
        """A trainable parameter written since the last optimizer step: its weights are never published
        (``trained_weights`` refuses them), and, mid-run, the run stops here."""
        refusal = written_between_steps(model, self.step.params, self._step_versions, step)
        if refusal is not None:
            self.trained_weights = TrainedWeights({}, refusal=refusal)
            if raise_now:
                raise ValueError(refusal)

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
        check_model_not_tensor_parallel(model)
        if self._start_step == 0:  # a resumed run loads its checkpoint's weights and continues its count
            check_not_trained_by_another_run(model, self._run_id)
        params = [p for p in model.parameters() if p.requires_grad]
        check_optimizer_params(kwargs.get("optimizer"), {id(p) for p in params})
        broadcast_module_state_(model)  # one model on every rank (FSDP2 shards are left as they are)
        if is_sharded(model) and self.crt is not None:
            raise ValueError(
                f"crt_schedule={self.crt_schedule!r} is not supported under FSDP: its public steps run a "
                "plain backward, which FSDP would average over ranks; use DDP for CRT mode"
            )
        self.step.begin(model, params, kwargs.get("optimizer"))
        self._drawn_since_log, self._step_versions = [], None

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """Sum the clipped gradients over ranks, add N(0, sigma^2 C^2 I) once, divide by B."""
        check_optimizer_params(kwargs.get("optimizer"), self.step.param_ids)  # param groups added mid-run
        step = state.global_step
        count, public = self.step.privatize(
            step,
            noise_multiplier=float(self.noise_multiplier),
            expected_batch_size=self.plan.expected_batch_size,
            dp_seed=self._dp_seed,
            noise_step=step if self.crt is None else int(self.crt.private_index[step]),
        )
        record_step(self.step.params, self._run_id, step + 1)
        if not public:
            self._drawn_since_log.append(count)
            self._steps_run = step + 1

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """Write the seed into ``dp_state_dir`` (once per run), and the run id, step and plan into the
        checkpoint Trainer just saved (main process only)."""
        if args.should_save:
            save_dp_seed(self._state_dir, self._run_id, self._dp_seed, source=self._dp_seed_source)
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            run_state = replace(self._run_state(run_id=self._run_id, step=state.global_step),
                                seed_digest=seed_commitment(self._state_dir, self._run_id))
            save_run_state(folder, run_state, self.plan)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self._step_versions = versions(self.step.params)  # first in line: before other callbacks'

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self.step.settle(args.device)  # an error the last step held on one rank: every rank raises
        self.finish_run()
        self.trained_weights = remember(kwargs.get("model"))  # first in line: before other callbacks'
        self._refuse_writes_between_steps(kwargs.get("model"), state.global_step, raise_now=False)


def _as_list(values: Any) -> list[Any]:
    """A column as Python values (Arrow arrays from ``column`` included)."""
    return values.to_pylist() if hasattr(values, "to_pylist") else list(values)
