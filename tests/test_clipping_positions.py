"""DeBERTa's relative-position table: refused while it trains, naming the parameters to freeze; frozen,
the projections applied to it train exactly (each attention replayed per example: tests/model_families.py,
the DeBERTa rows), unless a dropout inside the attention would make the replay draw other masks."""

from __future__ import annotations

import pytest

from hush_hf.clipping import GhostClipper, UnsupportedLayerError
from tests.model_families import _BERT_LIKE, _hf

_REL = dict(
    relative_attention=True, position_buckets=8, max_relative_positions=16, pos_att_type=["p2c", "c2p"]
)


def deberta(**config):
    return _hf("DebertaV2Config", "DebertaV2ForMaskedLM", **{**_REL, **_BERT_LIKE, **config})(True)


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
    with GhostClipper(model, 1.0) as clipper:  # the projections of the table are hooked with the attention
        hooked = {layer.path: layer.param_names for layer in clipper._layers}
    assert hooked["deberta.encoder.layer.0.attention.self"] == (
        "pos_key_proj.weight", "pos_key_proj.bias", "pos_query_proj.weight", "pos_query_proj.bias",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("share", "names"), [(False, "pos_key_proj, pos_query_proj"), (True, "query_proj, key_proj")]
)
def test_a_dropout_inside_the_replayed_attention_is_refused(share: bool, names: str):
    model = deberta(attention_probs_dropout_prob=0.1, share_att_key=share)
    model.deberta.encoder.rel_embeddings.requires_grad_(False)
    where = r"'deberta\.encoder\.layer\.0\.attention\.self' \(DisentangledSelfAttention\) is not supported"
    why = r"differentiated by replaying the attention .* dropout \('dropout', p > 0\).*or freeze those"
    with pytest.raises(UnsupportedLayerError, match=rf"{where}: its {names} are {why}"):
        GhostClipper(model, 1.0)
    for layer in model.deberta.encoder.layer:
        for name in names.split(", "):
            getattr(layer.attention.self, name).requires_grad_(False)
    GhostClipper(model, 1.0).remove()
