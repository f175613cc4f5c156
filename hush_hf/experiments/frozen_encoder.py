"""Test loss of masked LMs that share one frozen encoder: its evaluation-mode outputs computed once.

With ``trainable="head"`` every run of a recipe starts from the same pretrained encoder and trains only
the MLM head, so in evaluation mode (no dropout) the encoder maps the fixed test batches to the same
hidden states after every run; only the head differs. :class:`FrozenEncoderTestLoss` computes those
states once, at the masked positions (all the head reads, ``BertForMaskedPositionsLM.hidden_at``), and
runs only the head per model: the same operations on the same tensors as
``mean_token_loss(model, batches, masked_positions_loss, causal=False)``, so the same float, bit for bit
(tests/test_reused_work.py). A model whose encoder is not exactly the one the states came from (class,
config, any parameter or buffer) is scored by the full forward instead. Training is untouched: its
forwards run in training mode, with dropout, and are never cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hush_hf.experiments.evaluation import mean_token_loss, targets, token_weighted_mean

# Config fields that never change the encoder's hidden states: ``use_cache`` only says whether a decoder
# returns its key/value cache, and transformers' Trainer sets it to False on the model it trains.
OUTPUT_NEUTRAL_CONFIG = ("use_cache",)


def _config(model: Any) -> dict[str, Any]:
    return {k: v for k, v in model.config.to_dict().items() if k not in OUTPUT_NEUTRAL_CONFIG}


class FrozenEncoderTestLoss:
    """``loss(model)`` = ``mean_token_loss(model, batches, masked_positions_loss, causal=False)`` for a
    ``BertForMaskedPositionsLM``; the encoder runs once, on ``model``'s encoder, here."""

    def __init__(self, model: Any, batches: Sequence[dict[str, Any]]) -> None:
        from hush_hf.trainer import BertForMaskedPositionsLM
        from hush_hf.trainer.losses import model_inputs
        from hush_hf.trainer.masked_positions import labelled_positions

        if not isinstance(model, BertForMaskedPositionsLM):
            raise ValueError(f"model must be a BertForMaskedPositionsLM, got {type(model).__name__}")
        self.batches = batches
        self.model_class, self.config = type(model), _config(model)
        self.encoder_state = {k: v.detach().clone() for k, v in model.bert.state_dict().items()}
        self.cached = 0  # models scored from the cached states (the others by the full forward)
        was_training = model.training
        model.eval()
        device = self.device = next(model.parameters()).device
        self.head_inputs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (hidden at positions, labels)
        try:
            with torch.no_grad():
                for batch in batches:
                    inputs = model_inputs(model, batch, device)  # as masked_positions_loss gets them
                    positions, labels = labelled_positions(inputs.pop("labels"))
                    hidden = model.hidden_at(**inputs, prediction_positions=positions)
                    self.head_inputs.append((hidden, labels.to(hidden.device)))
        finally:
            model.train(was_training)

    def same_encoder(self, model: Any) -> bool:
        """Whether ``model``'s encoder is exactly the one the cached states came from, on the same device
        (another device's kernels round differently: e.g. the trained copy of a model built on the CPU)."""
        same_place = next(model.parameters()).device == self.device
        if type(model) is not self.model_class or _config(model) != self.config or not same_place:
            return False
        state = model.bert.state_dict()
        return state.keys() == self.encoder_state.keys() and all(
            (state[k].dtype, state[k].shape, state[k].device) == (v.dtype, v.shape, v.device)
            and torch.equal(state[k], v)
            for k, v in self.encoder_state.items()
        )

    @torch.no_grad()
    def __call__(self, model: Any) -> float:
        from hush_hf.clipping import example_cross_entropy
        from hush_hf.trainer.masked_positions import masked_positions_loss

        if not self.same_encoder(model):
            return mean_token_loss(model, self.batches, masked_positions_loss, causal=False)
        was_training = model.training
        model.eval()
        try:
            loss = token_weighted_mean(
                (example_cross_entropy(model.cls(hidden), labels, causal=False),
                 targets(batch["labels"], False))
                for (hidden, labels), batch in zip(self.head_inputs, self.batches, strict=True)
            )
        finally:
            model.train(was_training)
        self.cached += 1
        return loss
