"""Llama's RMSNorm rule (``rules_rms_norm``): per-example weight gradients against independent references
(torch.func in float64; the forward's own bf16 normalised values in bf16), and which classes share it."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, vmap

import hush_hf.clipping  # noqa: F401  (registers the rules)
from hush_hf.clipping.registry import rule_for
from hush_hf.clipping.rules_rms_norm import llama_rms_norm_grads, rounded_rms_normalised, saved_normalised

modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")


def norm_layer(dtype: torch.dtype, width: int = 24) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = modeling_llama.LlamaRMSNorm(width, eps=1e-5)
    with torch.no_grad():
        layer.weight.copy_(1.0 + 0.3 * torch.randn(width))
    return layer.to(dtype)


def test_float64_matches_torch_func_per_example_gradients():
    layer = norm_layer(torch.float64)
    x = 3.0 * torch.randn(5, 7, 24, dtype=torch.float64)
    g = torch.randn(5, 7, 24, dtype=torch.float64)

    def contribution(weight, x_row, g_row):
        out = functional_call(layer, {"weight": weight}, (x_row[None],))
        return (out[0] * g_row).sum()

    expected = vmap(grad(contribution), in_dims=(None, 0, 0))(layer.weight.detach(), x, g)
    got = llama_rms_norm_grads(layer, x, g)["weight"].values
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_bf16_uses_the_forwards_rounded_values_and_sums_them_in_float32():
    """The forward rounds its float32 ``xhat`` to bf16 before the weight multiplies it; the rule's
    per-example gradient is sum_t xhat_t * g_t of exactly those bf16 values, not rounded again."""
    layer = norm_layer(torch.bfloat16)
    x = (3.0 * torch.randn(4, 9, 24)).to(torch.bfloat16)
    g = torch.randn(4, 9, 24).to(torch.bfloat16)
    with torch.no_grad():
        unit = norm_layer(torch.bfloat16)
        unit.weight.fill_(1.0)  # 1 * xhat is exact: the forward's own rounded xhat
        xhat = unit(x)
    expected = (xhat.double() * g.double()).sum(dim=1)
    got = llama_rms_norm_grads(layer, x, g)["weight"].values
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
    # A bf16 sum (what the generic path returned for a bf16 weight) would be coarser than this.
    assert not torch.equal(got, got.to(torch.bfloat16).float())


def test_the_rule_serves_llama_and_the_classes_with_its_forward_only():
    rule = rule_for(modeling_llama.LlamaRMSNorm)
    assert rule is not None and rule.grads is llama_rms_norm_grads
    qwen2 = pytest.importorskip("transformers.models.qwen2.modeling_qwen2")
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    assert rule_for(qwen2.Qwen2RMSNorm) is rule  # the same forward code
    assert rule_for(t5.T5LayerNorm) is not rule  # a different forward (no rounding back, weight-dtype cast)


def test_the_forward_hook_takes_the_forwards_own_xhat_and_the_rule_agrees_with_recomputing_it():
    layer = norm_layer(torch.bfloat16)
    x = (3.0 * torch.randn(4, 9, 24)).to(torch.bfloat16).requires_grad_()
    g = torch.randn(4, 9, 24).to(torch.bfloat16)
    saved = saved_normalised(layer, x.detach(), layer(x))
    assert saved is not None
    assert torch.equal(saved.values, rounded_rms_normalised(x.detach(), layer.variance_epsilon))
    from_saved = llama_rms_norm_grads(layer, saved, g)["weight"].values
    assert torch.equal(from_saved, llama_rms_norm_grads(layer, x.detach(), g)["weight"].values)


def test_an_output_made_otherwise_gives_the_rule_the_input():
    layer = norm_layer(torch.float32)
    x = torch.randn(2, 5, 24, requires_grad=True)
    assert saved_normalised(layer, x.detach(), x * layer.weight) is None  # the weight is not `self`
    assert saved_normalised(layer, x.detach(), layer(x) + 0.0) is None  # not the multiplication itself
    layer.weight.requires_grad_(False)
    assert saved_normalised(layer, x.detach(), layer(x)) is None  # nothing saved for the weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_calls_equal_one_call_at_a_time_and_the_forwards_values(dtype: torch.dtype):
    """``llama_rms_norm_batched``: calls with the forward's saved ``xhat`` of one shape stacked, the others
    (no saved value, another length) one at a time; every call's gradient as one call at a time gives it,
    and sum_t xhat_t * g_t of the forward's own values in float64."""
    from hush_hf.clipping.rules_rms_norm import llama_rms_norm_batched

    assert rule_for(modeling_llama.LlamaRMSNorm).batched is llama_rms_norm_batched
    calls, expected = [], []
    for k, steps in enumerate([7, 7, 5, 7, 7]):
        layer = norm_layer(dtype)
        x = (3.0 * torch.randn(4, steps, 24)).to(dtype).requires_grad_()
        out = layer(x)
        saved = saved_normalised(layer, x.detach(), out)
        assert saved is not None
        g = torch.randn(4, steps, 24).to(dtype)
        expected.append((saved.values.double() * g.double()).sum(dim=1))
        calls.append((layer, x.detach() if k == 3 else saved, g))  # call 3: recomputes xhat
    got = llama_rms_norm_batched(calls)
    for call, grads, reference in zip(calls, got, expected, strict=True):
        one = llama_rms_norm_grads(*call)["weight"].values
        assert grads["weight"].values.dtype == torch.float32
        assert torch.equal(grads["weight"].values, one)
        torch.testing.assert_close(grads["weight"].values.double(), reference, rtol=1e-6, atol=1e-6)
