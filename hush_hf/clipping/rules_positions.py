"""Refusals for position tables that the whole batch shares inside a layer (read from transformers 5.24).

DeBERTa (v1 and v2) with ``relative_attention``: the encoder reads its relative-position table as a tensor
(``rel_embeddings.weight``, then its ``LayerNorm`` when ``norm_rel_ebd`` asks), with no batch dimension, and
passes it to every layer; each attention projects it (``pos_key_proj``/``pos_query_proj``, or its own
``key_proj``/``query_proj`` when ``share_att_key``) as one (1, positions, d) row and ``.repeat``s the result
over the batch. The gradient reaching those parameters from the table is summed over the examples before
any call could record one example's part, and a per-example copy cannot be passed in instead (the
attention's reshapes assume one row). So those parameters are refused while trainable; the attention's
content projections train exactly when the table is not projected by them.

MPNet's encoder looks its ``relative_attention_bias`` table up with a (query, key) bucket matrix that the
whole batch shares (``compute_position_bias``), like UMT5: the table's call sees no batch dimension, so its
per-example gradient is not recorded; refused while trainable, with the parameter to freeze.
"""

from __future__ import annotations

from torch import nn

from hush_hf.clipping.registry import register_refusal

_MODELS = "transformers.models"


def _trainable(module: nn.Module, names: tuple[str, ...]) -> list[str]:
    found = []
    for name in names:
        sub = getattr(module, name, None)
        if isinstance(sub, nn.Module) and any(p.requires_grad for p in sub.parameters()):
            found.append(name)
    return found


def deberta_table_problem(encoder: nn.Module) -> str | None:
    """The encoder's relative-position table (and its LayerNorm) is read whole, shared by the batch."""
    if not getattr(encoder, "relative_attention", False):
        return None
    normed = "layer_norm" in getattr(encoder, "norm_rel_ebd", ())
    names = _trainable(encoder, ("rel_embeddings", "LayerNorm") if normed else ("rel_embeddings",))
    if not names:
        return None
    return (
        f"its relative-position table ({', '.join(names)}) is read as one tensor that the whole batch "
        "shares, so its gradient is summed over the examples before any layer sees one; freeze "
        + " and ".join(f"encoder.{n}" for n in names)
        + " (the table then stays as pretrained)"
    )


def deberta_attention_problem(attention: nn.Module) -> str | None:
    """The projections an attention applies to the shared relative-position table."""
    if not getattr(attention, "relative_attention", False):
        return None
    if getattr(attention, "share_att_key", False):
        names = _trainable(attention, ("query_proj", "key_proj"))
    else:
        names = _trainable(attention, ("pos_key_proj", "pos_query_proj", "pos_proj", "pos_q_proj"))
    if not names:
        return None
    shared = " (with share_att_key=True the table goes through the content projections)"
    return (
        f"its {', '.join(names)} project the relative-position table that the whole batch shares (one row, "
        "then repeated over the batch), so their gradient from it is summed over the examples; freeze "
        f"{', '.join(names)} in every attention layer" + (shared if attention.share_att_key else "")
    )


for _module, _encoder, _attention in (
    ("deberta_v2", "DebertaV2Encoder", "DisentangledSelfAttention"),
    ("deberta", "DebertaEncoder", "DisentangledSelfAttention"),
):
    register_refusal(f"{_MODELS}.{_module}.modeling_{_module}.{_encoder}", deberta_table_problem)
    register_refusal(f"{_MODELS}.{_module}.modeling_{_module}.{_attention}", deberta_attention_problem)


def mpnet_relative_bias_problem(encoder: nn.Module) -> str | None:
    """MPNet's relative-position table, looked up once for the whole batch."""
    if not _trainable(encoder, ("relative_attention_bias",)):
        return None
    return (
        "its relative_attention_bias table is looked up with (query, key) position buckets shared by the "
        "whole batch, so its per-example gradient is not recorded; freeze it "
        "(`model.mpnet.encoder.relative_attention_bias.requires_grad_(False)`); the rest trains exactly"
    )


register_refusal(f"{_MODELS}.mpnet.modeling_mpnet.MPNetEncoder", mpnet_relative_bias_problem)
