"""Per-example gradient rule for Llama's RMSNorm (and the classes whose ``forward`` is its very code:
``registry.rule_for`` gives them this rule when the Llama module is imported).

The forward is ``y = w * xhat`` with ``xhat = x / sqrt(mean(x^2) + eps)`` computed in float32 and rounded
back to x's dtype, so grad w_i = sum_t xhat_{i,t} * g_{i,t}. ``xhat`` is what autograd keeps for the
weight's gradient (the saved ``other`` of the final multiplication): the forward hook takes that very
tensor (``saved_normalised``), so the rule is one product and one sum per layer. Where it is not
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


@register_norm_rule("transformers.models.llama.modeling_llama.LlamaRMSNorm", saved_input=saved_normalised)
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
