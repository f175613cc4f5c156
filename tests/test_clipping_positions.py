"""Position tables the whole batch shares inside a layer: DeBERTa's relative-position table is refused
while it (or a projection of it) trains, with the layer and the parameters to freeze; frozen, the model
trains exactly (tests/model_families.py, "DeBERTa-v2 (MLM), relative attention")."""

from __future__ import annotations

import pytest

from hush_hf.clipping import GhostClipper, UnsupportedLayerError
from tests.model_families import _BERT_LIKE, _hf

_REL = dict(
    relative_attention=True, position_buckets=8, max_relative_positions=16, pos_att_type=["p2c", "c2p"]
)


def deberta(**config):
    return _hf("DebertaV2Config", "DebertaV2ForMaskedLM", **_REL, **config, **_BERT_LIKE)(True)


def test_deberta_relative_table_is_refused_until_frozen():
    model = deberta(norm_rel_ebd="layer_norm")
    with pytest.raises(
        UnsupportedLayerError,
        match=r"'deberta\.encoder' \(DebertaV2Encoder\).*\(rel_embeddings, LayerNorm\).*freeze "
        r"encoder\.rel_embeddings and encoder\.LayerNorm",
    ):
        GhostClipper(model, 1.0)
    model.deberta.encoder.rel_embeddings.requires_grad_(False)
    model.deberta.encoder.LayerNorm.requires_grad_(False)
    with pytest.raises(
        UnsupportedLayerError,
        match=r"'deberta\.encoder\.layer\.0\.attention\.self' \(DisentangledSelfAttention\): "
        r"its pos_key_proj, pos_query_proj project the relative-position table",
    ):
        GhostClipper(model, 1.0)
    for layer in model.deberta.encoder.layer:
        layer.attention.self.pos_key_proj.requires_grad_(False)
        layer.attention.self.pos_query_proj.requires_grad_(False)
    GhostClipper(model, 1.0).remove()


def test_deberta_shared_attention_keys_name_the_content_projections():
    model = deberta(share_att_key=True)
    model.deberta.encoder.rel_embeddings.requires_grad_(False)
    with pytest.raises(UnsupportedLayerError, match=r"its query_proj, key_proj project.*share_att_key=True"):
        GhostClipper(model, 1.0)
