"""A bf16/fp16 parameter's clipped sum stays in float32 until the noise is added (clipped_sums.py).

The sensitivity argument is about S = sum_i c_i g_i itself: adding one example moves S by at most C.
Rounded to bf16 it does not hold: each entry moves by up to 2^-9 |S_j|, i.e. about 2^-9 B C in norm.
The measurement below is written in the test: with B = 2048 aligned examples the bf16-rounded sums of
two neighbouring batches differ by several C, while the float32 sums the engine keeps differ by <= C.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hush_hf.clipping import GhostClipper, clipped_sums
from hush_hf.trainer.noise import noise_generator, privatize_gradients_
from tests.test_trainer_helpers import single_thread  # noqa: F401  (autouse fixture)

CLIP = 1.0


def bf16_linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(32, 16, bias=False).to(torch.bfloat16)


def batch(n: int, extra: bool) -> torch.Tensor:
    """``n`` nearly aligned inputs (their clipped gradients add up to ~n C), plus one random one."""
    generator = torch.Generator().manual_seed(1)
    direction = torch.randn(32, generator=generator)
    rows = direction + 0.05 * torch.randn(n, 32, generator=generator)
    if extra:
        rows = torch.cat([rows, 3.0 * torch.randn(1, 32, generator=generator)])
    return rows.to(torch.bfloat16)


def clipped_sum_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    (p,) = model.parameters()
    clipped_sums.discard_([p])
    with GhostClipper(model, CLIP) as clipper:
        loss = model(x).float().pow(2).sum(dim=1)  # every example's gradient norm is far above C
        norms = clipper.clipped_backward(loss)
    assert bool((norms > 10 * CLIP).all())
    return clipped_sums.clipped_sum(p)


def test_bf16_clipped_sum_is_float32_and_p_grad_is_untouched():
    model = bf16_linear()
    total = clipped_sum_of(model, batch(64, extra=False))
    (p,) = model.parameters()
    assert total.dtype == torch.float32 and total.shape == p.shape
    assert p.grad is None  # written only after the noise


def test_adding_one_example_moves_the_pre_noise_sum_by_at_most_c():
    model = bf16_linear()
    without = clipped_sum_of(model, batch(2048, extra=False)).clone()
    with_one = clipped_sum_of(model, batch(2048, extra=True)).clone()
    moved = float((with_one - without).double().norm())
    assert moved <= CLIP * (1 + 1e-3)
    assert moved >= CLIP * (1 - 2 * 2.0**-6) * 0.99  # the extra example is clipped, not lost
    # What rounding the sum to bf16 before the noise (the old p.grad) would have done: several C.
    rounded = float((with_one.to(torch.bfloat16).double() - without.to(torch.bfloat16).double()).norm())
    assert rounded > 2 * CLIP


def test_micro_batches_accumulate_in_float32():
    model = bf16_linear()
    (p,) = model.parameters()
    x = batch(256, extra=False)
    whole = clipped_sum_of(model, x).clone()
    clipped_sums.discard_([p])
    with GhostClipper(model, CLIP) as clipper:
        for part in x.split(64):
            clipper.clipped_backward(model(part).float().pow(2).sum(dim=1))
    parts = clipped_sums.clipped_sum(p)
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-5 * CLIP)


def test_noise_is_added_to_the_float32_sum_and_rounded_once():
    model = bf16_linear()
    (p,) = model.parameters()
    total = clipped_sum_of(model, batch(512, extra=False)).clone()
    privatize_gradients_(
        [p], noise_multiplier=0.7, clip_norm=CLIP, expected_batch_size=512.0, dp_seed=3, step=5
    )
    noise = torch.randn(p.shape, generator=noise_generator(3, 5, p.device, 0), dtype=torch.float32)
    expected = ((total + 0.7 * CLIP * noise) / 512.0).to(torch.bfloat16)
    assert p.grad.dtype == torch.bfloat16
    assert torch.equal(p.grad, expected)
    assert clipped_sums.clipped_sum(p) is p.grad  # the float32 copy is freed


def test_a_foreign_gradient_beside_a_clipped_sum_is_refused():
    model = bf16_linear()
    (p,) = model.parameters()
    clipped_sum_of(model, batch(8, extra=False))
    p.grad = torch.ones_like(p)  # e.g. a plain backward() that ran outside the DP step
    with pytest.raises(RuntimeError, match="not come from the clipping engine"):
        privatize_gradients_(
            [p], noise_multiplier=1.0, clip_norm=CLIP, expected_batch_size=8.0, dp_seed=1, step=0
        )


def test_float32_parameters_accumulate_in_p_grad():
    torch.manual_seed(0)
    model = nn.Linear(32, 16, bias=False)
    with GhostClipper(model, CLIP) as clipper:
        clipper.clipped_backward(model(batch(8, extra=False).float()).pow(2).sum(dim=1))
    (p,) = model.parameters()
    assert p.grad is not None and p.grad.dtype == torch.float32
    assert clipped_sums.clipped_sum(p) is p.grad


def test_trainer_on_a_bf16_model_noises_the_float32_sum_and_leaves_no_copy(tmp_path):
    """Through SecretProtectionTrainer (two micro-batches a step, every row drawn, sigma = 0): the
    gradient the optimizer gets is bf16, equals the float32 clipped sum / B rounded once (to bf16's
    rounding of that sum), and no float32 copy outlives the step."""
    import copy

    import numpy as np
    from transformers import TrainerCallback

    from hush_hf.clipping import example_cross_entropy
    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import dp_config, make_plan, pad_collate, sgd, tiny_gpt2, token_dataset

    n = 8
    model = tiny_gpt2(seed=0).to(torch.bfloat16)
    reference_model = copy.deepcopy(model)
    rows = token_dataset(n)
    plan = make_plan(np.ones(n), steps=1, noise_multiplier=0.0, secret_ids=[[] for _ in range(n)], rows=rows)
    seen: dict[str, torch.Tensor] = {}

    class GradientSpy(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            for name, p in model.named_parameters():
                assert not hasattr(p, "hush_clipped_sum"), name
                seen[name] = p.grad.clone()

    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(tmp_path, max_steps=1, per_device_train_batch_size=4, per_example_clip_norm=0.05),
        train_dataset=plan.attach(rows),
        data_collator=pad_collate,
        plan=plan,
        optimizers=sgd(model, lr=1.0),
        callbacks=[GradientSpy()],
    )
    trainer.train()
    params = list(reference_model.parameters())
    with GhostClipper(reference_model, 0.05) as clipper:
        for start in (0, 4):
            batch = pad_collate([rows[i] for i in range(start, start + 4)])
            positions = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
            logits = reference_model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=positions
            ).logits
            clipper.clipped_backward(example_cross_entropy(logits, batch["labels"], causal=True))
    for (name, _), p in zip(reference_model.named_parameters(), params, strict=True):
        expected = clipped_sums.clipped_sum(p) / n
        assert seen[name].dtype == torch.bfloat16
        torch.testing.assert_close(seen[name].float(), expected, rtol=2.0**-7, atol=1e-6)


def test_a_bf16_parameter_is_noised_in_float32_whatever_this_rank_drew():
    """Every rank must hand the all-reduce the same dtypes: a rank whose share never touched a bf16
    parameter (no clipped sum) still gives float32 zeros, and a .grad written outside the engine (a
    CRT public step's plain backward) is widened, then rounded back once."""
    untouched = nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    public = nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    public.grad = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    sums = clipped_sums.clipped_sums_for_noise([untouched, public])
    assert [s.dtype for s in sums] == [torch.float32, torch.float32]
    assert torch.equal(sums[0], torch.zeros(3)) and torch.equal(sums[1], torch.tensor([1.5, -2.0]))
    assert clipped_sums.clipped_sums_for_noise([untouched, public])[1] is sums[1]  # idempotent
    sums[1].div_(4.0)
    clipped_sums.round_into_grads_([untouched, public])
    assert public.grad.dtype == torch.bfloat16 and torch.equal(
        public.grad.float(), torch.tensor([0.375, -0.5])
    )
    assert torch.equal(untouched.grad, torch.zeros(3, dtype=torch.bfloat16))


def test_several_parameters_are_rounded_together_like_one_by_one():
    """``round_into_grads_`` rounds all bf16 sums with one foreach copy: the same numbers as ``.to``."""
    params = [nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16)) for shape in [(3, 5), (7,), (2, 2, 2)]]
    generator = torch.Generator().manual_seed(4)
    sums = [torch.randn(p.shape, generator=generator) * 1e3 for p in params]
    for p, s in zip(params, sums, strict=True):
        clipped_sums.accumulate_(p, s)
    clipped_sums.round_into_grads_(params)
    for p, s in zip(params, sums, strict=True):
        assert p.grad.dtype == torch.bfloat16 and p.grad.shape == p.shape
        assert torch.equal(p.grad, s.to(torch.bfloat16))
        assert clipped_sums.clipped_sum(p) is p.grad
