"""The loss and positions follow what the model computes, through wrappers; LoRA saves its adapter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hush_hf.clipping import GhostClipper
from hush_hf.trainer import SecretProtectionTrainer
from hush_hf.trainer.losses import loss_kind, model_inputs
from tests.model_families import FAMILIES
from tests.test_trainer_helpers import (
    dp_config,
    make_plan,
    pad_collate,
    single_thread,  # noqa: F401  (autouse fixture)
    token_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")
BY_NAME = {f.name: f for f in FAMILIES}


class Wrapped(nn.Module):
    """Stands for DDP / DataParallel: the model sits in ``.module``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


@pytest.mark.parametrize(
    ("name", "kind"),
    [("Llama + LoRA (peft)", "causal"), ("GPT-2 + LoRA (peft)", "causal"), ("BERT (MLM)", "masked"),
     ("T5", "seq2seq"), ("OPT", "causal")],
)  # fmt: skip
def test_loss_kind_is_read_through_wrappers(name: str, kind: str) -> None:
    model = BY_NAME[name].build(True)
    assert loss_kind(model) == kind
    assert loss_kind(Wrapped(model)) == kind


def test_non_language_model_loss_is_refused() -> None:
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=8))  # fmt: skip
    with pytest.raises(ValueError, match="ForSequenceClassification loss.*per_example_loss="):
        loss_kind(model)


def test_a_model_loss_returned_in_bf16_is_checked_up_to_its_own_rounding() -> None:
    """FSDP2 under bf16 mixed precision casts the model's outputs, its loss among them, to bf16 (rounding
    of up to 2^-9 relative, above the 1e-4 the float32 check allows): the first batch's check accepts the
    bf16 loss of the right scoring and still refuses the wrong one (masked scoring of a causal LM)."""
    from hush_hf.clipping import example_cross_entropy
    from hush_hf.trainer.losses import _check_against_model_loss

    model = BY_NAME["Llama"].build(True)
    ids = torch.randint(3, 90, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    losses = example_cross_entropy(out.logits, ids, causal=True)
    counts = torch.full((3,), 8)
    rounded = out.loss.to(torch.bfloat16)
    gap = abs(float(rounded) - float(out.loss)) / float(out.loss)
    assert 1e-4 < gap < 2.0**-8  # what the bf16 cast of this loss costs
    assert _check_against_model_loss(model, rounded, losses, counts)
    assert _check_against_model_loss(model, out.loss, losses, counts)
    wrong = example_cross_entropy(out.logits, ids, causal=False)
    with pytest.raises(ValueError, match="does not add up to the model's own loss"):
        _check_against_model_loss(model, rounded, wrong, torch.full((3,), 9))


def test_positions_are_the_models_own() -> None:
    ids = torch.randint(3, 90, (3, 6))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    roberta = BY_NAME["RoBERTa (MLM)"].build(True)  # derives positions from input_ids itself
    assert "position_ids" not in model_inputs(roberta, batch, torch.device("cpu"))
    gpt2 = BY_NAME["GPT-2"].build(True)  # shares (1, seq) positions: passed per row
    passed = model_inputs(gpt2, batch, torch.device("cpu"))["position_ids"]
    assert torch.equal(passed, torch.arange(6).repeat(3, 1))


def test_lora_trains_only_adapters_and_saves_the_adapter_with_the_card(tmp_path) -> None:
    model = BY_NAME["Llama + LoRA (peft)"].build(True)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0, rows=token_dataset(8, vocab=90))
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(tmp_path, max_steps=2, per_device_train_batch_size=4),
        train_dataset=plan.attach(token_dataset(8, vocab=90)),
        data_collator=pad_collate,
        plan=plan,
    )
    with GhostClipper(model, 1.0) as clipper:  # the frozen base gets no hook: no per-example work
        assert clipper._layers and all(".lora_" in layer.path for layer in clipper._layers)
    trainer.train()
    for n, p in model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen[n]), n
    trainer.save_model(str(tmp_path / "final"))
    saved = {p.name for p in (tmp_path / "final").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "hush_plan.json", "README.md"} <= saved
    assert "model.safetensors" not in saved
    assert "Secret protection" in (tmp_path / "final" / "README.md").read_text()
