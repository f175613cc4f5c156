"""Where the clipped sum ``S = sum_i c_i g_i`` of a step lives until the noise is added.

DP-SGD's guarantee is about ``S + N(0, sigma^2 C^2 I)`` with ``||c_i g_i|| <= C`` (Hush Alg. 2, lines
8-10): adding one example moves ``S`` by at most C. That holds for ``S`` itself, not for ``S`` rounded to
bf16 or fp16: rounding moves every entry by up to ``2^-9 |S_j|`` (bf16), so the rounded sum of a batch of
B clipped gradients can move by up to about ``2^-9 B C`` when one example is added, more than C once
B > 512 and a sizeable fraction of C well before. So a low-precision parameter's clipped sum is kept
beside it in float32 (``p.hush_clipped_sum``, the way Opacus keeps ``p.summed_grad``), accumulated over
micro-batches and summed over ranks in float32, the noise is added to it in float32, and only the noisy
result is rounded into ``p.grad`` (rounding after the mechanism is post-processing). Float32 and float64
parameters accumulate in ``p.grad`` directly, in their own dtype.

The price is one float32 copy per bf16/fp16 trainable parameter (2x its bytes) during the step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from hush_hf.clipping.tensor_views import as_shape

LOW_PRECISION = (torch.float16, torch.bfloat16)
_ATTRIBUTE = "hush_clipped_sum"
CLIPPED_SUM_ATTRIBUTE = _ATTRIBUTE  # the float32 sum beside a low-precision parameter


def accumulate_(p: nn.Parameter, grad: Tensor, *, owned: bool = False) -> None:
    """Add ``grad`` (a clipped sum, at least float32) to p's clipped sum: in float32 beside a
    low-precision parameter, else into ``p.grad`` in p's dtype. ``owned=True``: the caller hands over
    ``grad`` (nothing else writes it), so a float32 one is kept as it is instead of copied. A first
    sum is laid out as p is (``_in_layout_of``)."""
    if p.dtype in LOW_PRECISION:
        total = getattr(p, _ATTRIBUTE, None)
        if total is None:
            keep = owned and grad.dtype == torch.float32
            setattr(p, _ATTRIBUTE, _in_layout_of(p, grad, torch.float32, copy=not keep))
        else:
            total.add_(grad if grad.dtype == torch.float32 else grad.to(torch.float32))
        return
    if p.grad is None:
        p.grad = _in_layout_of(p, grad, p.dtype, copy=False)
    else:
        p.grad.add_(grad if grad.dtype == p.grad.dtype else grad.to(p.grad.dtype))


def _in_layout_of(p: nn.Parameter, grad: Tensor, dtype: torch.dtype, *, copy: bool) -> Tensor:
    """``grad`` in ``dtype`` with p's strides (a copy when ``copy``, or when its dtype or strides differ).
    Autograd lays a gradient out as its parameter (the gradient-layout contract), and fused optimizers
    rely on it: CUDA's fused AdamW refuses a gradient whose strides differ from its parameter's."""
    if isinstance(p, DTensor) or isinstance(grad, DTensor) or grad.stride() == p.stride():
        return grad if not copy and grad.dtype == dtype else grad.to(dtype, copy=copy)
    return torch.empty_like(p, dtype=dtype).copy_(grad)


def clipped_sum(p: nn.Parameter) -> Tensor | None:
    """The tensor holding p's clipped sum so far: the float32 one of a low-precision parameter, else
    ``p.grad`` (None when nothing was added)."""
    total = getattr(p, _ATTRIBUTE, None)
    return total if total is not None else p.grad


def clipped_sums_for_noise(params: Sequence[nn.Parameter]) -> list[Tensor]:
    """One tensor per parameter, in order, that the noise is added to: for a low-precision parameter
    always a float32 one (its clipped sum, or zeros, or a ``.grad`` written by someone else than the
    engine, widened), so that every rank holds the same dtypes whether or not its share touched the
    parameter (the all-reduce buckets by dtype); else ``p.grad`` (zeros when None). Zeros matter:
    every coordinate gets noise, or the step would reveal which parameters the batch touched. Reduce
    these over ranks, add the noise, then ``round_into_grads_``. Idempotent."""
    out: list[Tensor] = []
    for p in params:
        if p.dtype not in LOW_PRECISION:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            out.append(p.grad)
            continue
        total = getattr(p, _ATTRIBUTE, None)
        if total is not None and p.grad is not None:
            raise RuntimeError(
                f"a {p.dtype} parameter of shape {tuple(p.shape)} has both a float32 clipped sum and a .grad "
                "that did not come from the clipping engine; refusing to add noise to a gradient that was "
                "not clipped"
            )
        if total is None:
            grad, p.grad = p.grad, None
            total = torch.zeros_like(p, dtype=torch.float32) if grad is None else grad.to(torch.float32)
            setattr(p, _ATTRIBUTE, total)
        out.append(total)
    return out


def round_into_grads_(params: Sequence[nn.Parameter]) -> None:
    """``p.grad <- round(float32 sum)`` for every low-precision parameter, and the float32 copy freed.

    The parameters of one device and dtype are rounded with one ``torch._foreach_copy_`` into one
    buffer (their ``.grad`` are views of it) rather than one cast each (each a kernel launch on a GPU);
    the same round-to-nearest as ``Tensor.to``. Sharded (DTensor) sums are rounded one by one."""
    groups: dict[tuple[torch.device, torch.dtype], list[tuple[nn.Parameter, Tensor]]] = {}
    for p in params:
        total = getattr(p, _ATTRIBUTE, None)
        if total is None:
            continue
        if isinstance(total, DTensor):
            p.grad = total.to(p.dtype)
        else:
            groups.setdefault((total.device, p.dtype), []).append((p, total))
        delattr(p, _ATTRIBUTE)
    for (device, dtype), members in groups.items():
        flat = torch.empty(sum(t.numel() for _, t in members), dtype=dtype, device=device)
        parts = flat.split([t.numel() for _, t in members])
        views = [as_shape(part, t.shape) for part, (_, t) in zip(parts, members, strict=True)]
        torch._foreach_copy_(views, [t for _, t in members])
        for (p, _), view in zip(members, views, strict=True):
            p.grad = view


def discard_(params: Sequence[nn.Parameter]) -> None:
    """Forget every clipped sum (``p.grad`` and the float32 copies): the start of a step."""
    for p in params:
        p.grad = None
        if hasattr(p, _ATTRIBUTE):
            delattr(p, _ATTRIBUTE)
