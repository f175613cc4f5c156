"""Per-example gradients of one use of a parameter, kept in factored ("ghost") form.

A weight used by a matrix layer on a sequence has, for example i, the gradient
``G_i = sum_t row_{i,t} col_{i,t}^T`` (ghost clipping: Li et al. 2022, "Large language models can
be strong differentially private learners"). Inner products of two such sums need only
the two (T x T') Gram matrices of their factors:

    <G_i, H_i>_F = sum_{t,s} <row_{i,t}, row'_{i,s}> <col_{i,t}, col'_{i,s}>,

so no per-example gradient of the weight's size needs to be formed (one is, when it is no larger
than its factors: ``norm_strategy``). A factor is either dense (a
(b, T, n) tensor) or one-hot (token ids: an embedding's rows), for which a Gram entry is a gather
(``<e_x, v> = v[x]``) or an equality test. Small parameters (biases, norm scales) are kept
materialised, ``(b, *param.shape)``; a per-example gradient too large to keep for the whole batch is
``Replayed``: computed for a few examples at a time whenever a norm or a weighted sum needs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hush_hf.clipping.float32_products import (
    _weighted_product_bf16,
    _weighted_product_per_example,
    aligned_self_gram,
    as_dtype,
    bf16_products,
    bmm_float32,
    float32_output_supported,
    per_example_products,
)
from hush_hf.clipping.tensor_views import as_rows, as_shape

if TYPE_CHECKING:
    from hush_hf.clipping.factor_memo import FactorMemo


@dataclass(frozen=True)
class DenseFactor:
    """Dense factor vectors ``values[i, t]`` of length n; ``values`` has shape (b, T, n)."""

    values: Tensor

    @property
    def size(self) -> int:
        return self.values.shape[-1]


@dataclass(frozen=True)
class OneHotFactor:
    """One-hot factor vectors ``e_{ids[i, t]}`` of length ``size``; ``ids`` has shape (b, T)."""

    ids: Tensor
    size: int


Factor = DenseFactor | OneHotFactor


@dataclass(frozen=True)
class OuterSum:
    """Per-example gradient ``G_i = sum_t row_{i,t} col_{i,t}^T`` of a (rows x cols) weight."""

    row: Factor
    col: Factor


@dataclass(frozen=True)
class Materialized:
    """Per-example gradient stored whole: ``values`` has shape (b, *param.shape)."""

    values: Tensor


@dataclass(frozen=True)
class Replayed:
    """Per-example gradient formed on demand, ``rows`` examples at a time: ``compute(slice)`` returns
    ``(len(slice), *param.shape)``. Norms and weighted sums loop over such chunks (``chunked``), so at
    most ``rows`` examples' gradients exist at once, whatever the parameter's size; the price is one
    recomputation per norm or sum that needs it."""

    compute: Callable[[slice], Tensor]
    batch: int
    rows: int


class ExtensionGrad:
    """A per-example gradient form defined outside this module, which supplies its own per-example inner
    product and weighted sum (e.g. ``routed.RoutedOuterSum``: an expert-indexed parameter of a
    mixture-of-experts layer). It is never materialised here, nor combined with the forms above."""

    def inner(self, other: PerExampleGrad) -> Tensor:
        """``<G_i, H_i>`` for every example, shape (b,)."""
        raise NotImplementedError

    def weighted_sum(self, weights: Tensor) -> Tensor:
        """``sum_i w_i G_i``, parameter-sized, in at least float32."""
        raise NotImplementedError


PerExampleGrad = OuterSum | Materialized | Replayed | ExtensionGrad


_AT_LEAST_FLOAT32 = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float32: torch.float32,
}


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """At least float32: Gram sums over T^2 terms lose too much in bf16/fp16. (A dict lookup for the
    common dtypes: ``torch.promote_types`` is a dispatched operation, hundreds per step.)"""
    dtype = torch.float32
    for t in tensors:
        if t.dtype not in _AT_LEAST_FLOAT32 and t.dtype.is_floating_point:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def held_bytes(g: PerExampleGrad) -> int | None:
    """The bytes of the tensors a per-example gradient holds (a factor shared with another use counted
    again); None for a form that holds what this module does not see (``Replayed``, ``ExtensionGrad``)."""
    if isinstance(g, Materialized):
        return g.values.nbytes
    if isinstance(g, OuterSum):
        return sum(f.values.nbytes if isinstance(f, DenseFactor) else f.ids.nbytes for f in (g.row, g.col))
    return None


def _dense(f: Factor) -> Tensor | None:
    return f.values if isinstance(f, DenseFactor) else None


def gram(f: Factor, h: Factor) -> Tensor:
    """Per-example Gram matrix ``K[i, t, s] = <f_{i,t}, h_{i,s}>``, shape (b, T_f, T_h)."""
    if f.size != h.size:
        raise ValueError(f"factor sizes differ: {f.size} vs {h.size}")
    if isinstance(f, DenseFactor) and isinstance(h, DenseFactor):
        dtype = compute_dtype(f.values, h.values)
        if f.values is h.values:
            aligned = aligned_self_gram(f.values)  # a vocabulary-wide bf16 factor, misaligned, on CUDA
            if aligned is not None:
                return aligned
            if not float32_output_supported(f.values, h.values):
                values = as_dtype(f.values, dtype)  # one widened copy for both sides of a squared norm
                return torch.bmm(values, values.transpose(1, 2))
        return bmm_float32(f.values, h.values.transpose(1, 2), dtype)
    if isinstance(f, OneHotFactor) and isinstance(h, OneHotFactor):
        return (f.ids[:, :, None] == h.ids[:, None, :]).to(torch.float32)
    if isinstance(f, OneHotFactor):
        return gram(h, f).transpose(1, 2)
    # f dense (b, T, n), h one-hot (b, S): <f_t, e_{x_s}> = f_t[x_s], gathered as stored and widened after
    # (exact): widening first made a float32 copy of all of f, a tied output layer's whole logits gradient.
    values = f.values
    b, t_len = values.shape[:2]
    index = h.ids[:, None, :].expand(b, t_len, h.ids.shape[1])
    return as_dtype(torch.gather(values, 2, index), compute_dtype(values))


def _contract_col(m: Tensor, col: Factor) -> Tensor:
    """``(M_i c_{i,t})`` for every t: shape (b, T, rows)."""
    if isinstance(col, DenseFactor):
        return torch.einsum("brk,btk->btr", m, as_dtype(col.values, m.dtype))
    b, rows = m.shape[:2]
    index = col.ids[:, None, :].expand(b, rows, col.ids.shape[1])
    return torch.gather(m, 2, index).transpose(1, 2)


def _inner_materialized_outer(m: Materialized, g: OuterSum) -> Tensor:
    """``<M_i, sum_t r_t c_t^T> = sum_t r_t^T M_i c_t`` without materialising G."""
    dtype = compute_dtype(m.values, *(f.values for f in (g.row, g.col) if isinstance(f, DenseFactor)))
    values = as_dtype(m.values, dtype)
    if values.dim() != 3:
        raise ValueError(f"a factored gradient needs a 2-D parameter, got shape {tuple(values.shape[1:])}")
    mc = _contract_col(values, g.col)  # (b, T, rows)
    if isinstance(g.row, DenseFactor):
        return exact_sum(mc * as_dtype(g.row.values, dtype), dim=(1, 2))
    return exact_sum(torch.gather(mc, 2, g.row.ids[:, :, None]), dim=(1, 2))


def exact_sum(terms: Tensor, dim: int | tuple[int, ...]) -> Tensor:
    """``terms`` summed over ``dim``, accumulated in float64 (one reduction, no widened copy).

    The terms of a squared norm are products rounded once each (relative 2^-24 in float32); their sum
    must not lose more than the clip margin (``CLIP_MARGINS``, 2^-20 in float32). A float32 batched dot
    (``bmm`` of (1 x N) by (N x 1)) sums sequentially on CPU: measured relative error 6.7e-6 at 65,536
    terms, 3.7e-4 at 796,928, 3.5e-3 at 4e6 (norms too small, so examples under-clipped); a float32
    ``sum`` 5e-8 to 8e-8; with float64 accumulation under 1e-9 (tests/test_clipping_factors.py)."""
    return torch.sum(terms, dim=dim, dtype=torch.float64)


def _gram_dot(k_row: Tensor, k_col: Tensor) -> Tensor:
    """``sum_{t,s} K_row[i, t, s] K_col[i, t, s]`` for every example, summed in float64 (``exact_sum``)."""
    dtype = compute_dtype(k_row, k_col)  # a dict lookup, not a dispatched promote_types
    return exact_sum(as_dtype(k_row, dtype) * as_dtype(k_col, dtype), dim=(1, 2))


def inner(g: PerExampleGrad, h: PerExampleGrad) -> Tensor:
    """Per-example Frobenius inner product ``<G_i, H_i>``, shape (b,)."""
    if isinstance(g, ExtensionGrad):
        return g.inner(h)
    if isinstance(h, ExtensionGrad):
        return h.inner(g)
    if isinstance(g, OuterSum) and isinstance(h, OuterSum):
        return _gram_dot(gram(g.row, h.row), gram(g.col, h.col))
    if isinstance(g, Materialized) and g is h:
        return squared_rows(g.values.flatten(1))
    if isinstance(g, Materialized) and isinstance(h, Materialized):
        dtype = compute_dtype(g.values, h.values)
        return exact_sum(as_dtype(g.values, dtype).flatten(1) * as_dtype(h.values, dtype).flatten(1), dim=1)
    if isinstance(g, Materialized):
        return _inner_materialized_outer(g, h)
    return _inner_materialized_outer(h, g)


def materialize(g: OuterSum) -> Materialized:
    """``G_i = sum_t row_{i,t} col_{i,t}^T`` formed explicitly: one batched matmul, (b, rows, cols)."""
    row, col = _dense(g.row), _dense(g.col)
    if row is None or col is None:
        raise ValueError("only a gradient with two dense factors is materialised (never a one-hot side)")
    return Materialized(bmm_float32(row.transpose(1, 2), col, compute_dtype(row, col)))


MATERIALIZE_BYTES_RATIO = Fraction(5, 4)
"""A use's per-example gradient is formed and kept when it takes at most this many times the bytes of
the float32 (or wider) factors it replaces (``norm_strategy``): the memory a step's clipping holds
against the time of its norms' Gram matrices."""

_MATERIALIZE_NUM_DEN = MATERIALIZE_BYTES_RATIO.as_integer_ratio()
_HALF_DTYPES = frozenset({torch.bfloat16, torch.float16})


def norm_strategy(
    uses: Sequence[PerExampleGrad],
    never_materialize_dim: int | None = None,
    *,
    beyond_factors: bool = True,
) -> str:
    """``"materialize"`` or ``"ghost"``: how to get one parameter's per-example norm and clipped sum.

    Mixed ghost clipping (Bu et al. 2023, "Differentially private optimization on large model at
    small cost", Sec. 4), per example, for uses with T_u steps of a (rows x cols) weight:
    ghost: the norm from Gram matrices, ``sum_{u<=v} T_u T_v (rows + cols)``, then the clipped sum
    from the factors, one ``(sum_u T_u) rows cols`` matmul; materialise: ``G = sum_u row_u^T col_u``
    formed once, ``(sum_u T_u) rows cols``, kept in place of the factors (``combine_uses``), so the
    norm and the clipped sum ``sum_i c_i G_i`` (``rows cols``) are read off it. Materialising saves the
    Gram matrices' FLOPs and costs a few passes over the (b, rows, cols) tensor (kept in at least
    float32: formed, squared and summed for the norm, weighted for the sum). It is chosen when that
    tensor takes at most the bytes of the factors it replaces, ``rows cols <= (sum_u T_u)(rows + cols)``
    in float32, so it never raises the memory; and, for float32 (or wider) factors, up to
    ``MATERIALIZE_BYTES_RATIO`` = 5/4 of them. There the Gram matrices it saves cost at least 4/5 of a
    weight gradient's FLOPs, and, under TF32 as at full float32, as much again in memory traffic: the
    factors stacked for batched products (``gram_batches``), the Gram pairs multiplied and summed in
    float64. GPT-2 124M at T = 512 keeps every layer's weights: 1.23x -> 1.07x the plain step's matrix
    FLOPs (``bench/step_flops.py``), and a step predicted at 1.09-1.10x in fp32 and 1.11-1.14x in TF32
    (was 1.18-1.22x) from each kernel's FLOPs and bytes (``bench/step_roofline.py``). bf16/fp16 factors
    only up to their bytes: the kept gradient is float32, twice their bytes a value. Only when every use
    has two dense factors of one shape (a one-hot side is an embedding table: its rows are a
    vocabulary) and neither side reaches ``never_materialize_dim`` (the model's vocabulary): no
    per-example tensor with a vocabulary-sized dimension is ever formed. ``beyond_factors=False``: only
    up to the factors' own bytes, whatever their dtype.
    """
    # One pass over the uses: a few hundred a step, each decided twice (its zero steps, its form), and
    # host work that a GPU step waits on.
    rows = cols = -1
    factor_bytes = 0
    for g in uses:
        sides = (g.row, g.col) if isinstance(g, OuterSum) else (None, None)
        if not (isinstance(sides[0], DenseFactor) and isinstance(sides[1], DenseFactor)):
            return "ghost"
        row, col = sides[0].values, sides[1].values
        if rows < 0:
            rows, cols = row.shape[-1], col.shape[-1]
        elif (row.shape[-1], col.shape[-1]) != (rows, cols):
            return "ghost"
        factor_bytes += math.prod(row.shape[1:]) * row.element_size()
        factor_bytes += math.prod(col.shape[1:]) * col.element_size()
    if rows < 0 or (never_materialize_dim is not None and max(rows, cols) >= never_materialize_dim):
        return "ghost"
    # Kept in at least float32 (and refused, as the products would be, for a dtype with no promotion).
    values = [f.values for g in uses for f in (g.row, g.col)]  # type: ignore[union-attr]
    dtype = compute_dtype(*values)
    held = rows * cols * dtype.itemsize
    if held <= factor_bytes:
        return "materialize"
    if not beyond_factors:
        return "ghost"
    num, den = _MATERIALIZE_NUM_DEN  # integers, not Fraction arithmetic: a few hundred calls a micro-batch
    if held * den > factor_bytes * num:
        return "ghost"
    return "ghost" if any(v.dtype in _HALF_DTYPES for v in values) else "materialize"


def combine_uses(
    uses: Sequence[PerExampleGrad], never_materialize_dim: int | None = None
) -> list[PerExampleGrad]:
    """The uses of one parameter in the form its norm and clipped sum are taken from: one
    ``Materialized`` sum of all uses when ``norm_strategy`` says so (the factors can then be freed),
    else the uses unchanged (ghost form)."""
    if norm_strategy(uses, never_materialize_dim) != "materialize":
        return list(uses)
    total = materialize(uses[0]).values  # type: ignore[arg-type]
    for g in uses[1:]:
        total += materialize(g).values  # type: ignore[arg-type]
    return [Materialized(total)]


def _take_examples(g: PerExampleGrad, rows: slice) -> PerExampleGrad:
    """The per-example gradient of the examples ``rows`` only (a ``Replayed`` one is computed now)."""
    if isinstance(g, Replayed):
        return Materialized(g.compute(rows))
    if isinstance(g, ExtensionGrad):  # e.g. an expert weight also used by a rule-less (replayed) layer
        raise ValueError(
            f"a parameter with a {type(g).__name__} use cannot also be used by a layer on the chunked "
            "generic path: not supported"
        )
    if isinstance(g, Materialized):
        return Materialized(g.values[rows])
    return OuterSum(*(
        DenseFactor(f.values[rows]) if isinstance(f, DenseFactor) else OneHotFactor(f.ids[rows], f.size)
        for f in (g.row, g.col)
    ))  # fmt: skip


def chunked(uses: Sequence[PerExampleGrad]) -> _Chunks | None:
    """None when no use is ``Replayed``; else the uses restricted to consecutive chunks of examples, as
    (rows, uses) pairs, each chunk as small as the smallest ``Replayed.rows``."""
    replayed = [u for u in uses if isinstance(u, Replayed)]
    if not replayed:
        return None
    step, batch = min(u.rows for u in replayed), replayed[0].batch
    return _Chunks(list(uses), step, batch)


class _Chunks:
    """Iterates (rows, the uses of those examples), computing each chunk when it is reached, so that one
    chunk's replayed gradients exist at a time."""

    def __init__(self, uses: list[PerExampleGrad], step: int, batch: int) -> None:
        self.uses, self.step, self.batch = uses, max(1, step), batch

    def __iter__(self):
        for start in range(0, self.batch, self.step):
            rows = slice(start, min(start + self.step, self.batch))
            yield rows, [_take_examples(u, rows) for u in self.uses]


def squared_norm_of_sum(
    uses: Sequence[PerExampleGrad],
    never_materialize_dim: int | None = None,
    *,
    clamp: bool = True,
    combined: bool = False,
    grams: FactorMemo | None = None,
) -> Tensor:
    """``||sum_u G_{u,i}||^2 = sum_u ||G_{u,i}||^2 + 2 sum_{u<v} <G_{u,i}, G_{v,i}>``, shape (b,).

    One entry per use of one parameter in the forward pass. With several uses (tied weights: an
    embedding reused as the output projection) the cross terms are what makes the norm exact;
    leaving them out can under-estimate it, which would void the clipping bound. Computed the
    cheaper way (``norm_strategy``): from the factors' Gram matrices, or by materialising the
    per-example gradient for that moment only (the factors stay what the clipped sum is built from).
    ``clamp=False`` leaves out the final ``clamp_min(0)`` (for a caller that clamps many at once);
    ``combined=True``: the uses are ``combine_uses``'s result already (not decided again); ``grams``:
    where a factored use's own Gram matrices come from (shared with other parameters' uses).
    """
    if not uses:
        raise ValueError("squared_norm_of_sum needs at least one use")
    chunks = chunked(uses)
    if chunks is not None:
        parts = [squared_norm_of_sum(part, never_materialize_dim, clamp=clamp) for _, part in chunks]
        return torch.cat(parts)
    if not combined:
        uses = combine_uses(uses, never_materialize_dim)
    total: Tensor | None = None
    for u, g in enumerate(uses):
        for v in range(u, len(uses)):
            if u == v and grams is not None and isinstance(g, OuterSum):
                term = _gram_dot(grams.gram(g.row), grams.gram(g.col))
            else:
                term = inner(g, uses[v])
            term = term if u == v else 2.0 * term
            total = term if total is None else total + term
    # Exact value is >= 0; rounding can leave a tiny negative only when the norm itself is ~0. (With
    # ``clamp=False`` the caller clamps, e.g. all parameters' terms at once.)
    assert total is not None
    return total.clamp_min(0.0) if clamp else total


def _weighted_rows(f: Factor, weights: Tensor, dtype: torch.dtype) -> Tensor:
    """Dense factor vectors scaled by their example's weight, flattened to (b*T, n), in ``dtype`` (at
    least the factor's). The product widens the factor itself (the same numbers as widening it first:
    a bf16 value is exact in float32), so no widened copy of the factor is dispatched."""
    assert isinstance(f, DenseFactor)
    values = f.values * as_dtype(weights, dtype).view(-1, 1, 1)  # one view, not two unsqueezes
    return values.reshape(-1, values.shape[-1])


def _dense_pair_route(g: PerExampleGrad) -> tuple[str, Tensor, Tensor, torch.dtype] | None:
    """For an ``OuterSum`` of two dense factors: (route, narrower, wider values, dtype) of its clipped
    sum, route ``"examples"`` (two bf16 factors on CUDA whose per-example products are large GEMMs,
    ``_weighted_product_per_example``), ``"pieces"`` (other bf16 factors on CUDA,
    ``_weighted_product_bf16``) or ``"scaled"`` (the weights folded into the narrower factor, the other
    widened); else None."""
    if not (isinstance(g, OuterSum) and isinstance(g.row, DenseFactor) and isinstance(g.col, DenseFactor)):
        return None
    row, col = g.row.values, g.col.values
    dtype = compute_dtype(row, col)
    narrow, wide = (row, col) if row.shape[-1] <= col.shape[-1] else (col, row)
    route = "scaled"
    if dtype == torch.float32 and bf16_products(row, col):
        route = "examples" if per_example_products(row, col) else "pieces"
    return route, narrow, wide, dtype


def _derived(memo: FactorMemo | None, kind: str, values: Tensor, compute: Callable[[], Tensor]) -> Tensor:
    return compute() if memo is None else memo.get(kind, values, compute)


def weighted_sum(g: PerExampleGrad, weights: Tensor, memo: FactorMemo | None = None) -> Tensor:
    """``sum_i w_i G_i``, one parameter-sized tensor in at least float32 (no per-example tensor).

    For an ``OuterSum`` this is ``sum_{i,t} w_i row_{i,t} col_{i,t}^T``: one (rows x b*T) @ (b*T x cols)
    product for dense factors, a scatter-add of rows for a one-hot factor (an embedding's rows).
    With ``w_i = c_i`` it is the clipped sum that ``GhostClipper.clipped_backward`` adds to ``p.grad``
    (book-keeping: c_i folded into the factor, one matmul; no second backward pass). ``memo``: where a
    factor's clip-weighted or widened form comes from when other uses share it (the same ``weights``
    for all of them; ``factor_memo.sum_requests``).
    """
    if isinstance(g, ExtensionGrad):
        return g.weighted_sum(weights)
    if isinstance(g, Replayed):
        total: Tensor | None = None
        for rows, (part,) in _Chunks([g], g.rows, g.batch):
            term = weighted_sum(part, weights[rows])
            total = term if total is None else total.add_(term)
        assert total is not None
        return total
    if isinstance(g, Materialized):
        dtype = compute_dtype(g.values)
        values = as_dtype(g.values, dtype)
        total = as_dtype(weights, dtype)[None, :] @ values.reshape(values.shape[0], -1)
        return total.reshape(values.shape[1:])
    row, col = g.row, g.col
    dtype = compute_dtype(*(f.values for f in (row, col) if isinstance(f, DenseFactor)))
    device = weights.device
    found = _dense_pair_route(g)
    if found is not None:
        route, narrow, wide, _ = found
        if route == "examples":
            return _weighted_product_per_example(row.values, col.values, weights)
        if route == "pieces":
            return _weighted_product_bf16(row.values, col.values, weights, memo)
        # Fold the weights into the narrower factor (for an output projection: the hidden states,
        # not the vocabulary-wide logits gradient): a smaller scaled copy, the same one matmul.
        scaled = _derived(memo, "scaled", narrow, lambda: _weighted_rows(DenseFactor(narrow), weights, dtype))
        widened = _derived(memo, "widened", wide, lambda: as_dtype(wide, dtype)).reshape(-1, wide.shape[-1])
        return scaled.T @ widened if narrow is row.values else widened.T @ scaled
    out = torch.zeros(row.size, col.size, dtype=dtype, device=device)
    if isinstance(row, OneHotFactor) and isinstance(col, DenseFactor):
        return out.index_add_(0, row.ids.reshape(-1), _weighted_rows(col, weights, dtype))
    if isinstance(row, DenseFactor) and isinstance(col, OneHotFactor):
        return out.index_add_(1, col.ids.reshape(-1), _weighted_rows(row, weights, dtype).T)
    assert isinstance(row, OneHotFactor) and isinstance(col, OneHotFactor)
    w = as_dtype(weights, dtype)[:, None].expand(row.ids.shape).reshape(-1)
    return out.index_put_((row.ids.reshape(-1), col.ids.reshape(-1)), w, accumulate=True)


PACK_BELOW = 2**16
"""``pack_small`` packs a parameter whose per-example gradient is stored whole with at most this many
values per example (biases, norm scales, small attention and router weights)."""

JOIN_BELOW = {"cpu": 2**12}
"""By device type: packed parameters with at most this many values per example are copied side by side
into one block (one norm and one product for all biases and norm scales); larger ones stay blocks of
their own, as stored (on CPU a copy of them costs as much as their norm). Other devices join every
packed parameter (``PACK_BELOW``): there each block is a kernel launch or two, and LoRA's adapters
(r x d, e.g. 16 x 2048) are hundreds of small blocks."""

CHUNKED_NORM_DEVICES = frozenset({"cpu"})
"""Device types on which ``squared_rows`` takes a block's columns a cache-sized chunk at a time; elsewhere
(GPUs) a block streams whole, grouped when large (``grouped_squared_rows``)."""

_NORM_CHUNK_BYTES = 2**19
"""``Packed.squared_norms`` on CPU squares this many bytes at a time, in cache (16 x 796,928 values, one
thread: 13 ms, against 119 ms for the whole square at once and 227 ms widening it to float64 first)."""


def squared_rows(block: Tensor) -> Tensor:
    """``sum_j block[i, j]^2`` for every row i of a (b, N) block, shape (b,): each value squared in (at
    least) float32, the squares summed in float64 (``exact_sum``); all terms are >= 0, so the sum loses
    no more than each square's rounding, 2^-24 relative in float32. On CPU a cache-sized chunk of
    columns at a time (``_NORM_CHUNK_BYTES``): no batch-wide temporary, nor its float64 copy
    (``torch.sum`` with ``dtype=float64`` converts its input first). Elsewhere a large float32 block
    takes ``grouped_squared_rows``: a GPU streams it once instead of seven times."""
    dtype = compute_dtype(block)
    width = block.shape[1]
    on_cpu = block.device.type in CHUNKED_NORM_DEVICES
    if (
        not on_cpu
        and block.dtype == torch.float32
        and width >= NORM_GROUP
        and block.numel() * 4 >= GROUPED_NORM_FROM_BYTES
    ):
        return grouped_squared_rows(block)
    step = max(1, _NORM_CHUNK_BYTES // (4 * max(1, block.shape[0])) if on_cpu else width)
    total: Tensor | None = None
    for start in range(0, max(width, 1), step):
        part = as_dtype(block[:, start : start + step], dtype)
        term = exact_sum(part * part, dim=1)
        total = term if total is None else total.add_(term)
    assert total is not None
    return total


NORM_GROUP = 8
"""``grouped_squared_rows`` adds this many squares in float32 before it widens the partial sums."""

GROUPED_NORM_FROM_BYTES = 2**23
"""Off CPU, ``squared_rows`` groups a float32 block of at least this many bytes (a kept weight gradient:
GPT-2's 768 x 3072 at batch 32 is 302 MB); smaller ones keep two kernels, not four."""


def grouped_squared_rows(block: Tensor) -> Tensor:
    """``sum_j block[i, j]^2`` for a float32 (b, N) block, shape (b,) in float64, in one pass over it.

    With ``M = N // 8``, partial k sums the squares of columns k, k + M, ..., k + 7M (strided: a GPU reads
    them coalesced); the last ``N % 8`` columns are summed on their own. One fused ``vector_norm`` gives
    every ``s_k = sqrt(partial k)`` in float32, and ``sum_k s_k^2`` is summed in float64 (``exact_sum``)
    over an eighth of the values. The single route (``x * x``, its float64 copy, the sum) writes 3x the
    block and reads it 4x; this reads it once and writes under half of its size in all.

    Error, all terms >= 0 so any summation order is bounded relative to the sum: a group's 8 squares
    and 7 additions lose at most ``gamma_8 <= 8u`` (u = 2^-24), the square root and the square of the
    result another ``3u`` (both correctly rounded), so each partial, and hence the total, is within
    ``11.1u`` (about 2^-20.5) of the exact squared norm, and the norm within 2^-21.5: under float32's
    clip margin 2^-20 (``layer_calls.CLIP_MARGINS``) with what the other routes' rounding spends (2^-24).
    ``N >= 8``; the block may be a view."""
    b, width = block.shape
    whole = width - width % NORM_GROUP
    partial = torch.linalg.vector_norm(block[:, :whole].reshape(b, NORM_GROUP, -1), dim=1)
    total = exact_sum(partial.square_(), dim=1)
    if whole < width:
        tail = block[:, whole:]
        total.add_(exact_sum(tail * tail, dim=1))
    return total


@dataclass(frozen=True)
class Packed:
    """The whole-stored per-example gradients of several parameters: ``blocks`` of shape (b, N_j), the
    parameters' values side by side in ``names`` order (each block either the small ones, joined, or one
    larger one, unchanged). One norm pass and one clipped-sum product per block instead of a few small
    operations per parameter (each a kernel launch on a GPU)."""

    blocks: tuple[Tensor, ...]
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]

    def squared_norms(self) -> Tensor:
        """``sum_k ||G_{k,i}||^2`` over the packed parameters, shape (b,): each value squared in (at least)
        float32, the squares summed in float64 (``exact_sum``). The terms are all >= 0, so the sum loses
        no more than each product's rounding, 2^-24 relative in float32. On CPU the columns are taken a
        cache-sized chunk at a time (no batch-wide temporary)."""
        total = squared_rows(self.blocks[0])
        for block in self.blocks[1:]:
            total.add_(squared_rows(block))
        return total

    def weighted_sums(self, weights: Tensor) -> dict[str, Tensor]:
        """``sum_i w_i G_{k,i}`` for every packed parameter k: one (1 x b) @ (b x N_j) product per block, in
        at least float32, split into views shaped like the parameters (a bias's part is one as it is)."""
        wide = [as_dtype(block, compute_dtype(block)) for block in self.blocks]
        total = torch.cat([(as_dtype(weights, b.dtype)[None, :] @ b).flatten() for b in wide])
        parts = torch.split(total, [math.prod(shape) for shape in self.shapes])
        return {n: as_shape(p, s) for n, p, s in zip(self.names, parts, self.shapes, strict=True)}


def pack_small(uses: dict[str, list[PerExampleGrad]]) -> Packed | None:
    """Moves every parameter whose uses are one ``Materialized`` gradient of at most ``PACK_BELOW``
    values per example out of ``uses`` into one ``Packed`` (None when there is none): those of at most
    ``JOIN_BELOW`` values (for their device) joined into one block (in at least float32), each larger one
    a block of its own (not copied). Exact: the packed columns are the same numbers; the norms of the
    rest are unchanged."""
    names = [
        name
        for name, found in uses.items()
        if len(found) == 1
        and isinstance(found[0], Materialized)
        and found[0].values.dim() >= 2
        and math.prod(found[0].values.shape[1:]) <= PACK_BELOW
    ]
    if not names:
        return None
    parts = {name: uses.pop(name)[0].values for name in names}  # type: ignore[union-attr]
    join_below = JOIN_BELOW.get(parts[names[0]].device.type, PACK_BELOW)
    small = [n for n in names if math.prod(parts[n].shape[1:]) <= join_below]
    large = [n for n in names if n not in small]
    blocks: list[Tensor] = []
    if small:
        dtype = compute_dtype(*(parts[n] for n in small))
        joined = [as_rows(parts[n]) for n in small]
        blocks.append(as_dtype(joined[0] if len(joined) == 1 else torch.cat(joined, dim=1), dtype))
    blocks += [as_rows(parts[n]) for n in large]
    order = tuple(small + large)
    return Packed(tuple(blocks), order, tuple(parts[n].shape[1:] for n in order))
