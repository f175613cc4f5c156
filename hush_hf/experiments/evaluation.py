"""Scoring trained models: the corpus-level token loss on fixed batches."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from hush_hf.experiments.checks import check_int

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
    per_example_loss: PerExampleLoss | None = None,
    *,
    causal: bool,
) -> float:
    """Token-weighted mean cross-entropy: sum_i n_i loss_i / sum_i n_i over every target token.

    ``loss_i`` is ``per_example_loss`` (a mean over example i's n_i target tokens; default: the DP
    step's own per-example language-modelling loss), so this is the corpus-level loss transformers
    reports, independent of how the rows are batched.
    """
    from hush_hf.trainer.losses import lm_per_example_loss, model_inputs

    per_example_loss = per_example_loss or lm_per_example_loss
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        return token_weighted_mean(
            (per_example_loss(model, model_inputs(model, batch, device)), targets(batch["labels"], causal))
            for batch in batches
        )
    finally:
        model.train(was_training)


def targets(labels: torch.Tensor, causal: bool) -> torch.Tensor:
    """The labels a loss scores: ``labels[:, 1:]`` for a causal LM (token t+1 from position t), else all."""
    return labels[:, 1:] if causal else labels


def token_weighted_mean(losses_and_labels: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """sum_i n_i loss_i / sum_i n_i over (per-example losses, their :func:`targets`) of every batch; n_i:
    example i's targets other than -100; sums in float64."""
    total, tokens = 0.0, 0
    for losses, targets in losses_and_labels:
        n = (targets != -100).sum(dim=1)
        total += float((losses.double().cpu() * n.double()).sum())
        tokens += int(n.sum())
    if tokens == 0:
        raise ValueError("the evaluation set has no target tokens")
    return total / tokens
