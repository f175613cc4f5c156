"""SecretProtectionTrainer: transformers' ``Trainer`` with per-secret protection (Hush, Alg. 2)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import Tensor, nn
from transformers import Trainer, TrainingArguments

from hush_hf.planning.plan import ProtectionPlan
from hush_hf.trainer.callback import GhostClippingCallback, check_clippable
from hush_hf.trainer.config import SecretProtectionConfig, as_secret_protection_config
from hush_hf.trainer.distributed import broadcast_object, rank_and_world_size
from hush_hf.trainer.evaluation import EvaluationCoverage
from hush_hf.trainer.losses import lm_per_example_loss
from hush_hf.trainer.overrides import check_no_ignored_overrides
from hush_hf.trainer.plan_setup import (
    check_expected_batch_size,
    drop_marks,
    load_plan,
    load_secrets,
    plan_for_dataset,
    prepare_secret_ids,
)
from hush_hf.trainer.published_text import check_published_text, published_text_files
from hush_hf.trainer.publishing import check_saved_by
from hush_hf.trainer.routing import define_routes
from hush_hf.trainer.text_tokens import can_decode
from hush_hf.trainer.validation import check_dp_training_arguments

logger = logging.getLogger(__name__)


@define_routes
class SecretProtectionTrainer(Trainer):
    """A ``Trainer`` whose every step is a DP-SGD step of a protection plan.

    Give ``secrets=`` (a ``SecretSet`` or a secrets file; or ``args.secrets_file``) and the trainer finds
    each row's secrets (from the per-token marks of :func:`hush_hf.mark_secrets`, an existing
    ``secret_ids`` column, or by tagging the text column), solves the plan (LP weights, sampling
    probabilities, calibrated noise) for ``args.max_steps`` and B, and trains with it; or give
    ``plan=`` (or ``args.plan_file``: a local plan file) made beforehand from exactly this dataset's
    rows: the plan's row digests must match every row, in order (:mod:`hush_hf.planning.binding`), so
    a shuffled, filtered, edited or replaced dataset is refused. ``args`` may be a
    plain ``TrainingArguments``: it becomes a :class:`SecretProtectionConfig` (batch clipping off).

    The plan columns (``secret_ids``, ``hush_weight``, ``hush_sampling_prob``) and the marks never reach
    the model.
    ``trainer.plan`` is the plan in use and ``trainer.dp`` the :class:`GhostClippingCallback` applying
    it. Override :meth:`compute_per_example_loss` for a loss other than the per-example LM loss (an
    overridden ``compute_loss`` is refused: the DP step never calls it).
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        args: TrainingArguments | None = None,
        data_collator: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        model_init: Any = None,
        compute_loss_func: Any = None,
        compute_metrics: Any = None,
        callbacks: Any = None,
        optimizers: Any = (None, None),
        optimizer_cls_and_kwargs: Any = None,
        preprocess_logits_for_metrics: Any = None,
        *,
        secrets: Any = None,
        plan: ProtectionPlan | str | Path | None = None,
    ) -> None:
        check_no_ignored_overrides(self)  # before any work: compute_loss, get_train_dataloader
        args = as_secret_protection_config(args)
        check_dp_training_arguments(args)  # before the (possibly long) planning: e.g. max_steps unset
        if model is not None:
            check_clippable(model, args.per_example_clip_norm)  # before the (possibly long) planning
        if train_dataset is None:
            raise ValueError("train_dataset is required: the protection plan samples its rows")
        if hasattr(train_dataset, "__len__") and len(train_dataset) == 0:
            raise ValueError("train_dataset has 0 rows: nothing to train on (was it filtered to nothing?)")
        plan, train_dataset = self._resolve_plan(
            args, train_dataset, secrets=secrets, plan=plan, tokenizer=processing_class
        )
        evaluation = EvaluationCoverage(
            secrets if secrets is not None else args.secrets_file,
            text_column=args.secrets_text_column,
            tokenizer=processing_class if can_decode(processing_class) else None,
        )
        evaluation.register(eval_dataset)  # warns about rows holding secrets (before the marks go)
        eval_dataset = drop_marks(eval_dataset)
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            model_init=model_init,
            compute_loss_func=compute_loss_func,
            compute_metrics=compute_metrics,
            callbacks=callbacks,
            optimizers=optimizers,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        )
        self.plan = plan
        self.dp = GhostClippingCallback(
            plan,
            clip_norm=args.per_example_clip_norm,
            noise_multiplier=args.noise_multiplier,
            dp_seed=args.dp_seed,
            dp_state_dir=args.dp_state_dir,
            per_example_loss=self.compute_per_example_loss,
            crt_schedule=args.crt_schedule,
            crt_public_column=args.crt_public_column,
            crt_public_batch_size=args.crt_public_batch_size,
        )
        self.dp.evaluation = evaluation
        evaluation.counted = self.eval_dataset  # counted above, before its marks were dropped
        self.dp.install(self, route_methods=False)

    @staticmethod
    def _resolve_plan(
        args: SecretProtectionConfig, train_dataset: Any, *, secrets: Any, plan: Any, tokenizer: Any = None
    ) -> tuple[ProtectionPlan, Any]:
        sources = {
            "plan": plan,
            "secrets": secrets,
            "args.plan_file": args.plan_file,
            "args.secrets_file": args.secrets_file,
        }
        given = [name for name, value in sources.items() if value is not None]
        if len(given) != 1:
            raise ValueError(
                "SecretProtectionTrainer needs exactly one of secrets=, plan=, args.secrets_file or "
                f"args.plan_file; got {given or 'none'}"
            )
        if plan is not None or args.plan_file is not None:
            resolved = load_plan(plan if plan is not None else args.plan_file)
            check_expected_batch_size(resolved, args.expected_batch_size)  # rows and T: in install()
            return resolved, prepare_secret_ids(train_dataset, plan=resolved, tokenizer=tokenizer)
        world_size = args.world_size  # also joins the process group of a distributed launch
        batch = args.expected_batch_size
        if batch is None:
            batch = args.per_device_train_batch_size * world_size
            logger.info("expected_batch_size B = per_device_train_batch_size * world_size = %g", batch)
        secret_set = load_secrets(secrets if secrets is not None else args.secrets_file)
        train_dataset = prepare_secret_ids(
            train_dataset, secret_set=secret_set, text_column=args.secrets_text_column, tokenizer=tokenizer
        )
        # One plan for all ranks: solved on rank 0 (an LP solver need not be deterministic), then shared.
        resolved = None
        if rank_and_world_size()[0] == 0:
            resolved = plan_for_dataset(
                train_dataset,
                secret_set,
                expected_batch_size=batch,
                steps=args.max_steps,
                lp_c=args.lp_c,
                accountant=args.accountant,
                allow_unmatched=args.allow_unmatched_secrets,
            )
        resolved = broadcast_object(resolved)
        return resolved, train_dataset

    # -------------------------------------------------------------------- the DP step
    def compute_per_example_loss(self, model: nn.Module, inputs: dict[str, Any]) -> Tensor:
        """loss_i per example, shape (b,) (default: mean token cross-entropy, masked or causal LM).

        One forward of ``model`` on ``inputs`` (labels included); each loss_i must depend on example i only
        (checked at the first step: see :mod:`hush_hf.trainer.independence`).
        """
        return lm_per_example_loss(model, inputs)

    # The Trainer methods the DP step takes over (train, training_step, log, save_model, push_to_hub, ...)
    # are defined from the table in trainer/routing.py by @define_routes, the same table that
    # GhostClippingCallback.attach applies to a plain Trainer.

    def write_protection_artifacts(self, output_dir: str | Path, **kwargs: Any) -> dict[str, Path]:
        """README.md card section, hush_plan.json and privacy_report.{json,md,png} (see hush_hf.audit),
        beside the weights already saved in ``output_dir`` (``save_model`` and ``push_to_hub`` write them
        too).

        The plan written carries the training record: the sigma used, the DP steps the weights went
        through (``trainer.state.global_step``, CRT public steps apart) and the weights' digests. Every
        bound stated is recomputed at them (``self.dp.verification``, made when training was set up,
        is reused when the run took the plan's T steps); none is read from the plan file. Refused: weight
        files in ``output_dir`` that no ``save_model``/``push_to_hub`` of this trainer wrote (the record
        would certify them), and, once written, a text file there that spells one of the secrets.
        """
        what = "write_protection_artifacts"
        if self.args.should_save:
            check_saved_by(self, output_dir, what)
        paths = self._write_protection_artifacts(output_dir, **kwargs)
        if self.args.should_save:
            secrets = self.dp.evaluation.secrets
            check_published_text(output_dir, published_text_files(output_dir), secrets, what)
        return paths

    def _write_protection_artifacts(self, output_dir: str | Path, **kwargs: Any) -> dict[str, Path]:
        """:meth:`write_protection_artifacts` without its checks: the saves run them around it."""
        return self.dp.write_protection_artifacts(
            output_dir, global_step=self.state.global_step, **{"crt": self.crt_report_section(), **kwargs}
        )

    #: Each secret's rows and unique occurrences for the report's CRT section (CRT Prop. 7), e.g.
    #: ``trainer.crt_occurrences = hush_hf.crt.occurrence_counts(text_dataset, secret_set)``.
    crt_occurrences: Any = None

    def crt_report_section(self) -> dict[str, Any] | None:
        """The report's CRT section: the CRT-mode counts, ``crt_occurrences`` and, with ``crt_recall``,
        CRT Thm. 8.3."""
        return self.dp.crt_report_section(
            recall=self.args.crt_recall,
            conservative_recall=self.args.crt_conservative_recall,
            occurrences=self.crt_occurrences,
        )
