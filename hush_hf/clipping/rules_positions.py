"""Position tables the whole batch shares inside a layer (read from transformers 5.24): relative-position
biases computed inside a layer (UMT5, MPNet), exact (DeBERTa's projected table: ``rules_deberta``).

UMT5: every self-attention with ``has_relative_attention_bias`` calls its own ``compute_bias(q, k)``,
which looks a (q, k) bucket matrix up in ``relative_attention_bias`` and returns a (1, heads, q, k) bias
that is added to that attention's scores only. MPNet: the encoder calls ``compute_position_bias(x)`` once,
which looks its ``relative_attention_bias`` up the same way and ``expand``s the bias to (batch, heads, q, k)
(``contiguous``), then passes it to every layer. Either way the table's lookup has no batch dimension, so
its own call cannot record one example's gradient. Instead, before the call (``registry.Injection`` with
``method``), the bias is computed here from the same lookup and the layer's call of that method returns
it, batch-first (UMT5: an ``expand`` of the (1, heads, q, k) bias; MPNet: the bias as the method builds
it): the layer computes exactly what it computes by itself, and row i of the bias's gradient is example
i's own, summed over every layer that adds it. The table's per-example gradient is then T5's gather-sum
by bucket (``rules_hf.t5_relative_bias_grads``). Not injected (and not recorded) when the call continues
from cached tokens, as in generation.
"""

from __future__ import annotations

from torch import Tensor, nn

from hush_hf.clipping.registry import Injection, Injector, register_norm_rule
from hush_hf.clipping.rules_hf import looked_up, relative_bias_params, t5_relative_bias_grads
from hush_hf.clipping.rules_torch import embedding_config_problem

_MODELS = "transformers.models"


def _table_problem(layer: nn.Module) -> str | None:
    table = getattr(layer, "relative_attention_bias", None)
    return embedding_config_problem(table) if isinstance(table, nn.Embedding) else None


def _hidden(args: tuple, kwargs: dict) -> Tensor | None:
    hidden = args[0] if args else kwargs.get("hidden_states")
    return hidden if isinstance(hidden, Tensor) and hidden.dim() == 3 else None


def _umt5_relative_bias(attention: nn.Module, args: tuple, kwargs: dict) -> Injection | None:
    """UMT5's bias, computed before the attention computes it (``compute_bias(q, k)``, (1, heads, q, k)) and
    handed to it as an ``expand`` to (batch, heads, q, k). A training forward starts from an empty cache, so
    the attention asks for (q, k) with k = q (self-attention; UMT5's cross-attentions have no table) or the
    encoder's length (a cross-attention given a table), from position 0; None otherwise (cached tokens)."""
    hidden = _hidden(args, kwargs)
    if hidden is None:
        return None
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if cache is not None and int(cache.get_seq_length(attention.layer_idx)) != 0:
        return None
    other = kwargs.get("encoder_hidden_states")
    key_length = hidden.shape[1] if other is None else other.shape[1]
    compute = type(attention).compute_bias
    bias, ids = looked_up(
        attention.relative_attention_bias,
        lambda: compute(attention, hidden.shape[1], key_length, device=hidden.device),
    )
    batch = hidden.shape[0]
    return Injection(
        "compute_bias", ids.expand(batch, *ids.shape), bias.expand(batch, *bias.shape[1:]), method=True
    )


def _mpnet_relative_bias(encoder: nn.Module, args: tuple, kwargs: dict) -> Injection | None:
    """MPNet's bias, ``compute_position_bias(hidden_states)``: (batch, heads, q, k) already, one contiguous
    copy per example; the encoder's own call of it returns this one."""
    hidden = _hidden(args, kwargs)
    if hidden is None:
        return None
    compute = type(encoder).compute_position_bias
    bias, ids = looked_up(encoder.relative_attention_bias, lambda: compute(encoder, hidden))
    batch = hidden.shape[0]
    if tuple(bias.shape[:1]) != (batch,) or ids.dim() != 2:
        shape = tuple(bias.shape)
        raise ValueError(f"MPNet's position bias has shape {shape}, expected ({batch}, heads, q, k)")
    return Injection("compute_position_bias", ids.expand(batch, *ids.shape), bias, method=True)


register_norm_rule(
    f"{_MODELS}.umt5.modeling_umt5.UMT5Attention",
    check=_table_problem,
    injects=Injector(relative_bias_params, _umt5_relative_bias),
)(t5_relative_bias_grads)
register_norm_rule(
    f"{_MODELS}.mpnet.modeling_mpnet.MPNetEncoder",
    check=_table_problem,
    injects=Injector(relative_bias_params, _mpnet_relative_bias),
)(t5_relative_bias_grads)
