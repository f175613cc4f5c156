"""Mixture-of-experts families mapped onto the MoE rules by ``rules_moe_families`` and ``rules_moe_dbrx``:
what the one-step family test (tests/test_model_families.py) cannot run, and what is refused.

PhiMoE samples each token's experts in training and differentiates through a custom autograd Function
that torch.func cannot run: its per-example norms and clipped sum are compared with one autograd.grad per
example's loss on the same batched forward (same seed, so the same draws). The refusals name the layer and
the fix.
"""

from __future__ import annotations

import pytest
import torch

from hush_hf.clipping import GhostClipper, UnsupportedLayerError, example_cross_entropy
from tests.model_families import FAMILIES, PHIMOE, VOCAB
from tests.test_clipping_moe import batch_of, reference
from tests.test_trainer_helpers import single_thread  # noqa: F401  (autouse fixture)


def test_phimoe_sampled_routing_matches_per_example_autograd_on_the_same_draws():
    """Training mode (Gumbel-sampled experts, Heun multiplier): float64, the clipper's norms and clipped sum
    equal per-example autograd of the same forward's losses; every expert weight trains, and a router (the
    first layer's gets an exactly zero gradient from transformers' multiplier here, in both)."""
    model = PHIMOE.build(False).double()
    assert model.training
    ids, clip = batch_of(size=4, length=10), 1e-3
    torch.manual_seed(7)
    norms, expected = reference(model, ids, clip)
    assert (norms > clip).all()
    with GhostClipper(model, clip) as clipper:
        torch.manual_seed(7)
        got = clipper.clipped_backward(example_cross_entropy(model(input_ids=ids).logits, ids, causal=True))
    torch.testing.assert_close(got, norms, rtol=1e-10, atol=0)
    named = dict(model.named_parameters())
    for name, value in expected.items():  # both clip with float32's margin (PhiMoE's softmax runs in float32)
        torch.testing.assert_close(named[name].grad, value, rtol=1e-9, atol=1e-12 * clip)
    experts = [n for n in named if "experts" in n]
    assert experts and all(named[n].grad.abs().sum() > 0 for n in experts)
    assert any(named[n].grad.abs().sum() > 0 for n in named if "router" in n)


def test_phimoe_input_jitter_is_refused():
    import transformers

    config = transformers.PhimoeConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=4, input_jitter_noise=0.01,
    )  # fmt: skip
    model = transformers.PhimoeForCausalLM(config)
    with pytest.raises(UnsupportedLayerError, match=r"'model\.layers\.0\.mlp'.*input_jitter_noise=0\.01"):
        GhostClipper(model, 1.0)


def test_jetmoe_experts_are_refused_with_the_reason():
    import transformers

    config = transformers.JetMoeConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_key_value_heads=2, kv_channels=8,
        intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    model = transformers.JetMoeForCausalLM(config)
    with pytest.raises(UnsupportedLayerError, match=r"\(JetMoeMo[EA]\).*gathered and sorted by expert"):
        GhostClipper(model, 1.0)


def test_qwen3_5_moe_linear_attention_parameters_are_refused_unless_frozen():
    (family,) = [f for f in FAMILIES if f.name == "Qwen3.5-MoE"]
    model = family.build(False)
    for p in model.parameters():
        p.requires_grad_(True)
    with pytest.raises(UnsupportedLayerError, match=r"'model\.layers\.0\.linear_attn'.*conv1d\.weight"):
        GhostClipper(model, 1.0)


def test_nllb_moe_capacity_routing_is_refused_with_the_reason():
    import transformers

    config = transformers.NllbMoeConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_experts=4, expert_capacity=2,
        encoder_sparse_step=1, decoder_sparse_step=1,
    )  # fmt: skip
    model = transformers.NllbMoeForConditionalGeneration(config)
    with pytest.raises(UnsupportedLayerError, match=r"\(NllbMoeSparseMLP\).*capacity, counted over all"):
        GhostClipper(model, 1.0)
