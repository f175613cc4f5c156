"""``bench/step_roofline.py``: kernels' FLOPs and bytes, and a step's time extrapolated from shallow builds.

The script prices every kernel of a step at ``max(FLOPs / R, bytes / W)`` and extrapolates the step from 2
and 3 layers and batches of 2 and 3 to the GPU table's depth and batch. Checked here: the counts of known
kernels against their closed forms, and the extrapolation against a direct count of a 4-layer build at
batch 5 (smoke-size models, both steps), with FLOPs alone and bytes alone (each affine in both); the GPU's
norm route; and, for bf16 rows, fake products against real ones and a faked step against a computed one.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import step_roofline  # noqa: E402


def test_kernel_costs_count_a_products_flops_and_every_tensor_it_reads_and_writes() -> None:
    a, b = torch.randn(6, 5), torch.randn(5, 7)
    with step_roofline.KernelCosts() as costs:
        c = a @ b
        c.add_(1.0)  # in place: c read and written, counted once
        c.t()  # a view: no kernel
    assert costs.kernels == [(2 * 6 * 5 * 7, 4 * (6 * 5 + 5 * 7 + 6 * 7)), (0, 4 * 6 * 7)]


def test_a_reduction_into_a_wider_dtype_costs_the_copy_a_gpu_makes_first() -> None:
    """``sum(dtype=float64)`` of float32 converts its input on CUDA (read 4, write 8 bytes a value), then
    reads the copy; a bf16 input summed into float32 is read as it is."""
    x, h = torch.randn(10, 3), torch.randn(10, 3).bfloat16()
    with step_roofline.KernelCosts() as costs:
        x.sum(dim=1, dtype=torch.float64)
        h.sum(dim=1, dtype=torch.float32)
    assert costs.kernels == [(0, 30 * (4 + 8)), (0, 30 * 8 + 10 * 8), (0, 30 * 2 + 10 * 4)]


def test_the_rate_solved_gives_the_plain_steps_measured_time() -> None:
    kernels = [(10**9, 10**6)] * 10 + [(0, 10**8)] * 5
    plain = step_roofline.Extrapolated({key: kernels for key in ((2, 2), (2, 3), (3, 2), (3, 3))})
    rate = step_roofline.solve_rate(plain, 2, 2, 4e12, target=0.01)
    assert plain.at(2, 2, rate, 4e12) == pytest.approx(0.01, rel=1e-9)
    assert rate == pytest.approx(10 * 10**9 / (0.01 - 5 * 10**8 / 4e12), rel=1e-9)


@pytest.mark.parametrize("name", ["gpt2", "llama-1b-lora"])
@pytest.mark.parametrize("priced", ["flops", "bytes"])
def test_a_steps_time_is_extrapolated_exactly_in_depth_and_batch(name: str, priced: str, monkeypatch) -> None:
    monkeypatch.setattr(step_roofline, "LAUNCH_SECONDS", 0.0)
    rate, bandwidth = (1e12, math.inf) if priced == "flops" else (math.inf, 1e12)
    for contender in ("plain", "hush"):
        shallow = step_roofline.counted(name, contender, smoke=True)
        direct = step_roofline.seconds(
            step_roofline.step_costs(name, contender, 4, 5, smoke=True), rate, bandwidth
        )
        assert direct > 0
        assert shallow.at(4, 5, rate, bandwidth) == pytest.approx(direct, rel=1e-9), (contender, priced)


def test_gpu_routes_stream_a_kept_gradients_norm_in_four_kernels_where_a_cpu_chunks_it() -> None:
    """On this CPU a kept gradient's norm goes a cache-sized chunk at a time (a few kernels per chunk); the
    GPU's route streams it in four. The settings are put back after."""
    from hush_hf.clipping import factors
    from hush_hf.clipping.factors import Materialized, inner

    kept = Materialized(torch.randn(32, 64, 4096))  # 32 MiB of float32: 64 chunks on CPU
    with step_roofline.KernelCosts() as on_cpu:
        expected = inner(kept, kept)
    with step_roofline.gpu_routes(tf32=False), step_roofline.KernelCosts() as on_gpu:
        got = inner(kept, kept)
    assert len(on_gpu.kernels) == 4 < 64 < len(on_cpu.kernels)
    torch.testing.assert_close(got, expected, rtol=11.1 * 2.0**-24, atol=0)
    assert "cpu" in factors.CHUNKED_NORM_DEVICES  # put back
    assert factors.JOIN_BELOW == {"cpu": 2**12}


def test_gpu_routes_under_tf32_answer_an_engine_that_asks_the_matmul_precision(monkeypatch) -> None:
    """The tree the H200 measured chose routes by ``reduced_float32_matmuls``; the present engine does not
    ask it (its 5/4 band is the same under TF32), and nothing is patched in."""
    from hush_hf.clipping import factors

    assert not hasattr(factors, step_roofline.TF32_ROUTES)
    monkeypatch.setattr(factors, step_roofline.TF32_ROUTES, lambda device_type: False, raising=False)
    with step_roofline.gpu_routes(tf32=True):
        assert factors.reduced_float32_matmuls("cuda") is True
    assert factors.reduced_float32_matmuls("cuda") is False


@pytest.mark.parametrize(
    "op",
    [
        lambda: torch.randn(6, 5).bfloat16() @ torch.randn(5, 7).bfloat16(),
        lambda: torch.bmm(torch.randn(3, 6, 5), torch.randn(3, 7, 5).transpose(1, 2)),
        lambda: torch.addmm(torch.randn(7), torch.randn(6, 5), torch.randn(5, 7)),
        lambda: torch.nn.functional.scaled_dot_product_attention(*torch.randn(3, 2, 4, 16, 8).bfloat16()),
    ],
)
def test_a_fake_product_has_the_real_ones_shape_strides_dtype_and_price(op) -> None:
    with step_roofline.KernelCosts() as real_costs:
        real = op()
    with step_roofline.KernelCosts(fake=True) as fake_costs:
        fake = op()
    assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype)
    assert bool((fake == step_roofline.FAKE_VALUE).all())
    assert fake_costs.kernels == real_costs.kernels and fake_costs.names == real_costs.names


@pytest.mark.parametrize("name", ["gpt2-tied", "llama-1b-lora"])
def test_a_bf16_step_with_fake_products_dispatches_the_real_steps_kernels(name: str) -> None:
    """The engine's routes depend on sizes and on which steps carry a target, not on the products' values:
    with the self-check skipped in both, a bf16 step whose products are faked prices the same kernels as
    the step computed (smoke size, CPU routes)."""
    import op_census
    from step_flops import shallow_model

    found = {}
    for fake in (False, True):
        model, causal, seq = shallow_model(name, 2, smoke=True)
        step = op_census.step_of(model.to(torch.bfloat16).train(), causal, "hush", 2, seq)
        with step_roofline.unchecked(), step_roofline.gpu_routes(tf32=False):
            with step_roofline.KernelCosts(fake=fake):
                step(0)
            with step_roofline.KernelCosts(fake=fake) as costs:
                step(1)
        found[fake] = costs
    assert found[True].names == found[False].names
    assert found[True].kernels == found[False].kernels


def test_a_cuda_out_dtype_product_is_one_kernel_of_bf16_operands_and_a_float32_output() -> None:
    a, b = torch.randn(4, 6, 5).bfloat16(), torch.randn(4, 5, 7).bfloat16()
    with step_roofline.KernelCosts(fake=True) as costs:
        out = step_roofline._out_float32(torch.bmm)(a, b)
    assert out.shape == (4, 6, 7) and out.dtype == torch.float32
    flops, moved = 2 * 4 * 6 * 5 * 7, 2 * (4 * 6 * 5 + 4 * 5 * 7) + 4 * 4 * 6 * 7
    assert costs.kernels == [(flops, moved, True)]  # rows of 5 and 7 bf16 entries: misaligned
    assert costs.names == ["bmm (out_dtype)"]


def test_a_step_counted_at_a_small_batch_groups_its_uses_as_the_tables_batch_would() -> None:
    """``grouped_as_at``: three same-shape weights' Gram matrices are stacked into one batch at 2 sequences,
    but at a batch where each one's footprint exceeds ``BATCH_BYTES`` they go one at a time; counted at
    2 sequences for that batch, they go one at a time too (no stacking copy), with the same norms. The
    budgets are put back after."""
    from hush_hf.clipping import factors, gram_batches
    from hush_hf.clipping.factors import DenseFactor, OuterSum

    g = torch.Generator().manual_seed(0)
    uses = [
        [
            OuterSum(
                DenseFactor(torch.randn(2, 16, 48, generator=g)),
                DenseFactor(torch.randn(2, 16, 40, generator=g)),
            )
        ]
        for _ in range(3)
    ]
    per_sequence = gram_batches.batch_footprint(uses[0][0]) // 2
    large = 2 * (gram_batches.BATCH_BYTES // per_sequence)  # its footprint: twice the budget

    def stacks(target: int) -> tuple[int, list[torch.Tensor]]:
        with step_roofline.grouped_as_at(2, target), step_roofline.KernelCosts() as costs:
            norms = gram_batches.squared_norms(uses)
        return sum(name == "stack" for name in costs.names), norms

    grouped, norms = stacks(2)
    alone, same = stacks(large)
    assert grouped > 0 and alone == 0
    for a, b in zip(norms, same, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
    assert gram_batches.BATCH_BYTES == 2**26 and factors.GROUPED_NORM_FROM_BYTES == 2**23


def test_a_16_bit_product_whose_rows_are_not_16_byte_aligned_is_priced_at_the_misaligned_rate() -> None:
    """bf16 rows of 5 entries (10 bytes) make a product slow, rows of 8 do not, nor float32 rows of 5 (this
    rate is the H200's bf16 one); a slow product's FLOPs go at ``MISALIGNED_RATE`` (never above R); a
    plain step no R can bring down to its time gets none."""
    odd, even = torch.ones(8, 5, dtype=torch.bfloat16), torch.ones(8, 8, dtype=torch.bfloat16)
    assert step_roofline.misaligned([odd]) and not step_roofline.misaligned([even])
    assert not step_roofline.misaligned([odd.float()])
    assert not step_roofline.misaligned([torch.ones(4, 8, dtype=torch.bfloat16)[:, :5]])  # padded rows
    with step_roofline.KernelCosts() as costs:
        torch.mm(odd, odd.T)
        torch.mm(even, even.T)
    assert [len(k) for k in costs.kernels] == [3, 2] and costs.kernels[0][2] is True
    kernels = [(10**12, 0, True), (10**12, 0)]
    rate = 1e15
    expected = 10**12 / step_roofline.MISALIGNED_RATE + 10**12 / rate
    assert step_roofline.seconds(kernels, rate, math.inf) == pytest.approx(expected, rel=1e-12)
    assert step_roofline.seconds(kernels, 1e12, math.inf) == pytest.approx(2.0, rel=1e-12)  # at most R
    plain = step_roofline.Extrapolated({key: kernels for key in ((2, 2), (2, 3), (3, 2), (3, 3))})
    assert (
        step_roofline.solve_rate(plain, 2, 2, math.inf, target=10**12 / step_roofline.MISALIGNED_RATE) is None
    )
