"""One training run: a plain ``Trainer`` (non-private) or a ``SecretProtectionTrainer`` with a plan."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hush_hf.data import SECRET_IDS_COLUMN
from hush_hf.experiments.arguments import non_private_config, run_config

# Columns the planning and redaction add to a dataset; the plain Trainer baseline must not see them.
NON_PRIVATE_DROPPED_COLUMNS = (SECRET_IDS_COLUMN, "crt_public")


def train_model(
    model: Any,
    config: Any,
    plan: Any,
    *,
    train: Any,
    collator: Any,
    run_dir: Path,
    trainer_class: type | None = None,
    **overrides: Any,
) -> tuple[Any, dict[str, Any]]:
    """Train ``model`` in place; returns the trainer and what the results record about the run.

    ``plan=None``: plain ``transformers.Trainer`` with batches of B (shuffled, no clipping, no noise).
    Otherwise ``trainer_class`` (default ``SecretProtectionTrainer``) with ``plan`` and the
    ``SecretProtectionConfig`` fields in ``overrides`` (e.g. ``noise_multiplier``, ``crt_schedule``).
    """
    from transformers import Trainer

    from hush_hf.trainer import SecretProtectionTrainer

    if plan is None:
        dropped = [c for c in NON_PRIVATE_DROPPED_COLUMNS if c in train.column_names]
        trainer = Trainer(
            model=model,
            args=non_private_config(config, run_dir),
            train_dataset=train.remove_columns(dropped),
            data_collator=collator,
        )
    else:
        trainer = (trainer_class or SecretProtectionTrainer)(
            model=model,
            args=run_config(config, run_dir, **overrides),
            train_dataset=train,
            data_collator=collator,
            # the collator's tokenizer: the trainer checks that the rows' tokens spell their tagged text
            processing_class=getattr(collator, "tokenizer", None),
            plan=plan.bound_to(train),  # planned from train's secret_ids
        )
    start, cpu_start = time.perf_counter(), time.process_time()
    result = trainer.train()
    return trainer, {
        "noise_multiplier": None if plan is None else trainer.dp.noise_multiplier,
        "train_loss": float(result.training_loss),
        "train_seconds": time.perf_counter() - start,
        "train_cpu_seconds": time.process_time() - cpu_start,
    }
