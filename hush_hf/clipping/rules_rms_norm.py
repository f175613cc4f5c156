"""Per-example gradient rule for Llama's RMSNorm (and the classes whose ``forward`` is its very code:
``registry.rule_for`` gives them this rule when the Llama module is imported).

The forward is ``y = w * xhat`` with ``xhat = x / sqrt(mean(x^2) + eps)`` computed in float32 and rounded
back to x's dtype, so grad w_i = sum_t xhat_{i,t} * g_{i,t}. ``xhat`` is what autograd keeps for the
weight's gradient (the saved ``other`` of the final multiplication): the forward hook takes that very
tensor (``saved_normalised``), so the rule is one product and one sum per layer, or for several layers
of one shape at once (``llama_rms_norm_batched``, ``rule_batches``). Where it is not
available (gradient checkpointing, where the rule runs on the recomputed input; a forward that was
replaced), the rule recomputes ``xhat`` with the forward's own operations. Without a rule the norm took
the generic path (a ``torch.func`` replay per example, about 14 operations per layer).

Registered by qualified class name, so importing this module does not import transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hush_hf.clipping.factors import Materialized, PerExampleGrad, compute_dtype
from hush_hf.clipping.registry import register_norm_rule
from hush_hf.clipping.rules_torch import as_sequence


def rounded_rms_normalised(x: Tensor, eps: float) -> Tensor:
    """Llama's ``xhat``, as its forward computes it: in float32 (whatever x's dtype),
    ``x / sqrt(mean(x^2) + eps)`` over the last dimension, rounded back to x's dtype."""
    wide = x.to(torch.float32)
    variance = wide.pow(2).mean(-1, keepdim=True)
    return (wide * torch.rsqrt(variance + eps)).to(x.dtype)


@dataclass(frozen=True)
class SavedNormalised:
    """The forward's own ``xhat`` (detached), as the rule's input in place of x."""

    values: Tensor


def saved_normalised(layer: nn.Module, x: Tensor, output: Tensor) -> SavedNormalised | None:
    """``xhat`` as autograd saved it for the weight's gradient: the output is ``weight * xhat``, one
    multiplication whose backward node keeps the weight (``_saved_self``, the layer's own parameter)
    and ``xhat`` (``_saved_other``, x's shape and dtype). None when the output was made otherwise."""
    node = output.grad_fn
    if node is None or type(node).__name__ != "MulBackward0":
        return None
    try:
        weight, xhat = node._saved_self, node._saved_other
    except RuntimeError:  # freed
        return None
    if weight is not layer.weight or not isinstance(xhat, Tensor):  # None: not saved
        return None
    if xhat.shape != x.shape or xhat.dtype != x.dtype:
        return None
    return SavedNormalised(xhat.detach())


@torch.no_grad()  # no graph is needed; and a stack with out= refuses an input that requires grad
def llama_rms_norm_batched(calls: list[tuple[nn.Module, Tensor, Tensor]]) -> list[dict[str, PerExampleGrad]]:
    """``llama_rms_norm_grads`` of several (layer, x, g) calls, in order (``rule_batches``): those with the
    forward's own ``xhat`` of one (b, T, d) shape and dtype stacked (widened as it copies), one product
    and one sum for all of them, the same numbers; the rest one at a time."""
    out: list[dict[str, PerExampleGrad]] = [{} for _ in calls]
    groups: dict[tuple, list[int]] = {}
    for k, (layer, x, g) in enumerate(calls):
        if isinstance(x, SavedNormalised) and x.values.dim() == 3 and x.values.shape == g.shape:
            groups.setdefault((g.shape, x.values.dtype, g.dtype, g.device), []).append(k)
        else:
            out[k] = llama_rms_norm_grads(layer, x, g)
    for members in groups.values():
        if len(members) == 1:
            out[members[0]] = llama_rms_norm_grads(*calls[members[0]])
            continue
        _, saved, g = calls[members[0]]
        dtype = compute_dtype(saved.values, g)  # type: ignore[union-attr]
        stacked = torch.empty((len(members), *g.shape), dtype=dtype, device=g.device)
        torch.stack([calls[k][1].values for k in members], out=stacked)  # type: ignore[union-attr]
        # xhat (dtype) * g widens g inside the product, as one call at a time does
        sums = stacked.mul_(torch.stack([calls[k][2] for k in members])).sum(dim=2)
        for k, values in zip(members, sums.unbind(0), strict=True):
            out[k] = {"weight": Materialized(values)}
    return out


@register_norm_rule(
    "transformers.models.llama.modeling_llama.LlamaRMSNorm",
    saved_input=saved_normalised,
    batched=llama_rms_norm_batched,
)
def llama_rms_norm_grads(
    layer: nn.Module, x: Tensor | SavedNormalised, g: Tensor
) -> dict[str, PerExampleGrad]:
    """grad w_i = sum_t xhat_{i,t} * g_{i,t} (see the module docstring), the products and the sum in
    at least float32 (a bf16 product of two bf16 numbers would round)."""
    if isinstance(x, SavedNormalised):
        xhat = as_sequence(x.values.reshape(g.shape[0], -1, x.values.shape[-1]))
    else:
        xhat = rounded_rms_normalised(as_sequence(x), layer.variance_epsilon)
    dtype = compute_dtype(xhat, g)
    return {"weight": Materialized((xhat.to(dtype) * as_sequence(g)).sum(dim=1))}
