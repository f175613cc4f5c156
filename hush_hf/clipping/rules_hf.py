"""Per-example gradient rules for Hugging Face layers (transformers 5): GPT-2 ``Conv1D``, Gemma-2's
scaled word embedding and RMSNorm, and BERT's MLM-head bias alias.

Registered by qualified class name, so importing this module does not import transformers.
"""

from __future__ import annotations

from torch import Tensor, nn

from hush_hf.clipping.factors import DenseFactor, Materialized, OuterSum, PerExampleGrad, compute_dtype
from hush_hf.clipping.registry import register_norm_rule, register_param_aliases
from hush_hf.clipping.rules_torch import (
    as_sequence,
    bias_grad,
    embedding_config_problem,
    embedding_outer_sum,
)


@register_norm_rule("transformers.pytorch_utils.Conv1D", casts_input_under_autocast=True)
def conv1d_grads(layer: nn.Module, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """GPT-2 Conv1D, y_t = x_t W + b with W (nx x nf): G_i = sum_t x_{i,t} g_{i,t}^T."""
    return {
        "weight": OuterSum(DenseFactor(as_sequence(x)), DenseFactor(as_sequence(g))),
        "bias": bias_grad(g),
    }


@register_norm_rule(
    "transformers.models.gemma2.modeling_gemma2.Gemma2TextScaledWordEmbedding",
    check=embedding_config_problem,
)
def gemma2_scaled_embedding_grads(layer: nn.Embedding, ids: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """y_t = W[x_t] * s, s = ``embed_scale`` cast to the weight dtype as in forward: rows get s * g_t."""
    scale = layer.embed_scale.to(layer.weight.dtype)
    return {"weight": embedding_outer_sum(layer, ids, g * scale)}


@register_norm_rule("transformers.models.gemma2.modeling_gemma2.Gemma2RMSNorm")
def gemma2_rms_norm_grads(layer: nn.Module, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """y = xhat * (1 + w), xhat = x / sqrt(mean(x^2) + eps) in float32: grad w_i = sum_t xhat_t * g_t."""
    # Normalise in float32 exactly as forward does (x.float(), even for a float64 model).
    xf = as_sequence(x).float()
    xhat = xf * (xf.pow(2).mean(-1, keepdim=True) + layer.eps).rsqrt()
    dtype = compute_dtype(xhat, g)
    return {"weight": Materialized((xhat.to(dtype) * as_sequence(g).to(dtype)).sum(dim=1))}


# BertLMPredictionHead holds ``bias`` itself but only uses it as ``decoder.bias`` (the same Parameter).
register_param_aliases(
    "transformers.models.bert.modeling_bert.BertLMPredictionHead", {"bias": "decoder.bias"}
)
