"""Batched clipped sums (``sum_batches``) against the one-weight-at-a-time sums and float64."""

from __future__ import annotations

import pytest
import torch

import hush_hf.clipping.factors as factors
from hush_hf.clipping.factors import DenseFactor, Materialized, OneHotFactor, OuterSum, weighted_sum
from hush_hf.clipping.float32_products import bf16_toward_zero
from hush_hf.clipping.sum_batches import sum_footprint, weighted_sums

B, T = 3, 5


def _layers(dtype: torch.dtype) -> dict[str, list]:
    """Three layers of a small transformer: an up projection (narrow input), a down projection (narrow
    output gradient), an odd one out, a tied weight (two uses), a one-hot and a materialised use."""
    g = torch.Generator().manual_seed(11)

    def dense(width: int) -> DenseFactor:
        return DenseFactor(torch.randn(B, T, width, generator=g).to(dtype))

    uses: dict[str, list] = {}
    for layer in range(3):
        uses[f"up.{layer}"] = [OuterSum(dense(24), dense(8))]  # row (out) wider: the input is scaled
        uses[f"down.{layer}"] = [OuterSum(dense(8), dense(24))]  # row narrower: the output gradient is scaled
    uses["odd"] = [OuterSum(dense(12), dense(8))]
    hidden = dense(8)
    ids = torch.randint(0, 30, (B, T), generator=g)
    uses["tied"] = [OuterSum(OneHotFactor(ids, 30), hidden), OuterSum(dense(30), hidden)]
    uses["embedding"] = [OuterSum(OneHotFactor(ids, 30), dense(8))]
    uses["bias"] = [Materialized(torch.randn(B, 8, generator=g).to(dtype))]
    return uses


def _float64_sum(use: OuterSum, weights: torch.Tensor) -> torch.Tensor:
    row, col = use.row.values.double(), use.col.values.double()  # type: ignore[union-attr]
    return torch.einsum("b,btr,btk->rk", weights.double(), row, col)


@pytest.mark.parametrize(
    ("dtype", "route"),
    [
        (torch.float64, "scaled"),
        (torch.float32, "scaled"),
        (torch.bfloat16, "scaled"),
        (torch.bfloat16, "pieces"),
    ],
)
def test_batched_sums_equal_the_sums_one_weight_at_a_time(
    dtype: torch.dtype, route: str, monkeypatch
) -> None:
    """Weights of one shape summed groupwise give each weight's own clipped sum (the one-at-a-time route,
    and float64); the rest are left for ``weighted_sum``. ``pieces``: CUDA's route for two bf16 factors
    (its two exact bf16 pieces of the factor scaled by the weights cut toward zero, ``bf16_toward_zero``),
    run here through the widening fallback: float64's sum with those weights."""
    if route == "pieces":
        monkeypatch.setattr(factors, "bf16_products", lambda a, b: True)
    uses = _layers(dtype)
    weights = torch.rand(B, generator=torch.Generator().manual_seed(3))
    expected = {name: weighted_sum(found[0], weights) for name, found in uses.items() if len(found) == 1}
    remaining = dict(uses)
    sums = weighted_sums(remaining, weights)
    assert sorted(sums) == sorted(f"{kind}.{k}" for kind in ("up", "down") for k in range(3))
    assert sorted(remaining) == ["bias", "embedding", "odd", "tied"]
    tolerance = 1e-12 if dtype == torch.float64 else 1e-6
    for name, total in sums.items():
        assert total.dtype == expected[name].dtype and total.shape == expected[name].shape
        assert total.is_contiguous()
        torch.testing.assert_close(total, expected[name], rtol=tolerance, atol=tolerance)
        reference = _float64_sum(uses[name][0], bf16_toward_zero(weights) if route == "pieces" else weights)
        torch.testing.assert_close(total.double(), reference, rtol=tolerance, atol=tolerance)


def test_batches_respect_the_budget_and_a_lone_weight_is_left_alone() -> None:
    """A budget of two weights' footprints: the three up projections go as a pair and a lone one (left
    for ``weighted_sum``), as do the down projections; a budget below one footprint batches nothing."""
    uses = _layers(torch.float32)
    weights = torch.rand(B, generator=torch.Generator().manual_seed(4))
    size = sum_footprint(uses["up.0"][0])
    assert size == sum_footprint(uses["down.0"][0])
    remaining = dict(uses)
    sums = weighted_sums(remaining, weights, budget=2 * size)
    assert sorted(sums) == ["down.0", "down.1", "up.0", "up.1"]
    assert "up.2" in remaining and "down.2" in remaining
    remaining = dict(uses)
    assert weighted_sums(remaining, weights, budget=size - 1) == {} and remaining == uses


def test_factors_that_require_grad_are_summed_without_a_graph() -> None:
    """A factor derived under grad mode (requires grad) is stacked all the same; no graph is built."""
    uses = _layers(torch.float32)
    for name in ("up.0", "up.1"):
        g = uses[name][0]
        uses[name] = [OuterSum(DenseFactor(g.row.values.requires_grad_()), g.col)]
    weights = torch.rand(B, generator=torch.Generator().manual_seed(5))
    sums = weighted_sums(dict(uses), weights)
    assert not sums["up.0"].requires_grad
    torch.testing.assert_close(sums["up.0"], weighted_sum(uses["up.0"][0], weights).detach())
