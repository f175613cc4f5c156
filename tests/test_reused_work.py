"""Work the demo does once instead of per run, against doing it again: FrozenEncoderTestLoss (the cached
encoder states give exactly mean_token_loss's float, for the model they came from and for models whose head
alone changed; any other model gets the full forward) and copied_builds (the same weights and random states
as building again)."""

from __future__ import annotations

import copy

import pytest
import torch

from hush_hf import experiments as ex
from hush_hf.trainer.masked_positions import BertForMaskedPositionsLM, masked_positions_loss


def tiny_bert(seed: int = 0) -> BertForMaskedPositionsLM:
    from transformers import BertConfig

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.3,
                        attention_probs_dropout_prob=0.3)  # dropout on: evaluation must switch it off
    model = BertForMaskedPositionsLM(config)
    head = {id(p) for p in model.cls.parameters()} - {id(model.bert.embeddings.word_embeddings.weight)}
    for p in model.parameters():
        p.requires_grad_(id(p) in head)  # the recipe's trainable="head"
    return model.train()


def mlm_batches(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Padded MLM batches as DataCollatorForLanguageModeling gives them (no position_ids)."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for b, length in ((4, 10), (3, 7), (1, 5)):
        ids = torch.randint(5, 60, (b, length), generator=generator)
        attention = torch.ones(b, length, dtype=torch.long)
        attention[0, length - 3:] = 0
        masked = torch.rand(b, length, generator=generator) < 0.4
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        labels[0, length - 3:] = -100
        labels[-1, 1] = ids[-1, 1]  # at least one target per batch
        batches.append({"input_ids": ids, "attention_mask": attention, "labels": labels})
    return batches


def full_forward(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> float:
    return ex.mean_token_loss(model, batches, masked_positions_loss, causal=False)


def test_cached_loss_equals_the_full_forward_bit_for_bit_for_the_model_and_a_retrained_head():
    model, batches = tiny_bert(), mlm_batches()
    loss = ex.FrozenEncoderTestLoss(model, batches)
    assert model.training  # left as it was
    assert loss(model) == full_forward(model, batches)
    trained = copy.deepcopy(model)  # what a run with trainable="head" changes: the head only
    trained.config.use_cache = False  # and transformers' Trainer sets this on the model it trains
    with torch.no_grad():
        for p in trained.parameters():
            if p.requires_grad:
                p.add_(0.5 * torch.randn_like(p))
    assert loss(trained) == full_forward(trained, batches) != full_forward(model, batches)
    assert loss.cached == 2 and trained.training


def test_a_changed_encoder_is_scored_by_the_full_forward_not_the_stale_states():
    model, batches = tiny_bert(), mlm_batches(1)
    loss = ex.FrozenEncoderTestLoss(model, batches)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.bert.encoder.layer[1].output.dense.weight[0, 0] += 1e-3  # one encoder weight
    stale = ex.FrozenEncoderTestLoss(model, batches)
    stale.same_encoder = lambda _: True  # what the cache would give without the check
    assert loss(changed) == full_forward(changed, batches) != stale(changed)
    assert loss.cached == 0
    dropout = copy.deepcopy(model)
    dropout.config.hidden_dropout_prob = 0.0  # a config field the encoder's forward reads: not the same model
    assert not loss.same_encoder(dropout)
    other = tiny_bert(seed=1)  # another initialisation of the same class and config
    assert not loss.same_encoder(other) and loss(other) == full_forward(other, batches)
    assert loss.same_encoder(model)
    loss.device = torch.device("meta")  # states from another device (a GPU's kernels round differently)
    assert not loss.same_encoder(model) and loss(model) == full_forward(model, batches) and loss.cached == 0


def test_only_a_masked_positions_bert_is_cached():
    from transformers import BertForMaskedLM

    with pytest.raises(ValueError, match="BertForMaskedPositionsLM"):
        ex.FrozenEncoderTestLoss(BertForMaskedLM(tiny_bert().config), mlm_batches())



def test_copied_builds_give_what_building_again_gives_weights_and_random_states():
    import random

    import numpy as np
    from transformers import set_seed

    def build() -> BertForMaskedPositionsLM:
        set_seed(3)
        return tiny_bert(seed=3)  # draws its initialisation from torch's generator

    def after(model: torch.nn.Module) -> tuple:
        """The weights, flags, tying, mode, and what each generator draws next."""
        tied = model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
        return ({k: v.clone() for k, v in model.state_dict().items()},
                [p.requires_grad for p in model.parameters()], tied, model.training,
                random.random(), float(np.random.rand()), torch.rand(3).tolist())

    def same(found: tuple, expected: tuple) -> bool:
        return found[0].keys() == expected[0].keys() and all(
            torch.equal(found[0][k], v) for k, v in expected[0].items()) and found[1:] == expected[1:]

    expected = after(build())
    assert same(after(build()), expected)  # the premise: build() seeds what it draws from
    built = ex.copied_builds(build)
    first = built()
    assert same(after(first), expected)
    with torch.no_grad():
        first.cls.predictions.bias.add_(1.0)  # a run trains its model in place
    random.seed(9), np.random.seed(9), torch.manual_seed(9)  # and draws from every generator
    for _ in range(2):
        model = built()
        assert model is not first and same(after(model), expected)
