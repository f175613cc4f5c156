"""What the DP step feeds the model and which per-example loss it clips (Hush Alg. 2, line 9)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from hush_hf.clipping import per_example_lm_loss

PerExampleLoss = Callable[[nn.Module, dict[str, Any]], Tensor]

_CAUSAL_LM_CLASSES = frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def is_causal_lm(model: nn.Module) -> bool:
    """Whether the model predicts token t+1 at position t (transformers' causal-LM heads)."""
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    return type(model).__name__ in _CAUSAL_LM_CLASSES


def accepts_argument(model: nn.Module, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def model_inputs(model: nn.Module, batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """The micro-batch on ``device``, with per-row ``position_ids`` when the model takes them.

    Ghost clipping needs every layer with trainable parameters to see the batch in dimension 0;
    models build (1, seq) position ids by default, so contiguous (batch, seq) ids ``0..seq-1``
    (the models' own default positions) are passed explicitly.
    """
    inputs = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
    ids = inputs.get("input_ids")
    if (
        "position_ids" not in inputs
        and isinstance(ids, Tensor)
        and ids.dim() == 2
        and accepts_argument(model, "position_ids")
    ):
        b, length = ids.shape
        inputs["position_ids"] = torch.arange(length, device=ids.device).repeat(b, 1)
    return inputs


def lm_per_example_loss(model: nn.Module, inputs: dict[str, Any]) -> Tensor:
    """loss_i = mean over example i's target tokens (``per_example_lm_loss``), shape (b,).

    The model is called without ``labels`` (its own loss is a batch mean, not per example); causal
    LMs are scored on shifted labels like transformers' causal-LM loss.
    """
    if "labels" not in inputs:
        raise ValueError(
            "the training batch has no 'labels': use a data collator that adds them (e.g. "
            "DataCollatorForLanguageModeling) or pass per_example_loss= to compute a loss per example"
        )
    inputs = dict(inputs)
    labels = inputs.pop("labels")
    outputs = model(**inputs)
    logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs[0]
    return per_example_lm_loss(logits, labels, causal=is_causal_lm(model))
