"""The factored per-example gradient algebra against explicitly materialised gradients."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor

from hush_hf.clipping.factor_memo import FactorMemo, gram_requests, sum_requests
from hush_hf.clipping.factors import (
    PACK_BELOW,
    DenseFactor,
    Materialized,
    OneHotFactor,
    OuterSum,
    combine_uses,
    gram,
    grouped_squared_rows,
    inner,
    norm_strategy,
    pack_small,
    squared_norm_of_sum,
    weighted_sum,
)
from hush_hf.clipping.factors import materialize as materialize_use
from hush_hf.clipping.float32_products import (
    bf16_pieces,
    bf16_pieces_side_by_side,
    bf16_toward_zero,
    bmm_float32,
)
from hush_hf.clipping.layer_calls import CLIP_MARGINS
from hush_hf.clipping.zero_steps import drop_zero_steps, drop_zero_steps_all, drop_zero_steps_if_costly

B, ROWS, COLS = 3, 7, 5


def random_factor(kind: str, size: int, steps: int, g: torch.Generator):
    if kind == "dense":
        return DenseFactor(torch.randn(B, steps, size, generator=g, dtype=torch.float64))
    return OneHotFactor(torch.randint(0, size, (B, steps), generator=g), size)


def dense_vectors(f) -> Tensor:
    if isinstance(f, DenseFactor):
        return f.values
    return torch.nn.functional.one_hot(f.ids, f.size).double()


def materialize(g) -> Tensor:
    if isinstance(g, Materialized):
        return g.values.double()
    return torch.einsum("btr,btk->brk", dense_vectors(g.row), dense_vectors(g.col))


KINDS = ["dense", "onehot"]


@pytest.mark.parametrize(("kind_f", "kind_h"), list(itertools.product(KINDS, KINDS)))
def test_gram_matches_dense_vectors(kind_f: str, kind_h: str) -> None:
    g = torch.Generator().manual_seed(0)
    f, h = random_factor(kind_f, ROWS, 4, g), random_factor(kind_h, ROWS, 6, g)
    expected = torch.einsum("btn,bsn->bts", dense_vectors(f), dense_vectors(h))
    torch.testing.assert_close(gram(f, h).double(), expected)


def test_a_bf16_factor_gathered_against_ids_is_widened_after_the_gather() -> None:
    """A tied output layer's logits gradient (bf16, vocabulary-wide) against the embedding's ids: the Gram
    entries are gathered from it as stored, then widened (exact), so no float32 copy of the whole factor is
    made; the same values as widening first."""
    from torch.utils._python_dispatch import TorchDispatchMode

    g = torch.Generator().manual_seed(36)
    logits_grad = DenseFactor(torch.randn(B, 6, 1000, generator=g).bfloat16())
    ids = OneHotFactor(torch.randint(0, 1000, (B, 4), generator=g), 1000)

    class Outputs(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.sizes: list[int] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.sizes += [t.numel() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, Tensor)]
            return out

    with Outputs() as made:
        got = gram(logits_grad, ids)
    assert got.dtype == torch.float32 and max(made.sizes) == B * 6 * 4  # nothing of the factor's size
    widened_first = torch.gather(logits_grad.values.float(), 2, ids.ids[:, None, :].expand(B, 6, 4))
    assert torch.equal(got, widened_first)
    torch.testing.assert_close(gram(ids, logits_grad), got.transpose(1, 2), rtol=0, atol=0)


def random_grad(kind: str, g: torch.Generator, steps: int):
    if kind == "materialized":
        return Materialized(torch.randn(B, ROWS, COLS, generator=g, dtype=torch.float64))
    row_kind, col_kind = kind.split("x")
    return OuterSum(random_factor(row_kind, ROWS, steps, g), random_factor(col_kind, COLS, steps, g))


GRAD_KINDS = ["densexdense", "onehotxdense", "densexonehot", "materialized"]


@pytest.mark.parametrize(("kind_a", "kind_b"), list(itertools.combinations_with_replacement(GRAD_KINDS, 2)))
def test_inner_product_matches_materialised(kind_a: str, kind_b: str) -> None:
    g = torch.Generator().manual_seed(1)
    a, b = random_grad(kind_a, g, 4), random_grad(kind_b, g, 9)
    expected = (materialize(a) * materialize(b)).flatten(1).sum(1)
    torch.testing.assert_close(inner(a, b).double(), expected)
    torch.testing.assert_close(inner(b, a).double(), expected)


def test_squared_norm_of_sum_includes_cross_terms() -> None:
    """Tied-embedding shape: one-hot rows (embedding use) plus dense rows (output projection use)."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, ROWS, (B, 6), generator=g)
    deltas = torch.randn(B, 6, COLS, generator=g, dtype=torch.float64)
    emb = OuterSum(OneHotFactor(ids, ROWS), DenseFactor(deltas))
    out = random_grad("densexdense", g, 6)
    extra = random_grad("materialized", g, 0)
    uses = [emb, out, extra]
    expected = sum(materialize(u) for u in uses).pow(2).flatten(1).sum(1)
    torch.testing.assert_close(squared_norm_of_sum(uses).double(), expected)
    no_cross = sum(materialize(u).pow(2).flatten(1).sum(1) for u in uses)
    assert (no_cross - expected).abs().max() > 1e-3 * expected.max()


@pytest.mark.parametrize("kind", [*GRAD_KINDS, "onehotxonehot"])
def test_weighted_sum_matches_materialised(kind: str) -> None:
    """sum_i w_i G_i (what the self-check rebuilds), repeated one-hot ids accumulating."""
    g = torch.Generator().manual_seed(4)
    grad = random_grad(kind, g, 9)  # 9 steps over 5-7 rows: ids repeat
    weights = torch.rand(B, generator=g, dtype=torch.float64)
    expected = torch.einsum("b,brk->rk", weights, materialize(grad))
    torch.testing.assert_close(weighted_sum(grad, weights).double(), expected)


def test_float32_inputs_are_computed_in_at_least_float32_and_half_is_upcast() -> None:
    g = torch.Generator().manual_seed(3)
    row = DenseFactor(torch.randn(B, 4, ROWS, generator=g).bfloat16())
    col = DenseFactor(torch.randn(B, 4, COLS, generator=g).bfloat16())
    value = squared_norm_of_sum([OuterSum(row, col)])
    assert value.dtype == torch.float64  # products in float32, summed in float64 (factors.exact_sum)
    exact = torch.einsum("btr,btk->brk", row.values.double(), col.values.double()).pow(2).flatten(1).sum(1)
    torch.testing.assert_close(value.double(), exact, rtol=1e-6, atol=0)


def dense_use(g: torch.Generator, steps: int, rows: int = ROWS, cols: int = COLS) -> OuterSum:
    return OuterSum(
        DenseFactor(torch.randn(B, steps, rows, generator=g, dtype=torch.float64)),
        DenseFactor(torch.randn(B, steps, cols, generator=g, dtype=torch.float64)),
    )


def test_norm_strategy_materialises_up_to_a_quarter_more_bytes_than_the_factors() -> None:
    """Materialised (kept for the norm and the clipped sum) iff its bytes are at most 5/4 of the factors',
    rows * cols * 4 <= 5/4 (sum_u T_u)(rows * s_row + cols * s_col), with full-precision float products
    (float64 here); it never costs more FLOPs than ghost norms plus the clipped-sum matmul."""
    g = torch.Generator().manual_seed(5)
    # 10 x 10: 100 values against 20 a step; at the boundary, T = 4: 100 <= 5/4 * 80 -> materialise.
    assert norm_strategy([dense_use(g, 3, rows=10, cols=10)]) == "ghost"  # 100 > 75
    assert norm_strategy([dense_use(g, 4, rows=10, cols=10)]) == "materialize"
    # rows + cols = 12, rows * cols = 35: T = 2 -> ghost (35 > 30); T = 3 -> materialise (35 <= 45).
    assert norm_strategy([dense_use(g, 2)]) == "ghost"
    assert norm_strategy([dense_use(g, 3)]) == "materialize"
    # Two uses count their steps together: 1 + 1 -> ghost, 2 + 1 -> materialise.
    assert norm_strategy([dense_use(g, 1), dense_use(g, 1)]) == "ghost"
    assert norm_strategy([dense_use(g, 2), dense_use(g, 1)]) == "materialize"
    # bf16 factors (2 bytes) against a float32 sum (4 bytes), whose products are fast: kept only when no
    # larger than the factors, 6 steps (140 <= 144 bytes; 5/4 would take 5).
    half = [OuterSum(DenseFactor(u.row.values.bfloat16()), DenseFactor(u.col.values.bfloat16())) for u in
            (dense_use(g, 5), dense_use(g, 6))]  # fmt: skip
    assert [norm_strategy([u]) for u in half] == ["ghost", "materialize"]
    # A one-hot side (embedding rows) or a materialised use keeps the ghost form.
    ids = OneHotFactor(torch.randint(0, ROWS, (B, 40), generator=g), ROWS)
    assert norm_strategy([OuterSum(ids, DenseFactor(torch.randn(B, 40, COLS, generator=g)))]) == "ghost"
    assert norm_strategy([dense_use(g, 40), random_grad("materialized", g, 0)]) == "ghost"
    # Uses of two shapes, or none, keep the ghost form.
    assert norm_strategy([dense_use(g, 40), dense_use(g, 40, cols=COLS + 1)]) == "ghost"
    assert norm_strategy([]) == "ghost"
    # The widest factor sets the materialised tensor's bytes: a float64 side makes it 8 bytes an entry.
    uses = {t: dense_use(g, t) for t in (3, 4)}
    single = OuterSum(DenseFactor(uses[3].row.values.float()), DenseFactor(uses[3].col.values.float()))
    assert norm_strategy([single]) == "materialize"  # 35 * 4 <= 5/4 * 3 * (7 * 4 + 5 * 4)
    assert norm_strategy([OuterSum(single.row, uses[3].col)]) == "ghost"  # 35 * 8 > 5/4 * 3 * (7 * 4 + 5 * 8)
    mixed = OuterSum(DenseFactor(uses[4].row.values.float()), uses[4].col)
    assert norm_strategy([mixed]) == "materialize"  # 35 * 8 <= 5/4 * 4 * (7 * 4 + 5 * 8)


def test_combined_uses_give_the_same_norm_and_clipped_sum() -> None:
    g = torch.Generator().manual_seed(9)
    uses = [dense_use(g, 3), dense_use(g, 4)]
    combined = combine_uses(uses)
    assert len(combined) == 1 and isinstance(combined[0], Materialized)
    expected = sum(materialize(u) for u in uses)
    torch.testing.assert_close(combined[0].values, expected)
    weights = torch.rand(B, generator=g, dtype=torch.float64)
    clipped = torch.einsum("b,brk->rk", weights, expected)
    torch.testing.assert_close(weighted_sum(combined[0], weights), clipped)
    torch.testing.assert_close(squared_norm_of_sum(combined), expected.pow(2).flatten(1).sum(1))
    ghost_form = [dense_use(g, 1)]
    assert combine_uses(ghost_form) == ghost_form


def test_no_per_example_tensor_with_a_vocabulary_sized_dimension() -> None:
    g = torch.Generator().manual_seed(6)
    logits_use = dense_use(g, 64, rows=120, cols=32)  # 64 * 152 > 120 * 32 + ...: cheaper to materialise
    assert norm_strategy([logits_use]) == "materialize"
    assert norm_strategy([logits_use], never_materialize_dim=120) == "ghost"
    assert norm_strategy([logits_use], never_materialize_dim=121) == "materialize"
    assert isinstance(combine_uses([logits_use], never_materialize_dim=120)[0], OuterSum)


@pytest.mark.parametrize("steps", [[4], [3, 5]], ids=["one-use", "two-uses"])
def test_materialised_norm_equals_the_ghost_norm(steps: list[int]) -> None:
    g = torch.Generator().manual_seed(7)
    uses = [dense_use(g, t) for t in steps]
    assert norm_strategy(uses) == "materialize"
    expected = sum(materialize(u) for u in uses).pow(2).flatten(1).sum(1)
    torch.testing.assert_close(squared_norm_of_sum(uses).double(), expected)
    pairs = [(i, j) for i in range(len(uses)) for j in range(i, len(uses))]
    ghost_only = sum(inner(uses[i], uses[j]) * (1 if i == j else 2) for i, j in pairs)
    torch.testing.assert_close(ghost_only.double(), expected)
    torch.testing.assert_close(materialize_use(uses[0]).values, materialize(uses[0]))
    with pytest.raises(ValueError, match="two dense factors"):
        materialize_use(OuterSum(OneHotFactor(torch.zeros(B, 2, dtype=torch.long), ROWS), uses[0].col))


def with_zero_steps(g: OuterSum, keep: list[int], gen: torch.Generator) -> OuterSum:
    """Zero the dense side at all but ``keep[i]`` random steps of example i (a masked-LM head)."""
    dense = g.col if isinstance(g.col, DenseFactor) else g.row
    values = dense.values.clone()
    for i, k in enumerate(keep):
        values[i, torch.randperm(values.shape[1], generator=gen)[k:]] = 0.0
    values[0, 0, 0] = 0.0  # a nonzero step with a zero entry stays
    zeroed = DenseFactor(values)
    return OuterSum(g.row, zeroed) if dense is g.col else OuterSum(zeroed, g.col)


@pytest.mark.parametrize("kind", ["densexdense", "onehotxdense", "densexonehot"])
def test_dropping_zero_steps_is_exact(kind: str) -> None:
    """Fewer steps (at most the largest per-example count), same norms, cross terms and clipped sums."""
    g = torch.Generator().manual_seed(8)
    sparse = with_zero_steps(random_grad(kind, g, 12), keep=[3, 0, 1], gen=g)  # example 1: all zero
    other = random_grad("densexdense", g, 5)
    compact = drop_zero_steps(sparse)
    steps = (compact.row.values if isinstance(compact.row, DenseFactor) else compact.row.ids).shape[1]
    assert steps == 3
    torch.testing.assert_close(materialize(compact), materialize(sparse))
    expected = (materialize(sparse) + materialize(other)).pow(2).flatten(1).sum(1)
    torch.testing.assert_close(squared_norm_of_sum([compact, other]).double(), expected)
    weights = torch.rand(B, generator=g, dtype=torch.float64)
    torch.testing.assert_close(
        weighted_sum(compact, weights).double(), torch.einsum("b,brk->rk", weights, materialize(sparse))
    )
    dense = random_grad(kind, g, 12)
    assert drop_zero_steps(dense) is dense  # nothing to drop: unchanged


def test_mismatched_factor_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="factor sizes differ"):
        gram(DenseFactor(torch.zeros(1, 2, 3)), OneHotFactor(torch.zeros(1, 2, dtype=torch.long), 4))
    with pytest.raises(ValueError, match="at least one use"):
        squared_norm_of_sum([])


def test_dropping_zero_steps_keeps_non_finite_steps() -> None:
    """A NaN or inf step is not a zero step: it stays, so the norm is non-finite and the engine refuses."""
    g = torch.Generator().manual_seed(10)
    sparse = with_zero_steps(random_grad("densexdense", g, 12), keep=[1, 1, 1], gen=g)
    values = sparse.col.values.clone()
    zero_step = int((values[1].abs().amax(-1) == 0).nonzero()[0])
    values[1, zero_step, 2] = float("nan")
    compact = drop_zero_steps(OuterSum(sparse.row, DenseFactor(values)))
    assert compact.col.values.shape[1] == 2
    norms = squared_norm_of_sum([compact])
    assert torch.isnan(norms[1]) and torch.isfinite(norms[[0, 2]]).all()


def test_dropping_zero_steps_of_many_uses_at_once_is_each_ones_drop() -> None:
    """One device-to-host read for all uses, the same result as one by one (compacted or unchanged; a use
    that is materialised anyway is left as it is, ``drop_zero_steps_if_costly``), and the same per-example
    gradients as dropping every use's zero steps."""
    g = torch.Generator().manual_seed(11)
    uses = [
        with_zero_steps(random_grad("densexdense", g, 12), keep=[3, 0, 1], gen=g),
        random_grad("densexdense", g, 12),
        with_zero_steps(random_grad("onehotxdense", g, 12), keep=[2, 2, 2], gen=g),
        random_grad("densexdense", g, 5),
        Materialized(torch.randn(B, ROWS, generator=g)),
    ]
    together = drop_zero_steps_all(uses)
    one_by_one = [drop_zero_steps_if_costly(u, None) for u in uses]
    for one, alone, original in zip(together, one_by_one, uses, strict=True):
        torch.testing.assert_close(materialize(one), materialize(alone), rtol=0, atol=0)
        torch.testing.assert_close(materialize(one), materialize(drop_zero_steps(original)), rtol=0, atol=0)
        if alone is original:
            assert one is original
        else:
            assert one.row.size == alone.row.size and one.col.values.shape == alone.col.values.shape
    assert together[1] is uses[1] and together[4] is uses[4]
    assert together[0] is uses[0]  # 7 x 5, T = 12: materialised anyway, so not compacted (no read)
    assert together[2] is not uses[2]  # a one-hot side is never materialised: compacted
    assert drop_zero_steps_all([]) == []


def test_packed_small_gradients_give_the_same_norms_and_clipped_sums() -> None:
    """Biases and norm scales (bf16 and float32 mixed) joined into one block, medium parameters (float32
    and bf16, wider than one CPU norm chunk) kept as blocks of their own, not copied: the same squared
    norms (float32 squares summed in float64: within 2^-24 relative, never more) and clipped sums as
    parameter by parameter; a large or multi-use parameter is not packed."""
    g = torch.Generator().manual_seed(12)
    medium = Materialized(torch.randn(B, 120, 500, generator=g))  # 60,000 values: crosses a norm chunk
    uses = {
        "bias": [Materialized(torch.randn(B, 6, generator=g).bfloat16())],
        "medium": [medium],
        "scale": [Materialized(torch.randn(B, 4, generator=g))],
        "medium_bf16": [Materialized(torch.randn(B, 5000, generator=g).bfloat16())],
        "table": [Materialized(torch.randn(B, 2, 3, generator=g))],
        "big": [Materialized(torch.zeros(B, PACK_BELOW + 1))],
        "tied": [Materialized(torch.randn(B, 3, generator=g)), Materialized(torch.randn(B, 3, generator=g))],
        "weight": [random_grad("densexdense", g, 5)],
    }
    before = {name: list(found) for name, found in uses.items()}
    packed = pack_small(uses)
    assert packed is not None and packed.names == ("bias", "scale", "table", "medium", "medium_bf16")
    assert set(uses) == {"big", "tied", "weight"} and packed.blocks[0].dtype == torch.float32
    assert [b.shape[1] for b in packed.blocks] == [6 + 4 + 6, 60_000, 5000]
    assert packed.blocks[1].data_ptr() == medium.values.data_ptr()  # kept as stored: no copy
    expected = sum(materialize(before[n][0]).pow(2).flatten(1).sum(1) for n in packed.names)
    got = packed.squared_norms()
    assert got.dtype == torch.float64
    assert ((got - expected).abs() / expected).max() <= 2.0**-24
    weights = torch.rand(B, generator=g)
    sums = packed.weighted_sums(weights)
    for name in packed.names:
        assert sums[name].shape == before[name][0].values.shape[1:]
        torch.testing.assert_close(sums[name], weighted_sum(before[name][0], weights))
    assert pack_small({"weight": [random_grad("densexdense", g, 5)]}) is None


def test_off_cpu_every_packed_gradient_is_joined_into_one_block(monkeypatch) -> None:
    """A GPU pays a launch or two per block (LoRA's adapters are hundreds of them): off CPU every packed
    parameter, medium ones included, is joined into one block, with the same norms and clipped sums."""
    import hush_hf.clipping.factors as factors

    g = torch.Generator().manual_seed(14)
    uses = {
        "lora_A": [Materialized(torch.randn(B, 16, 300, generator=g))],
        "bias": [Materialized(torch.randn(B, 6, generator=g))],
        "lora_B": [Materialized(torch.randn(B, 300, 16, generator=g))],
    }
    before = {name: found[0] for name, found in uses.items()}
    monkeypatch.setattr(factors, "JOIN_BELOW", {})  # what a CUDA device gets
    packed = pack_small(dict(uses))
    assert packed is not None and len(packed.blocks) == 1 and packed.blocks[0].shape == (B, 4800 + 6 + 4800)
    expected = sum(before[n].values.double().pow(2).flatten(1).sum(1) for n in before)
    assert ((packed.squared_norms() - expected).abs() / expected).max() <= 2.0**-24
    weights = torch.rand(B, generator=g)
    sums = packed.weighted_sums(weights)
    for name, use in before.items():
        torch.testing.assert_close(sums[name], weighted_sum(use, weights))


def test_bf16_products_are_the_widened_products() -> None:
    """bf16 operands, float32 output: what float32 copies of the operands give (a bf16 x bf16 product is
    exact in float32). On CUDA ``out_dtype`` does it without the copies (its call checked on the meta
    device, which implements the same signature)."""
    g = torch.Generator().manual_seed(13)
    a = torch.randn(B, 5, 16, generator=g).bfloat16()
    c = torch.randn(B, 16, 4, generator=g).bfloat16()
    got = bmm_float32(a, c, torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), torch.bmm(a.double(), c.double()), rtol=1e-6, atol=1e-6)
    shape = torch.bmm(a.to("meta"), c.to("meta"), out_dtype=torch.float32)
    assert shape.dtype == torch.float32 and shape.shape == got.shape
    f = DenseFactor(a)
    torch.testing.assert_close(gram(f, f).double(), torch.bmm(a.double(), a.double().transpose(1, 2)))


def test_bf16_pieces_sum_to_the_float32_value_exactly() -> None:
    g = torch.Generator().manual_seed(14)
    x = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-60, 60, (4096,), generator=g).float())
    hi, mid, lo = bf16_pieces(x)
    assert hi.dtype == mid.dtype == lo.dtype == torch.bfloat16
    assert torch.equal(hi.double() + mid.double() + lo.double(), x.double())
    assert not torch.equal(hi.float(), x)  # the pieces are needed
    side_by_side = bf16_pieces_side_by_side(x.reshape(64, 64))
    assert side_by_side.dtype == torch.bfloat16 and side_by_side.shape == (64, 192)
    assert torch.equal(side_by_side, torch.cat([p.reshape(64, 64) for p in (hi, mid, lo)], dim=1))


def test_weights_cut_to_bf16_toward_zero_lose_under_2_to_the_minus_7() -> None:
    g = torch.Generator().manual_seed(16)
    w = torch.rand(4096, generator=g) * torch.exp2(torch.randint(-40, 1, (4096,), generator=g).float())
    cut = bf16_toward_zero(w)
    assert cut.dtype == torch.float32 and torch.equal(cut.bfloat16().float(), cut)  # 8 significant bits
    assert bool((cut <= w).all()) and bool((cut > w * (1 - 2.0**-7)).all())
    assert bool((cut < w).any())  # the cut is needed
    exact = torch.tensor([1.0, 0.5, 0.0, 2.0**-30, 0.75, float(torch.tensor(0.3).bfloat16())])
    assert torch.equal(bf16_toward_zero(exact), exact)  # unclipped examples (c_i = 1) keep their weight
    near_one = torch.tensor([1 - 1e-9, 0.5 - 1e-12, 0.25], dtype=torch.float64)  # float32 rounds them up
    cut64 = bf16_toward_zero(near_one)
    assert bool((cut64.double() <= near_one).all()) and cut64.tolist() == [1 - 2.0**-8, 0.5 - 2.0**-9, 0.25]


def test_two_bf16_pieces_hold_a_bf16_value_times_a_cut_weight_exactly() -> None:
    g = torch.Generator().manual_seed(17)
    x = torch.randn(64, 64, generator=g) * torch.exp2(torch.randint(-40, 40, (64, 64), generator=g).float())
    weights = bf16_toward_zero(torch.rand(64, 1, generator=g))
    scaled = x.bfloat16().float() * weights  # what _weighted_product_bf16 folds: exact in float32
    assert torch.equal(scaled.double(), x.bfloat16().double() * weights.double())
    pair = bf16_pieces_side_by_side(scaled, 2)
    assert pair.dtype == torch.bfloat16 and pair.shape == (64, 128)
    assert torch.equal(pair[:, :64].double() + pair[:, 64:].double(), scaled.double())
    assert not torch.equal(pair[:, :64].float(), scaled)  # the second piece is needed


@pytest.mark.parametrize("narrow", ["row", "col"])
def test_the_bf16_clipped_sum_route_equals_the_float32_route(narrow: str, monkeypatch) -> None:
    """CUDA's route for two bf16 factors (weights cut toward zero and folded in float32, two exact bf16
    pieces, bf16 GEMMs with float32 output; on CPU the GEMMs widen their operands, the same numbers)
    against the float32 route with the cut weights and a float64 reference; and no further from the
    route with the weights as they are than 2^-7 relative."""
    import hush_hf.clipping.factors as factors

    g = torch.Generator().manual_seed(15)
    small, large = torch.randn(B, 9, 6, generator=g), torch.randn(B, 9, 40, generator=g)
    row, col = (small, large) if narrow == "row" else (large, small)
    use = OuterSum(DenseFactor(row.bfloat16()), DenseFactor(col.bfloat16()))
    weights = torch.rand(B, generator=g) / 3
    cut = bf16_toward_zero(weights)
    widened, uncut = weighted_sum(use, cut), weighted_sum(use, weights)
    monkeypatch.setattr(factors, "bf16_products", lambda a, b: True)
    split = weighted_sum(use, weights)
    assert split.dtype == torch.float32 and split.shape == widened.shape and split.is_contiguous()
    exact = OuterSum(DenseFactor(use.row.values.double()), DenseFactor(use.col.values.double()))
    reference = torch.einsum("b,brk->rk", cut.double(), materialize(exact))
    torch.testing.assert_close(split.double(), reference, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(split, widened, rtol=1e-6, atol=1e-6)
    assert float((split - uncut).norm() / uncut.norm()) < 2.0**-7


def test_float32_norms_lose_less_than_the_clip_margin_however_many_terms() -> None:
    """The float32 clip margin (2^-20) covers rounding only if a norm's sum of products loses far less.
    A float32 batched dot summed 796,928 terms with relative error 3.7e-4 (norms too small: examples
    under-clipped); each path is checked at sizes like that against float64, within margin / 16."""
    from hush_hf.clipping.layer_calls import CLIP_MARGINS

    bound = CLIP_MARGINS[torch.float32] / 16
    g = torch.Generator().manual_seed(0)
    big = Materialized(torch.randn(2, 796_928, generator=g))  # a 1024 x 778 weight, materialised
    exact = (big.values.double() ** 2).sum(dim=1)
    assert ((inner(big, big) - exact).abs() / exact).max() < bound
    steps, width = 1024, 64  # the ghost path: T^2 = 1,048,576 Gram products per example
    x = torch.randn(2, steps, width, generator=g)
    y = torch.randn(2, steps, width, generator=g)
    ghost = OuterSum(DenseFactor(x), DenseFactor(y))
    exact = (torch.einsum("bti,btj->bij", x.double(), y.double()) ** 2).sum(dim=(1, 2))
    assert ((inner(ghost, ghost) - exact).abs() / exact).max() < bound
    packed = pack_small({"bias": [Materialized(torch.randn(2, 60_000, generator=g))]})
    exact = (packed.blocks[0].double() ** 2).sum(dim=1)
    assert ((packed.squared_norms() - exact).abs() / exact).max() < bound


def test_a_factor_shared_by_several_uses_gets_its_gram_matrix_once(monkeypatch) -> None:
    """Three projections of one input (detached views of one tensor, as the hooks record them) and a
    one-hot use: norms with a ``FactorMemo`` equal the norms without, the shared Gram matrix is computed
    once and dropped after its last use."""
    import hush_hf.clipping.factor_memo as factor_memo

    g = torch.Generator().manual_seed(21)
    x = torch.randn(B, 6, 32, generator=g, dtype=torch.float64)  # wide enough for the ghost norm
    uses = {
        name: [
            OuterSum(
                DenseFactor(torch.randn(B, 6, out, generator=g, dtype=torch.float64)), DenseFactor(x.detach())
            )
        ]
        for name, out in (("q", 32), ("k", 16), ("v", 16))
    }
    uses["embedding"] = [
        OuterSum(OneHotFactor(torch.randint(0, 40, (B, 6), generator=g), 40), DenseFactor(x.detach()))
    ]
    assert all(norm_strategy(found) == "ghost" for found in uses.values())
    expected = {name: squared_norm_of_sum(found) for name, found in uses.items()}
    computed = []
    monkeypatch.setattr(factor_memo, "gram", lambda f, h: computed.append(f) or gram(f, h))
    memo = FactorMemo(gram_requests([u for found in uses.values() for u in found]))
    for name, found in uses.items():
        torch.testing.assert_close(
            squared_norm_of_sum(found, combined=True, grams=memo), expected[name], rtol=1e-12, atol=0
        )
    assert (
        sum(isinstance(f, DenseFactor) and f.values.data_ptr() == x.data_ptr() for f in computed) == 1
    )  # x's Gram matrix once, not 4 times
    assert len(computed) == 1 + 3 + 1  # x once, each other factor (3 dense, 1 one-hot) once
    assert not memo._kept and not memo._left  # nothing kept after the last use


@pytest.mark.parametrize("route", ["scaled", "pieces"])
def test_clipped_sums_of_uses_sharing_a_factor_equal_the_sums_without_sharing(
    route: str, monkeypatch
) -> None:
    """Gate and up projections read one input (the narrower factor): its clip-weighted form (CPU route)
    or its three bf16 pieces (CUDA's route, run here through the widening fallback) is built once and
    gives exactly the clipped sums built separately; nothing is kept after the last use."""
    import hush_hf.clipping.factors as factors

    if route == "pieces":
        monkeypatch.setattr(factors, "bf16_products", lambda a, b: True)
    g = torch.Generator().manual_seed(22)
    x = torch.randn(B, 6, 8, generator=g).bfloat16()
    uses = [
        OuterSum(DenseFactor(torch.randn(B, 6, 32, generator=g).bfloat16()), DenseFactor(x.detach()))
        for _ in "gu"
    ]
    weights = torch.rand(B, generator=g)
    separate = [weighted_sum(u, weights) for u in uses]
    memo = FactorMemo(sum_requests(uses))
    for use, expected in zip(uses, separate, strict=True):
        assert torch.equal(weighted_sum(use, weights, memo), expected)
    assert not memo._kept and not memo._left


def test_zero_steps_are_checked_for_a_use_materialised_only_beyond_its_factors_bytes() -> None:
    """A use kept materialised because its gradient is no larger than its factors (a low-rank adapter's)
    skips the zero-step check; one the 5/4 rule keeps (a full layer's weight) is compacted as before."""
    g = torch.Generator().manual_seed(11)

    def padded(steps: int, live: int) -> OuterSum:
        use = dense_use(g, steps, rows=10, cols=10)
        use.col.values[:, live:] = 0  # no output gradient past `live` steps: padding
        return use

    beyond, within = padded(4, 1), padded(8, 2)  # 100 values against 80 and 160 a factor pair holds
    assert norm_strategy([beyond]) == norm_strategy([within]) == "materialize"
    out = drop_zero_steps_all([beyond, within])
    assert out[0].row.values.shape[1] == 1  # compacted to its one nonzero step
    assert out[1] is within
    torch.testing.assert_close(materialize_use(out[0]).values, materialize_use(beyond).values)


def test_norm_strategy_keeps_a_float32_gradient_in_the_five_fourths_band_under_tf32_too() -> None:
    """Under TF32 (``"high"``) as at full precision, float32 factors are kept up to 5/4 of their bytes: the
    Gram route they replace also streams stacked factors and float64 dot sums, which TF32 does not make
    faster (``bench/step_roofline.py``); bf16 factors only up to their own bytes, whatever the setting."""
    g = torch.Generator().manual_seed(12)
    band = dense_use(g, 4, rows=10, cols=10)  # 100 values against 80 a step pair: 5/4 exactly
    single = OuterSum(DenseFactor(band.row.values.float()), DenseFactor(band.col.values.float()))
    nine = dense_use(g, 9, rows=10, cols=10)  # bf16: 400 bytes kept against 360, within 5/4
    half = OuterSum(DenseFactor(nine.row.values.bfloat16()), DenseFactor(nine.col.values.bfloat16()))
    before = torch.get_float32_matmul_precision()
    try:
        for setting in ("highest", "high"):
            torch.set_float32_matmul_precision(setting)
            assert norm_strategy([single]) == norm_strategy([band]) == "materialize", setting
            assert norm_strategy([half]) == "ghost", setting
    finally:
        torch.set_float32_matmul_precision(before)


class _LargestOutput:
    """The largest tensor any dispatched operation writes inside the ``with`` (views allocate nothing)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        record = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if isinstance(out, Tensor) and not func.is_view:
                    record.largest = max(record.largest, out.numel() * out.element_size())
                return out

        self.largest, self._mode = 0, Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)


def test_a_kept_gradients_norm_on_cpu_takes_its_columns_a_chunk_at_a_time() -> None:
    """A kept (materialised) gradient's squared norm: float64-exact, and on CPU no temporary of its size
    (``torch.sum`` with ``dtype=float64`` converts its whole input first): 9x faster there at GPT-2's
    (768 x 3072) weight."""
    g = torch.Generator().manual_seed(13)
    values = torch.randn(B, 256, 512, generator=g)  # 1.5 MiB, three chunks' worth of columns
    kept = Materialized(values)
    with _LargestOutput() as record:
        norms = inner(kept, kept)
    expected = values.double().pow(2).flatten(1).sum(1)
    torch.testing.assert_close(norms, expected, rtol=2**-24, atol=0)  # each square rounded once
    assert record.largest <= 2**20  # one chunk's float64 squares, not the whole block's


GROUPED_BOUND = 11.1 * 2.0**-24
"""``grouped_squared_rows``' stated bound on a squared norm's relative error (gamma_8 + 3u, float32)."""


def float32_groups_emulated(block: Tensor) -> Tensor:
    """The grouped route's partials with the least favourable float32 arithmetic it may meet on a GPU: each
    square rounded, a group's 8 squares added one by one in float32 (a CPU ``vector_norm`` may accumulate
    in float64 instead, which would hide them), the square root and its square rounded; (b, N // 8)."""
    b, width = block.shape
    groups = block[:, : width - width % 8].reshape(b, 8, -1)
    acc = groups[:, 0] * groups[:, 0]
    for k in range(1, 8):
        acc = acc + groups[:, k] * groups[:, k]
    partial = torch.sqrt(acc)
    return partial * partial


@pytest.mark.parametrize("values", ["normal", "heavy-tailed", "equal", "one-large"])
def test_grouped_squared_rows_stays_within_its_bound_and_the_float32_clip_margin(values: str) -> None:
    """Against float64, within 11.1 u of the squared norm: the route as this machine runs it, and each of its
    partial sums with the worst float32 arithmetic emulated (all terms >= 0, so the total's relative error
    is at most its partials' largest). The norm's error, half that, fits under float32's clip margin 2^-20
    with the 2^-24 the other routes spend. Equal values are the classic adversary of sequential sums."""
    g = torch.Generator().manual_seed(14)
    shape = (6, 8 * 4099 + 5)  # columns beyond whole groups: the tail's own sum
    block = {
        "normal": lambda: torch.randn(shape, generator=g),
        "heavy-tailed": lambda: torch.exp(4 * torch.randn(shape, generator=g)),
        "equal": lambda: torch.full(shape, 1 + 2**-12 + 2**-20),
        "one-large": lambda: torch.randn(shape, generator=g).index_fill_(1, torch.tensor([7]), 1e6),
    }[values]()
    exact = block.double().pow(2).sum(1)
    got = grouped_squared_rows(block)
    assert got.dtype == torch.float64
    assert ((got - exact) / exact).abs().max() <= GROUPED_BOUND
    b, width = block.shape
    exact_partials = block[:, : width - width % 8].double().reshape(b, 8, -1).pow(2).sum(1)
    emulated = ((float32_groups_emulated(block).double() - exact_partials) / exact_partials).abs().max()
    assert emulated <= GROUPED_BOUND
    assert emulated > 2.0**-25  # the emulated float32 arithmetic does round: the check is not vacuous
    assert CLIP_MARGINS[torch.float32] > GROUPED_BOUND / 2 + 2.0**-24


def test_a_kept_gradients_norm_off_cpu_writes_no_temporary_of_its_size() -> None:
    """Off CPU (the meta device stands in for a GPU: the same route, shapes only) a large float32 block's
    norm writes an eighth of its bytes (the float32 partial sums; ``sum``'s float64 copy of them, a quarter,
    is made inside its kernel here, unseen), where the single route writes its square (and a GPU a float64
    copy of that: 3x the block); a small block keeps the single route's two kernels."""
    large = Materialized(torch.empty(32, 768, 3072, device="meta"))  # GPT-2's MLP weight at batch 32
    with _LargestOutput() as record:
        norms = inner(large, large)
    assert norms.shape == (32,) and norms.dtype == torch.float64
    assert record.largest * 8 == large.values.numel() * large.values.element_size()
    small = Materialized(torch.empty(4, 256, 512, device="meta"))
    with _LargestOutput() as record:
        inner(small, small)
    assert record.largest == small.values.numel() * small.values.element_size()  # its square


def test_a_whole_float32_step_by_the_gpus_norm_route_gives_the_reference_norms_and_sum(monkeypatch) -> None:
    """The route a GPU takes for kept gradients (``grouped_squared_rows``, forced here for every block: no CPU
    chunking, no size floor) inside a real clipped step of a float32 GPT-2, self-check included: the norms
    and the clipped sum of torch.func's float64 per-example gradients, within float32's rounding."""
    import copy

    import hush_hf.clipping.factors as factors
    from hush_hf.clipping import GhostClipper, example_cross_entropy
    from tests.test_clipping_reference import (
        clipped_sum,
        lm_batch,
        norms_of,
        per_example_grads,
        reference_lm_loss,
        tiny_gpt2,
    )

    grouped = []
    monkeypatch.setattr(factors, "CHUNKED_NORM_DEVICES", frozenset())
    monkeypatch.setattr(factors, "GROUPED_NORM_FROM_BYTES", 0)
    monkeypatch.setattr(
        factors, "grouped_squared_rows", lambda b: grouped.append(b.shape) or grouped_squared_rows(b)
    )
    model = tiny_gpt2().float()
    kwargs, labels = lm_batch(True)
    loss_of = lambda out: reference_lm_loss(out.logits, labels, True)  # noqa: E731
    grads = per_example_grads(copy.deepcopy(model).double(), kwargs, loss_of)
    max_norm = float(norms_of(grads).median())
    with GhostClipper(model, max_norm) as clipper:
        for _ in range(2):  # the first call runs the self-check too
            model.zero_grad(set_to_none=True)
            norms = clipper.clipped_backward(
                example_cross_entropy(model(**kwargs).logits, labels, causal=True)
            )
            assert clipper.verified
    assert grouped  # the route ran
    torch.testing.assert_close(norms, norms_of(grads), rtol=1e-5, atol=0)
    expected = clipped_sum(grads, max_norm * (1 - 2.0**-20))
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad.double(), expected[name], rtol=1e-4, atol=1e-6)
