"""DeBERTa's relative-position table trains exactly: the encoder is replayed one example at a time,
differentiated w.r.t. the table alone (checked here with the table as the only trainable parameter, so it
is the whole norm, against a per-example autograd loop); the projections applied to it train with their
attention's own replay (tests/model_families.py, the DeBERTa rows, table and all). A dropout inside a
replayed module is refused, since a replay would draw other masks."""

from __future__ import annotations

import pytest
import torch

from hush_hf.clipping import GhostClipper, UnsupportedLayerError, example_cross_entropy, rules_deberta
from tests.model_families import _BERT_LIKE, _hf

_REL = dict(
    relative_attention=True, position_buckets=8, max_relative_positions=16, pos_att_type=["p2c", "c2p"]
)


def deberta(**config):
    return _hf("DebertaV2Config", "DebertaV2ForMaskedLM", **{**_REL, **_BERT_LIKE, **config})(True)


def deberta_v1(**config):
    rel = dict(relative_attention=True, max_relative_positions=16, pos_att_type=["p2c", "c2p"])
    return _hf("DebertaConfig", "DebertaForMaskedLM", **{**rel, **_BERT_LIKE, **config})(True)


TABLES = {
    "v1": (deberta_v1, {}),
    "v2-layer-norm": (deberta, dict(norm_rel_ebd="layer_norm")),
    "v3-share-att-key": (deberta, dict(norm_rel_ebd="layer_norm", share_att_key=True)),
}


def _only_the_table(model) -> dict[str, torch.nn.Parameter]:
    table = {
        n: p for n, p in model.named_parameters() if ".rel_embeddings." in n or "encoder.LayerNorm." in n
    }
    for n, p in model.named_parameters():
        p.requires_grad_(n in table)
    return table


@pytest.mark.parametrize("variant", ["plain", "checkpointing", "one-example-replays"])
@pytest.mark.parametrize("layout", list(TABLES))
def test_deberta_relative_table_norms_and_clipped_sum_match_a_per_example_loop(monkeypatch, layout, variant):
    build, config = TABLES[layout]
    checkpointing = variant == "checkpointing"
    if variant == "one-example-replays":  # the encoder replayed one example at a time
        monkeypatch.setattr(rules_deberta, "ENCODER_REPLAY_VALUES", 1)
    torch.manual_seed(0)
    model = build(**config).double().train()
    table = _only_the_table(model)
    with torch.no_grad():  # a table gradient of a size the comparison can see (its init is tiny)
        for p in table.values():
            p.add_(torch.randn_like(p))
    if checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    ids = torch.randint(3, 50, (4, 9), generator=torch.Generator().manual_seed(1))

    def losses(rows):
        return example_cross_entropy(model(input_ids=rows).logits, rows, causal=False)

    expected = []
    for i in range(len(ids)):
        grads = torch.autograd.grad(losses(ids[i : i + 1]).sum(), list(table.values()))
        expected.append(grads)
    norms = torch.stack([torch.sqrt(sum((g**2).sum() for g in grads)) for grads in expected])
    clip = float(norms.median())  # half the examples clipped
    scale = (clip / norms).clamp(max=1.0)
    clipped = [sum(scale[i] * expected[i][k] for i in range(len(ids))) for k in range(len(table))]
    with GhostClipper(model, clip) as clipper:
        got = clipper.clipped_backward(losses(ids))
    hooked = {layer.path: layer.param_names for layer in clipper._layers}
    encoder = next(path for path in hooked if path.endswith("encoder"))
    assert set(hooked[encoder]) == {n.removeprefix(f"{encoder}.") for n in table}
    torch.testing.assert_close(got, norms, rtol=1e-10, atol=0.0)
    for (name, p), want in zip(table.items(), clipped, strict=True):
        # DeBERTa computes its attention scale in float32, so the step clips to C (1 - 2^-20), the float32
        # margin (``CLIP_MARGINS``): each clipped example's share moves by at most that much of its norm.
        moved = 2.0**-20 * float((scale * norms).sum())
        assert float((p.grad - want).norm()) <= 1.01 * moved, name
        assert want.abs().max() > 0, name


def test_a_dropout_in_the_replayed_encoder_is_refused_naming_the_table():
    model = deberta(norm_rel_ebd="layer_norm", hidden_dropout_prob=0.1)
    for layer in model.deberta.encoder.layer:  # the attention's own refusal is tested below
        layer.attention.self.requires_grad_(False)
    with pytest.raises(
        UnsupportedLayerError,
        match=r"'deberta\.encoder' \(DebertaV2Encoder\).*\(rel_embeddings, LayerNorm\) is differentiated by "
        r"replaying the encoder .*dropout \('layer\.0\..*', p > 0\); set hidden_dropout_prob and "
        r"attention_probs_dropout_prob to 0, or freeze encoder\.rel_embeddings and encoder\.LayerNorm",
    ):
        GhostClipper(model, 1.0)
    model.deberta.encoder.rel_embeddings.requires_grad_(False)
    model.deberta.encoder.LayerNorm.requires_grad_(False)
    GhostClipper(model, 1.0).remove()


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
