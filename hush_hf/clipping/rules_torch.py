"""Per-example gradient rules for ``torch.nn`` layers: Linear, Embedding, LayerNorm, RMSNorm.

Notation: x is the layer input, g the gradient of sum_i loss_i w.r.t. the layer output; since
loss_i depends on example i only, g[i] is example i's own output gradient. Sequence dimensions are
flattened into one axis t.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hush_hf.clipping.factors import (
    DenseFactor,
    Materialized,
    OneHotFactor,
    OuterSum,
    PerExampleGrad,
    compute_dtype,
)
from hush_hf.clipping.registry import register_norm_rule


def as_sequence(t: Tensor) -> Tensor:
    """(b, ..., n) -> (b, T, n) with T the product of the middle dimensions (1 if none)."""
    if t.dim() < 2:
        raise ValueError(f"expected a batch-first tensor of 2+ dimensions, got shape {tuple(t.shape)}")
    return t if t.dim() == 3 else t.reshape(t.shape[0], -1, t.shape[-1])  # no view dispatched for (b, T, n)


def sum_all_but_batch_and_last(t: Tensor, n_dims: int, dtype: torch.dtype | None = None) -> Tensor:
    """Sum over every dimension except the batch (first) and the last ``n_dims`` (a parameter's shape),
    accumulated and returned in ``dtype`` (default: t's); a bf16 ``t`` summed into float32 by the sum
    itself, with no widened copy of it dispatched.

    (Opacus has the same helper; importing opacus costs ~3 s, so it is not worth one line.)
    """
    dims = tuple(range(1, t.dim() - n_dims))
    return t.sum(dim=dims, dtype=dtype) if dims else t.to(dtype or t.dtype)


def bias_grad(g: Tensor) -> Materialized:
    """Bias added to every position: grad_i = sum_t g_{i,t}, summed in at least float32 (a bf16 output
    gradient's sum is not rounded back to bf16)."""
    return Materialized(as_sequence(g).sum(dim=1, dtype=compute_dtype(g)))


@register_norm_rule(nn.Linear, casts_input_under_autocast=True)
def linear_grads(layer: nn.Linear, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """y_t = W x_t + b, W (out x in): G_i = sum_t g_{i,t} x_{i,t}^T; bias sum_t g_{i,t}."""
    weight = OuterSum(DenseFactor(as_sequence(g)), DenseFactor(as_sequence(x)))
    grads: dict[str, PerExampleGrad] = {"weight": weight}
    if layer.bias is not None:
        grads["bias"] = bias_grad(g)
    return grads


def embedding_config_problem(layer: nn.Embedding) -> str | None:
    """Embedding options whose gradient is not a per-example sum of row updates."""
    if layer.max_norm is not None:
        return "max_norm renormalises weight rows in place during forward"
    if layer.scale_grad_by_freq:
        return "scale_grad_by_freq scales gradients by token counts of the whole batch (couples examples)"
    if layer.sparse:
        return "sparse gradients are not supported"
    return None


def embedding_outer_sum(layer: nn.Embedding, ids: Tensor, g: Tensor) -> OuterSum:
    """y_t = W[x_t], W (V x d): G_i = sum_t e_{x_{i,t}} g_{i,t}^T.

    PyTorch gives the ``padding_idx`` row no gradient, so those positions are dropped (zeroed);
    counting them would over-estimate the norm (safe, but not exact).
    """
    ids = ids.reshape(ids.shape[0], -1).long()
    g = as_sequence(g)
    if layer.padding_idx is not None:
        g = g.masked_fill((ids == layer.padding_idx)[:, :, None], 0.0)
    return OuterSum(OneHotFactor(ids, layer.num_embeddings), DenseFactor(g))


@register_norm_rule(nn.Embedding, check=embedding_config_problem)
def embedding_grads(layer: nn.Embedding, ids: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """See ``embedding_outer_sum``."""
    return {"weight": embedding_outer_sum(layer, ids, g)}


def _sum_steps(t: Tensor, n_dims: int, dtype: torch.dtype) -> Tensor:
    """A stack (L, b, ..., *shape) summed over its steps (every dimension but the first two and the last
    ``n_dims``) in ``dtype``: ``sum_all_but_batch_and_last`` of each of the L calls."""
    dims = tuple(range(2, t.dim() - n_dims))
    return t.sum(dim=dims, dtype=dtype) if dims else t.to(dtype)


@torch.no_grad()  # no graph is needed; and a stack with out= refuses an input that requires grad
def layer_norm_batched(calls: list[tuple[nn.Module, Tensor, Tensor]]) -> list[dict[str, PerExampleGrad]]:
    """``layer_norm_grads`` of several (layer, x, g) calls, in order: the calls of one shape, dtype and
    configuration stacked, each operation taken once for all of them (``rule_batches``)."""
    out: list[dict[str, PerExampleGrad]] = [{} for _ in calls]
    groups: dict[tuple, list[int]] = {}
    for k, (layer, x, g) in enumerate(calls):
        config = (tuple(layer.normalized_shape), layer.eps, layer.weight is None, layer.bias is None)
        groups.setdefault((*config, x.shape, x.dtype, g.shape, g.dtype, x.device), []).append(k)
    for members in groups.values():
        layer, x, g = calls[members[0]]
        if len(members) == 1:
            out[members[0]] = layer_norm_grads(layer, x, g)
            continue
        dtype, n_dims = compute_dtype(x, g), len(layer.normalized_shape)
        found: dict[str, tuple[Tensor, ...]] = {}
        gs = torch.stack([calls[k][2] for k in members])
        if layer.weight is not None:
            xs = torch.empty((len(members), *x.shape), dtype=dtype, device=x.device)
            torch.stack([calls[k][1] for k in members], out=xs)  # widened as it copies
            xhat = F.layer_norm(xs, layer.normalized_shape, eps=layer.eps)
            # xhat (dtype) * g widens g inside the product, as one call at a time does
            found["weight"] = _sum_steps(xhat.mul_(gs), n_dims, dtype).unbind(0)
            del xs, xhat
        if layer.bias is not None:
            found["bias"] = _sum_steps(gs, n_dims, dtype).unbind(0)
        for j, k in enumerate(members):
            out[k] = {name: Materialized(values[j]) for name, values in found.items()}
    return out


@register_norm_rule(nn.LayerNorm, batched=layer_norm_batched)
def layer_norm_grads(layer: nn.LayerNorm, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """y = xhat * w + b with xhat the normalised input: grad w_i = sum_t xhat_{i,t} * g_{i,t}."""
    dtype = compute_dtype(x, g)
    n_dims = len(layer.normalized_shape)
    grads: dict[str, PerExampleGrad] = {}
    if layer.weight is not None:
        xhat = F.layer_norm(x.to(dtype), layer.normalized_shape, eps=layer.eps)
        # xhat (dtype) * g widens g inside the product: the same numbers as a widened copy of g
        grads["weight"] = Materialized(sum_all_but_batch_and_last(xhat * g, n_dims, dtype))
    if layer.bias is not None:
        grads["bias"] = Materialized(sum_all_but_batch_and_last(g, n_dims, dtype))
    return grads


@register_norm_rule(nn.RMSNorm)
def rms_norm_grads(layer: nn.RMSNorm, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """y = x / rms(x) * w: grad w_i = sum_t (x_{i,t} / rms(x_{i,t})) * g_{i,t}."""
    dtype = compute_dtype(x, g)
    # eps=None means finfo(input dtype).eps in the forward; keep that, not the upcast dtype's eps.
    eps = layer.eps if layer.eps is not None else torch.finfo(x.dtype).eps
    xhat = F.rms_norm(x.to(dtype), layer.normalized_shape, eps=eps)
    n_dims = len(layer.normalized_shape)
    return {"weight": Materialized(sum_all_but_batch_and_last(xhat * g, n_dims, dtype))}
