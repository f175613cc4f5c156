"""Per-example gradient rules for Hugging Face layers (transformers 5): GPT-2 ``Conv1D``, Gemma-2's
scaled word embedding and RMSNorm, Falcon's Linear, BERT's MLM-head bias alias, OPT's folded
feed-forward and T5's relative position bias. Other models' norms and learned positions take the
generic path (``rules_generic``); classes whose forward is a registered class's code share its rule
(``registry.rule_for``: mT5's attention is T5's).

Registered by qualified class name, so importing this module does not import transformers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from hush_hf.clipping.factors import DenseFactor, Materialized, OuterSum, PerExampleGrad, compute_dtype
from hush_hf.clipping.registry import (
    Injection,
    Injector,
    register_batch_fold,
    register_norm_rule,
    register_param_aliases,
)
from hush_hf.clipping.rules_torch import (
    as_sequence,
    bias_grad,
    embedding_config_problem,
    embedding_outer_sum,
    linear_grads,
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


@register_norm_rule(
    "transformers.models.bart.modeling_bart.BartScaledWordEmbedding",
    check=embedding_config_problem,
)
def bart_scaled_embedding_grads(layer: nn.Embedding, ids: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """y_t = W[x_t] * s with s the float ``embed_scale`` (BART and models copying it): rows get s * g_t."""
    return {"weight": embedding_outer_sum(layer, ids, g * layer.embed_scale)}


@register_norm_rule("transformers.models.gemma2.modeling_gemma2.Gemma2RMSNorm")
def gemma2_rms_norm_grads(layer: nn.Module, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """y = xhat * (1 + w), xhat = x / sqrt(mean(x^2) + eps) in float32: grad w_i = sum_t xhat_t * g_t."""
    # Normalise in float32 exactly as forward does (x.float(), even for a float64 model).
    xf = as_sequence(x).float()
    xhat = xf * (xf.pow(2).mean(-1, keepdim=True) + layer.eps).rsqrt()
    dtype = compute_dtype(xhat, g)
    return {"weight": Materialized((xhat.to(dtype) * as_sequence(g).to(dtype)).sum(dim=1))}


# BertLMPredictionHead holds ``bias`` itself but only uses it as ``decoder.bias`` (the same Parameter).
# Untied (tie_word_embeddings=False, transformers 5) it keeps its own ``bias``, which forward never reads.
register_param_aliases(
    "transformers.models.bert.modeling_bert.BertLMPredictionHead",
    {"bias": "decoder.bias"},
    unused_otherwise=True,
)
# RoBERTa's and XLM-R's LM heads likewise: forward is dense, gelu, layer_norm, decoder; ``bias`` unread.
for _head in ("roberta.modeling_roberta.RobertaLMHead", "xlm_roberta.modeling_xlm_roberta.XLMRobertaLMHead"):
    register_param_aliases(f"transformers.models.{_head}", {"bias": "decoder.bias"}, unused_otherwise=True)


@register_norm_rule(
    "transformers.models.falcon.modeling_falcon.FalconLinear",
    casts_input_under_autocast=True,
    protects_output=True,
)
def falcon_linear_grads(layer: nn.Linear, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """FalconLinear overrides forward as ``x @ W.T (+ b)``: the map of nn.Linear, so nn.Linear's rule.
    Falcon adds the attention output into the MLP's output in place, hence ``protects_output``."""
    return linear_grads(layer, x, g)


# OPTDecoderLayer runs final_layer_norm, fc1 and fc2 on ``hidden_states.reshape(-1, d)`` of (b, T, d).
register_batch_fold("transformers.models.opt.modeling_opt.OPTDecoderLayer")


def relative_bias_params(attention: nn.Module) -> list[str]:
    bias = getattr(attention, "relative_attention_bias", None)
    return ["relative_attention_bias.weight"] if isinstance(bias, nn.Embedding) else []


def _t5_relative_bias(attention: nn.Module, args: tuple, kwargs: dict) -> Injection | None:
    """T5's position bias, computed before the first attention of a stack calls ``compute_bias`` itself.

    ``compute_bias(q, k)`` looks the (q, k) bucket matrix up in ``relative_attention_bias`` and returns
    a (1, heads, q, k) bias that this attention and every later one of the stack add to their scores
    (the stack passes it on as ``position_bias``). Given as an ``expand`` to (batch, heads, q, k), the
    model computes the same, and row i of its gradient is example i's own. None when the call receives
    the bias already, or continues from cached tokens (generation, never a training step).
    """
    if kwargs.get("position_bias") is not None:
        return None
    cache = kwargs.get("cache")
    if cache is not None and int(cache.get_seq_length(attention.layer_idx)) != 0:
        return None
    hidden = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(hidden, Tensor) or hidden.dim() != 3:
        return None
    other = kwargs.get("key_value_states")
    key_length = hidden.shape[1] if other is None else other.shape[1]
    bias, ids = looked_up(
        attention.relative_attention_bias,
        lambda: attention.compute_bias(hidden.shape[1], key_length, device=hidden.device),
    )
    batch = hidden.shape[0]
    return Injection("position_bias", ids.expand(batch, *ids.shape), bias.expand(batch, *bias.shape[1:]))


def looked_up(table: nn.Embedding, compute: Callable[[], Tensor]) -> tuple[Tensor, Tensor]:
    """``compute()`` (a relative-position bias built from one lookup of ``table``) and the bucket ids
    that lookup used, (q, k)."""
    buckets: list[Tensor] = []
    handle = table.register_forward_hook(lambda m, a, out: buckets.append(a[0]))
    try:
        bias = compute()
    finally:
        handle.remove()
    (ids,) = buckets
    return bias, ids


@register_norm_rule(
    "transformers.models.t5.modeling_t5.T5Attention",
    check=lambda attention: embedding_config_problem(attention.relative_attention_bias),
    injects=Injector(relative_bias_params, _t5_relative_bias),
)
def t5_relative_bias_grads(attention: nn.Module, buckets: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """T5's relative position bias: bias[h, q, k] = table[bucket(q, k), h], shared by every attention of
    the stack. With g_i (heads, q, k) example i's gradient of the (expanded) bias, summed over the
    attentions that add it, the table's gradient is a gather-sum by bucket:
    G_i[n, h] = sum_{q, k: bucket(q, k) = n} g_i[h, q, k]; materialised, (b, buckets, heads)."""
    table = attention.relative_attention_bias.weight
    dtype = compute_dtype(g)
    b, heads = g.shape[:2]
    per_step = g.to(dtype).permute(0, 2, 3, 1).reshape(b, -1, heads)  # (b, q*k, heads)
    index = buckets.reshape(b, -1, 1).expand(-1, -1, heads).long()
    grad = torch.zeros(b, table.shape[0], heads, dtype=dtype, device=g.device)
    return {"relative_attention_bias.weight": Materialized(grad.scatter_add_(1, index, per_step))}
