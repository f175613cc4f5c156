"""Per-example gradient rule for Llama's RMSNorm (and the classes whose ``forward`` is its very code:
``registry.rule_for`` gives them this rule when the Llama module is imported).

Without a rule the norm took the generic path (a ``torch.func`` replay per example, about 14 operations
per layer); the closed form below takes 10, each of them a copy of one forward operation.

Registered by qualified class name, so importing this module does not import transformers.
"""

from __future__ import annotations

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


@register_norm_rule("transformers.models.llama.modeling_llama.LlamaRMSNorm")
def llama_rms_norm_grads(layer: nn.Module, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """y = w * xhat with ``xhat`` from ``rounded_rms_normalised``: grad w_i = sum_t xhat_{i,t} * g_{i,t},
    the products and the sum in at least float32 (a bf16 product of two bf16 numbers would round)."""
    xhat = rounded_rms_normalised(as_sequence(x), layer.variance_epsilon)
    dtype = compute_dtype(xhat, g)
    return {"weight": Materialized((xhat.to(dtype) * as_sequence(g)).sum(dim=1))}
