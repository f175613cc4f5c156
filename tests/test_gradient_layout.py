"""Every gradient the engine hands the optimizer is laid out as its parameter.

Autograd lays ``p.grad`` out with p's strides, and CUDA's fused AdamW (``Trainer``'s default optimizer
there) refuses a gradient whose strides differ: "params, grads, exp_avgs, and exp_avg_sqs must have same
dtype, device, and layout". On an H200, ``SecretProtectionTrainer(bf16=True)`` failed so: the clipped
sum of a bf16 x bf16 product (CUDA's route, ``float32_products._weighted_product_bf16``) came back as a
transposed view for weights whose output side is the narrower one. The CPU takes that route only when
told to (``factors.bf16_products``, as ``tests/test_clipping_factors.py`` does); then every clipped sum,
and every gradient after the noise, must still have its parameter's strides.
"""

from __future__ import annotations

import pytest
import torch

import hush_hf.clipping.factors as factors
from hush_hf.clipping import GhostClipper, example_cross_entropy
from hush_hf.clipping.clipped_sums import accumulate_, clipped_sum
from hush_hf.trainer.noise import privatize_gradients_
from tests.model_families import VOCAB, family_named

CASES = [("GPT-2", False), ("Llama", False), ("BERT (MLM)", True)]


def one_step(name: str, tied: bool, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    family = family_named(name)
    model = family.build(tied).to(dtype)
    causal = family.kind != "masked"
    ids = torch.randint(3, VOCAB, (4, 12), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    if not causal:
        labels[:, 1::2] = -100
    position_ids = torch.arange(12).expand(4, 12).contiguous()
    with GhostClipper(model, 1.0) as clipper:
        for _ in range(2):  # the second call runs without the self-check
            # float32 weights: under bf16 autocast, as Trainer(bf16=True) runs them (bf16 factors)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.float32):
                logits = model(input_ids=ids, position_ids=position_ids).logits
            clipper.clipped_backward(example_cross_entropy(logits, labels, causal=causal))
    return model


def mislaid(model: torch.nn.Module, of) -> list[str]:
    return [n for n, p in model.named_parameters() if of(p) is not None and of(p).stride() != p.stride()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32-autocast-bf16", "bf16"])
@pytest.mark.parametrize(("name", "tied"), CASES, ids=[c[0] for c in CASES])
def test_clipped_sums_of_the_bf16_route_have_their_parameters_strides(
    name: str, tied: bool, dtype: torch.dtype, monkeypatch
) -> None:
    monkeypatch.setattr(factors, "bf16_products", lambda a, b: True)  # CUDA's route for bf16 factors
    model = one_step(name, tied, dtype)
    reached = [p for p in model.parameters() if clipped_sum(p) is not None]
    assert len(reached) == len(list(model.parameters()))
    assert mislaid(model, clipped_sum) == []
    params = list(model.parameters())
    privatize_gradients_(
        params, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=4.0, dp_seed=0, step=0
    )
    assert all(p.grad is not None and p.grad.dtype == p.dtype for p in params)
    assert mislaid(model, lambda p: p.grad) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_transposed_first_sum_is_laid_out_as_its_parameter_and_keeps_its_values(dtype) -> None:
    p = torch.nn.Parameter(torch.randn(5, 3, dtype=dtype))
    grad = torch.randn(3, 5).T  # float32, (5, 3) with strides (1, 5)
    accumulate_(p, grad, owned=True)
    held = clipped_sum(p)
    assert held.stride() == p.stride() and held.dtype == (torch.float32 if dtype == torch.bfloat16 else dtype)
    torch.testing.assert_close(held, grad.to(held.dtype), rtol=0, atol=0)
    accumulate_(p, grad)  # a later sum adds into the first one, in place
    assert clipped_sum(p) is held
    torch.testing.assert_close(held, (2 * grad).to(held.dtype), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("dtype", "device_type", "cut"),
    [(torch.bfloat16, "cuda", True), (torch.bfloat16, "cpu", False), (torch.float32, "cuda", False)],
)
def test_a_bf16_step_on_cuda_applies_the_cut_coefficients_to_every_parameter(dtype, device_type, cut) -> None:
    """Where the bf16 products' route runs (CUDA, a bf16 step), the step's clip coefficients are cut
    toward zero for every parameter alike, so the self-check compares at the weights the sums use; never
    above c_i, and 1 (an unclipped example) kept."""
    from hush_hf.clipping.float32_products import bf16_toward_zero
    from hush_hf.clipping.layer_calls import _Pass

    coef = torch.tensor([1.0, 0.3, 0.123456789, 2.0**-20 * 3.3], dtype=torch.float32)
    step = _Pass(torch.ones(4, dtype=torch.float64), {}, dtype, {}, device_type=device_type)
    applied = step.applied(coef)
    assert applied.dtype == coef.dtype and bool((applied <= coef).all()) and applied[0] == 1.0
    assert torch.equal(applied, bf16_toward_zero(coef) if cut else coef)
    assert cut == (not torch.equal(applied, coef))
