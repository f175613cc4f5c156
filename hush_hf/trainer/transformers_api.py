"""Every private member of transformers' ``Trainer`` that hush_hf uses, behind one adapter.

The DP step replaces three private methods (a guarantee depends on each: if Trainer stopped calling the
name replaced, the pre-noise gradient norm would be logged, or the token count gathered), and calls four
more. A transformers release that renames one would break DP training silently or late, so
:func:`check_trainer_api` refuses, when the trainer is set up, a transformers outside the supported range
or a ``Trainer`` lacking any of them. Nothing else in hush_hf touches a private ``Trainer`` member.
"""

from __future__ import annotations

from typing import Any

SUPPORTED_TRANSFORMERS = ((4, 56), (6, 0))
"""[lowest, first unsupported) major.minor of transformers (pyproject.toml: transformers>=4.56)."""

GRAD_NORM = "_get_grad_norm"
"""Returns the batch gradient norm, which Trainer logs before ``on_pre_optimizer_step`` (pre-noise)."""
NUM_ITEMS = "_get_num_items_in_batch"
"""Counts the tokens of the drawn batches (and all-gathers the count) for its loss normalisation."""
PUSH_FROM_CHECKPOINT = "_push_from_checkpoint"
"""``hub_strategy="every_save"``: uploads all of ``output_dir`` (trainer_state.json and runs/ included)."""

ROUTED = (GRAD_NORM, NUM_ITEMS, PUSH_FROM_CHECKPOINT)
CALLED = ("_remove_unused_columns", "_get_collator_with_removed_columns", "_save", "_finish_current_push")


def check_trainer_api(trainer: Any) -> None:
    """ValueError naming the transformers version or the missing member when the adapter cannot hold."""
    import transformers
    from packaging.version import Version

    parsed = Version(transformers.__version__)
    version = (parsed.major, parsed.minor)
    low, high = SUPPORTED_TRANSFORMERS
    if not low <= version < high:
        raise ValueError(
            f"transformers {transformers.__version__} is not supported by hush_hf's DP step (supported: "
            f">= {low[0]}.{low[1]}, < {high[0]}.{high[1]}): it replaces private Trainer methods whose "
            "names and calls may have changed; install a supported transformers"
        )
    missing = [name for name in (*ROUTED, *CALLED) if not callable(getattr(trainer, name, None))]
    if missing:
        raise ValueError(
            f"{type(trainer).__name__} (transformers {transformers.__version__}) has no "
            f"{', '.join(missing)}: "
            "the DP step relies on these Trainer members to keep the pre-noise gradient out of the logs; "
            "install a transformers release hush_hf supports"
        )


def remove_unused_columns(trainer: Any, dataset: Any) -> Any:
    """``dataset`` without the columns the model's forward does not take (``Trainer`` does it likewise)."""
    return trainer._remove_unused_columns(dataset, description="training")


def collator_with_removed_columns(trainer: Any, collate_fn: Any) -> Any:
    """``collate_fn`` dropping the unused columns of each row (for datasets without column names)."""
    return trainer._get_collator_with_removed_columns(collate_fn, description="training")


def save_weights(trainer: Any, output_dir: str, state_dict: Any) -> None:
    """Trainer's own save of the model files (no checkpoint bookkeeping)."""
    trainer._save(output_dir, state_dict=state_dict)


def finish_current_push(trainer: Any) -> None:
    """Wait for Trainer's pending asynchronous push, if any."""
    trainer._finish_current_push()
