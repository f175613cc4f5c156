"""Batched squared norms (``gram_batches``) against the one-parameter-at-a-time norms and float64."""

from __future__ import annotations

import pytest
import torch

import hush_hf.clipping.gram_batches as gram_batches
from hush_hf.clipping.factors import (
    DenseFactor,
    Materialized,
    OneHotFactor,
    OuterSum,
    squared_norm_of_sum,
)
from hush_hf.clipping.gram_batches import batch_footprint, squared_norms

B, T = 3, 6


def _dense(g: torch.Generator, width: int, dtype: torch.dtype, steps: int = T) -> DenseFactor:
    return DenseFactor(torch.randn(B, steps, width, generator=g).to(dtype))


def _model_like_uses(dtype: torch.dtype) -> list[list]:
    """Parameters as a model has them: q/k/v reading one input (a shared factor, detached views), layers
    of equal shapes, another sequence length, a tied weight (two uses), a one-hot use, a materialised one."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(B, T, 16, generator=g).to(dtype)
    uses = [[OuterSum(_dense(g, out, dtype), DenseFactor(x.detach()))] for out in (16, 8, 8)]
    uses += [[OuterSum(_dense(g, 24, dtype), _dense(g, 16, dtype))] for _ in range(3)]
    uses.append([OuterSum(_dense(g, 16, dtype, steps=4), _dense(g, 24, dtype, steps=4))])
    hidden = _dense(g, 16, dtype)
    ids = torch.randint(0, 40, (B, T), generator=g)
    uses.append([OuterSum(OneHotFactor(ids, 40), hidden), OuterSum(_dense(g, 40, dtype), hidden)])
    uses.append([OuterSum(OneHotFactor(ids, 40), _dense(g, 16, dtype))])
    uses.append([Materialized(torch.randn(B, 5, 5, generator=g).to(dtype))])
    return uses


def _float64_norm(uses: list) -> torch.Tensor:
    """||sum_u G_u||^2 of materialised float64 gradients: the independent reference."""
    total = 0
    for u in uses:
        if isinstance(u, Materialized):
            total = total + u.values.double()
            continue
        row, col = (
            f.values.double()
            if isinstance(f, DenseFactor)
            else torch.nn.functional.one_hot(f.ids, f.size).double()
            for f in (u.row, u.col)
        )
        total = total + torch.einsum("btr,btk->brk", row, col)
    return total.pow(2).flatten(1).sum(1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("budget", [gram_batches.BATCH_BYTES, 3_000, 0])
def test_batched_norms_equal_the_norms_one_at_a_time(dtype: torch.dtype, budget: int) -> None:
    """Every batch size (all in one batch, a few per batch, none batched) gives each parameter's own norm:
    the float64 reference to 1e-12 in float64; the one-at-a-time float32 path to float32 rounding."""
    uses = _model_like_uses(dtype)
    got = squared_norms(uses, budget=budget)
    assert len(got) == len(uses) and all(t.shape == (B,) and t.dtype == torch.float64 for t in got)
    for found, norm in zip(uses, got, strict=True):
        single = squared_norm_of_sum(found, clamp=False, combined=True)
        tolerance = 1e-12 if dtype == torch.float64 else 1e-6
        torch.testing.assert_close(norm, single.double(), rtol=tolerance, atol=0)
        torch.testing.assert_close(norm, _float64_norm(found), rtol=tolerance, atol=0)


def test_factors_of_one_shape_share_one_product_and_a_shared_factor_is_stacked_once(monkeypatch) -> None:
    """All in one batch: one stacked product per factor shape (a shared input counted once), one
    contraction per Gram shape."""
    stacks = []
    real = gram_batches._stacked_grams
    monkeypatch.setattr(
        gram_batches, "_stacked_grams", lambda values: stacks.append(len(values)) or real(values)
    )
    uses = _model_like_uses(torch.float32)
    squared_norms(uses)
    # the 7 batched parameters' 12 distinct factors by (T, n): (6, 16) x, q's row and the three layers'
    # inputs; (6, 24) the three layers' rows; (6, 8) k's and v's rows; (4, 16) and (4, 24) one each
    assert sorted(stacks) == [1, 1, 2, 3, 5]


def test_a_parameter_larger_than_the_budget_takes_the_single_path(monkeypatch) -> None:
    """Batches hold at most the budget; a parameter whose own footprint exceeds it is not batched."""
    uses = _model_like_uses(torch.float32)
    batches: list[list[int]] = []

    def record(batch, out):
        batches.append([k for k, _ in batch])
        for k, _ in batch:
            out[k] = torch.zeros(B, dtype=torch.float64)

    monkeypatch.setattr(gram_batches, "_batch_norms", record)
    sizes = [batch_footprint(u[0]) for u in uses[:7]]  # the 7 batchable parameters
    budget = max(sizes) - 1
    squared_norms(uses, budget=budget)
    batched = [k for batch in batches for k in batch]
    assert sorted(batched) == [k for k, size in enumerate(sizes) if size <= budget]
    assert all(sum(sizes[k] for k in batch) <= budget for batch in batches)


def test_batched_float32_norms_lose_less_than_the_clip_margin_at_long_sequences() -> None:
    """As ``test_float32_norms_lose_less_than_the_clip_margin_however_many_terms``, for the batched path:
    T^2 = 1,048,576 Gram products per example, summed in float64, within margin / 16 of float64."""
    from hush_hf.clipping.layer_calls import CLIP_MARGINS

    g = torch.Generator().manual_seed(0)
    steps, width = 1024, 64
    uses = [
        [
            OuterSum(
                DenseFactor(torch.randn(2, steps, width, generator=g)),
                DenseFactor(torch.randn(2, steps, width, generator=g)),
            )
        ]
        for _ in range(2)
    ]
    got = squared_norms(uses, budget=2**28)
    for found, norm in zip(uses, got, strict=True):
        x, y = found[0].row.values.double(), found[0].col.values.double()
        exact = (torch.einsum("bti,btj->bij", x, y) ** 2).sum(dim=(1, 2))
        assert ((norm - exact).abs() / exact).max() < CLIP_MARGINS[torch.float32] / 16


def test_factors_that_require_grad_are_batched_without_a_graph() -> None:
    uses = _model_like_uses(torch.float32)
    uses[3] = [OuterSum(DenseFactor(uses[3][0].row.values.requires_grad_()), uses[3][0].col)]
    got = squared_norms(uses)
    assert not got[3].requires_grad
    torch.testing.assert_close(got[3], _float64_norm(uses[3]), rtol=1e-6, atol=0)
