"""Float32 results from narrow (bf16/fp16) operands: the matrix products of the clipping engine.

Every per-example norm and clipped sum is computed in at least float32 (``factors.compute_dtype``).
A product of two bf16 (or fp16) numbers is exact in float32, so a bf16 GEMM with float32 accumulation
and output gives what float32 copies of its operands would, without the copies: ``out_dtype``, which
torch 2.13 has for CUDA only (``_mm_out_float32``, ``_bmm_out_float32``: the engine's only CUDA-only
calls; ``bench/op_census.py --cuda-routes`` replaces them to count a GPU's step). Elsewhere the
operands are widened first. A clipped sum of two bf16 factors folds its weights, cut to bf16's 8
significant bits toward zero, into the narrower factor and splits that exactly into two bf16 pieces
(``_weighted_product_bf16``); where one example's product is a large GEMM, it takes one GEMM per example
instead, scaled by its weight in cuBLAS's float32 epilogue (``_weighted_product_per_example``; CUDA
only, ``_addmm_out_float32``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import Tensor


def as_dtype(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t.to(dtype)``, without the call when t has that dtype already (a no-op ``to`` still costs a
    Python call and a dispatch; the engine made hundreds per micro-batch)."""
    return t if t.dtype == dtype else t.to(dtype)


def float32_output_supported(a: Tensor, b: Tensor) -> bool:
    """Whether ``torch.bmm``/``torch.mm`` can take these bf16/fp16 operands as they are and return float32
    (``out_dtype``: cuBLAS accumulates in float32; CUDA only in torch 2.13)."""
    return a.is_cuda and a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16)


def bf16_products(a: Tensor, b: Tensor) -> bool:
    """Whether a weighted sum of these two factors takes the bf16 route (``_weighted_product_bf16``):
    two bf16 factors on CUDA."""
    return a.dtype == torch.bfloat16 and float32_output_supported(a, b)


def mm_float32(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of two bf16 matrices with float32 accumulation and output: ``out_dtype`` on CUDA, float32
    copies elsewhere (the same numbers: each product of two bf16 numbers is exact in float32)."""
    if float32_output_supported(a, b):
        return _mm_out_float32(a, b)
    return torch.mm(a.float(), b.float())


def _mm_out_float32(a: Tensor, b: Tensor) -> Tensor:
    """CUDA only: ``torch.mm`` of two bf16/fp16 matrices with float32 accumulation and output."""
    return torch.mm(a, b, out_dtype=torch.float32)


def _bmm_out_float32(a: Tensor, b: Tensor) -> Tensor:
    """CUDA only: ``torch.bmm`` of two bf16/fp16 batches with float32 accumulation and output."""
    return torch.bmm(a, b, out_dtype=torch.float32)


def _addmm_out_float32(out: Tensor, a: Tensor, b: Tensor, alpha: float, beta: int) -> Tensor:
    """CUDA only: ``out <- beta out + alpha (a @ b)`` in place, two bf16/fp16 matrices with float32
    accumulation, scaled and added to the float32 ``out`` in cuBLAS's float32 epilogue."""
    return torch.addmm(out, a, b, out_dtype=torch.float32, beta=beta, alpha=alpha, out=out)


@cache
def _accumulates_in_float32(device: torch.device) -> bool:
    """Whether this torch's ``addmm`` takes a float32 ``out`` (and input) with bf16 operands on
    ``device`` and does what ``_weighted_product_per_example`` needs of it (newer than the ``out_dtype``
    products: older versions want the input in the operands' dtype and raise). Asked once per device,
    with 1 x 1 products: beta = 0 writes 0.5 over a NaN, beta = 1 adds 0.25 to it."""
    one = torch.ones(1, 1, dtype=torch.bfloat16, device=device)
    out = torch.full((1, 1), float("nan"), device=device)
    try:
        first = _addmm_out_float32(out, one, one, alpha=0.5, beta=0).tolist()
        second = _addmm_out_float32(out, one, one, alpha=0.25, beta=1).tolist()
    except (RuntimeError, TypeError):
        return False
    return first == [[0.5]] and second == [[0.75]]


def bf16_pieces(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Three bf16 tensors whose sum is the float32 ``x`` exactly: ``hi = bf16(x)``, ``mid = bf16(x - hi)``,
    ``lo = bf16(x - hi - mid)``. Each difference is exact in float32 and the last one fits bf16's 8
    significant bits (24 = 3 x 8, and bf16 has float32's exponent range); values below 2^-126 aside."""
    hi = x.to(torch.bfloat16)
    rest = x - hi
    mid = rest.to(torch.bfloat16)
    return hi, mid, (rest - mid).to(torch.bfloat16)


def bf16_pieces_side_by_side(x: Tensor, pieces: int = 3) -> Tensor:
    """``bf16_pieces(x)`` of a (N, n) float32 ``x`` written side by side into one (N, 3 n) bf16 tensor
    (hi, mid, lo of row k in columns 0:n, n:2n, 2n:3n): the same numbers (``copy_`` rounds to nearest as
    ``Tensor.to`` does; the differences are exact), with no separate piece tensors. ``pieces=2``: hi and
    lo only, (N, 2 n), exact when x has at most 16 significant bits (a bf16 value times a
    ``bf16_toward_zero`` weight): x - hi is then a multiple of x's last bit of at most 2^7 of them.
    Values below about 2^-118 aside, where the last piece falls under bf16's subnormal grid (2^-133)
    and rounds: by at most 2^-134 an entry, far inside the clip margin (2^-6 C) for any C in use."""
    n = x.shape[-1]
    out = torch.empty(x.shape[0], pieces * n, dtype=torch.bfloat16, device=x.device)
    hi = out[:, :n]
    hi.copy_(x)
    rest = x - hi  # float32 - bf16: exact, in float32
    if pieces == 3:
        mid = out[:, n : 2 * n]
        mid.copy_(rest)
        rest -= mid
    out[:, (pieces - 1) * n :].copy_(rest)
    return out


def bf16_toward_zero(weights: Tensor) -> Tensor:
    """Float32 ``weights`` cut to bf16's 8 significant bits toward zero (the top 16 bits of each float32):
    ``|w~| <= |w|``, less by under 2^-7 relative, exact for 1 and powers of two. A bf16 value times such a
    weight has at most 16 significant bits: exact in float32, and in two bf16 pieces. The bf16 routes
    weight a parameter's sum by ``w~`` instead of the clip coefficients c_i: ``||(c~_i g_{i,p})_p|| <=
    ||c_i g_i|| <= C`` whichever parameters take it, so the sensitivity the noise is calibrated to holds.
    For finite weights (clip coefficients are: a NaN norm gives 1, an infinite one 0); a NaN whose
    payload lies in the low 16 bits would become an infinity."""
    w = weights.float()
    if weights.dtype == torch.float64:  # the float32 cast may round up (1 - 1e-9 becomes 1): step back
        w = torch.where(w.double().abs() > weights.abs(), torch.nextafter(w, torch.zeros_like(w)), w)
    return (w.view(torch.int32) & -65536).view(torch.float32)


EXAMPLE_TOKENS = 512
"""``per_example_products``: at least this many positions per example. One example's product then
reads and writes its float32 result (8 bytes an entry) in less time than the pieces route's second
GEMM takes (2 T FLOPs an entry): T > 2 R / W, 300 to 400 on H100/H200-class GPUs (R ~ 700 TFLOP/s
of bf16 GEMM, W ~ 3.4-4.8 TB/s)."""

EXAMPLE_WORK = 3 * 2**28
"""``per_example_products``: at least this many multiply-adds (T n m) per example's product, 1.6 GFLOP:
about 2.3 us of an H100/H200's bf16 GEMM (~700 TFLOP/s), what the pieces route's second piece costs
for that example. One product per example then takes at least a kernel's least time (a few
microseconds) and less than the two pieces' GEMM does for it. (GPT-2's query-key-value weight at 512
positions is above it; its attention output and Llama-1B's grouped key and value weights are not.)"""


def per_example_products(row: Tensor, col: Tensor) -> bool:
    """Whether the weighted sum of two bf16 (b, T, n) and (b, T, m) factors that take the bf16 route
    (``bf16_products``, the caller's test) takes one GEMM per example (``_weighted_product_per_example``):
    where ``addmm`` accumulates in float32, when each example's product is large (``EXAMPLE_TOKENS``,
    ``EXAMPLE_WORK``). Shapes decide, not the batch size."""
    t = row.shape[-2]
    return (
        t >= EXAMPLE_TOKENS
        and t * row.shape[-1] * col.shape[-1] >= EXAMPLE_WORK
        and _accumulates_in_float32(row.device)
    )


class _HostWeights:
    """The last weights read to the host: ``bf16_toward_zero(weights)`` as Python floats, read once (one
    device-to-host copy, a sync on a GPU) for every per-example product of a micro-batch that scales by
    them. Matched by identity and version; the tensor is held, so its identity is not reused. One
    assignment of (tensor, version, values), so that a thread never gets another's values."""

    last: tuple[Tensor | None, int, list[float]] = (None, -1, [])

    @classmethod
    def of(cls, weights: Tensor) -> list[float]:
        held, version, values = cls.last
        if weights is not held or weights._version != version:
            values = bf16_toward_zero(weights).tolist()
            cls.last = (weights, weights._version, values)
        return values


class _AlignedRows:
    """One example's (T, n) slice of a factor as it is, or, where a row's bytes are not a multiple of 16
    (GPT-2's, BERT's and RoBERTa's vocabularies: 50,257, 30,522, 50,265), copied into one buffer whose
    rows are padded to 16 bytes, reused for every example. A GEMM operand whose leading dimension is not
    16-byte aligned cannot take Hopper's TMA-fed kernels: on the H200 both contenders' vocabulary-wide
    products ran on cuBLAS's older kernels at a quarter of the bf16 rate. One example's copy (T n entries
    read and written) costs a small part of its product (2 T n m FLOPs). The same values; the next copy
    is queued after the product that reads the buffer, on the same stream."""

    def __init__(self, factor: Tensor) -> None:
        n, itemsize = factor.shape[-1], factor.element_size()
        self.buffer: Tensor | None = None
        # where the factor, each example and each row start, in bytes
        starts = (factor.data_ptr(), factor.stride(0) * itemsize, factor.stride(1) * itemsize)
        if factor.stride(-1) != 1 or any(offset % 16 for offset in starts):
            padded = -(-n * itemsize // 16) * 16 // itemsize  # entries in whole 16-byte units
            buffer = torch.empty(factor.shape[-2], padded, dtype=factor.dtype, device=factor.device)
            self.buffer = buffer[:, :n]

    def __call__(self, example: Tensor) -> Tensor:
        return example if self.buffer is None else self.buffer.copy_(example)


def aligned_self_gram(values: Tensor) -> Tensor | None:
    """``values_i values_i^T`` of a (b, T, n) bf16 factor on CUDA, (b, T, T) in float32, one example at a
    time from an aligned copy of its rows (``_AlignedRows``), where its rows are not 16-byte aligned and
    one example's product is large (T^2 n >= ``EXAMPLE_WORK``: a vocabulary-wide logits gradient); else
    None, and the batched product is the route. The same numbers as that product."""
    t, n = values.shape[-2:]
    if t * t * n < EXAMPLE_WORK or not float32_output_supported(values, values):
        return None
    rows = _AlignedRows(values)
    if rows.buffer is None:
        return None
    return torch.stack([_mm_out_float32(rows(x), rows.buffer.T) for x in values.unbind(0)])


@torch.no_grad()  # out= refuses inputs that require grad; the factors are detached anyway
def _weighted_product_per_example(row: Tensor, col: Tensor, weights: Tensor) -> Tensor:
    """``sum_i w~_i row_i^T col_i`` of two bf16 (b, T, n) and (b, T, m) factors, ``w~ =
    bf16_toward_zero(weights)``, in float32, (n, m): one GEMM per example with a non-zero weight, bf16
    operands with float32 accumulation, whose float32 result cuBLAS scales by w~_i and adds to the
    running sum in its float32 epilogue (``_addmm_out_float32``, beta = 1 after the first). Each
    example's scaled product rounds once per entry, relative 2^-24, like the float32 route's scaled
    factor; no scaled copy, no pieces, and a weight gradient's FLOPs once instead of twice. The weights
    come to the host once per micro-batch (``_HostWeights``); a factor whose rows are not 16-byte aligned
    is multiplied from an aligned copy, an example at a time (``_AlignedRows``). The same numbers as the
    other routes with weights w~, up to float32 accumulation order."""
    out = torch.empty(row.shape[-1], col.shape[-1], dtype=torch.float32, device=row.device)
    beta = 0  # the first product writes ``out`` without reading it (cuBLAS ignores C when beta is 0)
    rows, cols = _AlignedRows(row), _AlignedRows(col)
    # unbind: every example's view in one call (the host issues one product per example)
    for w, r, c in zip(_HostWeights.of(weights), row.unbind(0), col.unbind(0), strict=True):
        if w != 0.0:  # an example that contributes nothing (a dropped or padded row) costs no GEMM
            _addmm_out_float32(out, rows(r).T, cols(c), alpha=w, beta=beta)
            beta = 1
    return out if beta else out.zero_()


def _weighted_product_bf16(row: Tensor, col: Tensor, weights: Tensor, memo: Any = None) -> Tensor:
    """``sum_{i,t} w~_i row_{i,t} col_{i,t}^T`` of two bf16 factors in float32 without a float32 copy of
    either, ``w~ = bf16_toward_zero(weights)``: the weights are folded into the narrower factor in float32
    (a transient scaled copy of it, exact), that is split exactly into two bf16 pieces side by side
    (``bf16_pieces_side_by_side(.., 2)``), which multiply the other factor as it is in one GEMM, bf16
    operands with float32 accumulation and output (``mm_float32``, a (2 n) x cols result), and the two
    (n x cols) blocks are summed. The float32 route's sum with weights ``w~``, up to float32 accumulation
    order; one bf16 GEMM with twice the rows instead of one float32 GEMM and a float32 copy of the wider
    factor (an output projection's logits gradient). Three pieces of the weights as they are cost a
    third more: a weight gradient's FLOPs three times over, on an H200 most of the bf16 step's extra
    device time. ``memo`` (a ``factors.FactorMemo``): where the pieces come from when another use shares
    the narrower factor (kind ``"pieces"``)."""
    transpose = row.shape[-1] > col.shape[-1]
    narrow, wide = (col, row) if transpose else (row, col)
    n = narrow.shape[-1]

    def pieces_of_narrow() -> Tensor:
        scaled = narrow * bf16_toward_zero(weights).view(-1, 1, 1)  # bf16 x float32 -> float32, exact
        return bf16_pieces_side_by_side(scaled.reshape(-1, n), 2)

    pieces = memo.get("pieces", narrow, pieces_of_narrow) if memo is not None else pieces_of_narrow()
    wide_flat = wide.reshape(-1, wide.shape[-1])
    # The result is contiguous in the parameter's (rows, cols) orientation either way: a transposed
    # view would break autograd's gradient-layout contract, which fused optimizers enforce on CUDA.
    if transpose:  # narrow = col: (rows, 2 n) = wide^T @ pieces, its two (rows x n) blocks summed
        return mm_float32(wide_flat.T, pieces).view(-1, 2, n).sum(dim=1)
    return mm_float32(pieces.T, wide_flat).view(2, n, -1).sum(dim=0)  # (2 n, cols), blocks summed


def bmm_float32(a: Tensor, b: Tensor, dtype: torch.dtype) -> Tensor:
    """``a @ b`` batched, in ``dtype`` (at least float32). Exact in the sense of the float32 route:
    the product of two bf16/fp16 numbers is exact in float32, so bf16 operands with float32
    accumulation and output (CUDA, ``out_dtype``) give what float32 copies of them would, without
    the copies; elsewhere the operands are widened first."""
    if dtype == torch.float32 and float32_output_supported(a, b):
        return _bmm_out_float32(a, b)
    return torch.bmm(as_dtype(a, dtype), as_dtype(b, dtype))
