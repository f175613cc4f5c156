"""LayerNorm's per-example gradients in batches (``rule_batches``, ``rules_torch.layer_norm_batched``)
against one call at a time and a float64 autograd reference."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hush_hf.clipping.registry import LayerRule
from hush_hf.clipping.rule_batches import HeldCalls, footprint
from hush_hf.clipping.rules_torch import layer_norm_batched, layer_norm_grads


def _layer_norm(width: int, *, affine: bool = True, bias: bool = True, eps: float = 1e-5) -> nn.LayerNorm:
    layer = nn.LayerNorm(width, eps=eps, elementwise_affine=affine, bias=bias)
    if affine:
        with torch.no_grad():
            for p in layer.parameters():
                p.normal_()
    return layer


def _calls(dtype: torch.dtype) -> list[tuple[nn.LayerNorm, torch.Tensor, torch.Tensor]]:
    """Layers as a model has them: several of one shape (one group), another width, another eps, one
    without a bias, one with a 2-D input (no steps), interleaved."""
    torch.manual_seed(0)
    specs = [
        (_layer_norm(16), (3, 5, 16)),
        (_layer_norm(8), (3, 5, 8)),
        (_layer_norm(16), (3, 5, 16)),
        (_layer_norm(16, eps=1e-3), (3, 5, 16)),
        (_layer_norm(16, bias=False), (3, 5, 16)),
        (_layer_norm(16), (3, 16)),
        (_layer_norm(16), (3, 16)),
        (_layer_norm(16), (3, 5, 16)),
    ]
    return [(layer, torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)) for layer, shape in specs]


def _float64_reference(layer: nn.LayerNorm, x: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example gradients by autograd, one example at a time, in float64."""
    wide = {name: p.detach().double().requires_grad_() for name, p in layer.named_parameters()}
    found: dict[str, list[torch.Tensor]] = {name: [] for name in wide}
    for i in range(x.shape[0]):
        y = nn.functional.layer_norm(
            x[i].double(), layer.normalized_shape, wide.get("weight"), wide.get("bias"), layer.eps
        )
        grads = torch.autograd.grad((y * g[i].double()).sum(), list(wide.values()))
        for name, grad in zip(wide, grads, strict=True):
            found[name].append(grad)
    return {name: torch.stack(rows) for name, rows in found.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_layer_norm_gradients_equal_one_call_at_a_time_and_float64(dtype: torch.dtype) -> None:
    calls = _calls(dtype)
    batched = layer_norm_batched(calls)
    assert len(batched) == len(calls)
    for (layer, x, g), got in zip(calls, batched, strict=True):
        one = layer_norm_grads(layer, x, g)
        reference = _float64_reference(layer, x, g)
        assert sorted(got) == sorted(one) == sorted(reference)
        for name in one:
            assert got[name].values.dtype == torch.float32  # a bf16 layer's sums are not rounded back
            assert torch.equal(got[name].values, one[name].values)
            error = (got[name].values.double() - reference[name]).abs().max()
            assert error <= 1e-5 * reference[name].abs().max()


def _held_layer(layer: nn.LayerNorm, batches: list[int] | None) -> SimpleNamespace:
    """A hooked layer whose rule's batched form records the size of every batch it gets."""

    def batched(calls):
        batches.append(len(calls))  # type: ignore[union-attr]
        return layer_norm_batched(calls)

    rule = LayerRule(layer_norm_grads, batched=None if batches is None else batched)
    return SimpleNamespace(module=layer, rule=rule)


def test_held_calls_come_back_once_each_in_batches_within_the_budget() -> None:
    calls = _calls(torch.float32)
    sizes = [footprint(x, g) for _, x, g in calls]
    batches: list[int] = []
    layers = [_held_layer(layer, batches) for layer, _, _ in calls]
    layers[1] = _held_layer(calls[1][0], None)  # a rule without a batched form: evaluated at once
    held = HeldCalls(budget=sum(sizes[:4]))
    done = []
    for layer, (_, x, g) in zip(layers, calls, strict=True):
        got = held.run(layer, x, g)
        if layer is layers[1]:
            assert [d for d, _ in got] == [layer]
        done += got
    done += held.flush()
    assert held.flush() == []
    assert sorted(id(d) for d, _ in done) == sorted(id(layer) for layer in layers)
    assert len(batches) >= 2 and sum(batches) == len(calls) - 1  # the budget cut the held calls
    for layer, grads in done:
        k = layers.index(layer)
        one = layer_norm_grads(*calls[k])
        assert all(torch.equal(grads[name].values, one[name].values) for name in one)


def test_a_call_over_the_budget_is_evaluated_at_once_and_alone() -> None:
    layer, x, g = _calls(torch.float32)[0]
    batches: list[int] = []
    hooked = _held_layer(layer, batches)
    held = HeldCalls(budget=footprint(x, g) - 1)
    got = held.run(hooked, x, g)
    assert [d for d, _ in got] == [hooked] and batches == [] and held.flush() == []
