"""Model configurations for training from scratch (no pretrained weights exist offline).

Each builder takes the tokenizer's ``vocab_size`` and optional overrides of any field of the
config class. Overrides are checked: transformers configs accept unknown keywords silently
(``GPT2Config(n_layers=6)`` keeps 12 layers), so a misspelt field is refused here instead.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import BertConfig, Gemma2Config, GPT2Config

# Accepted by every PretrainedConfig without being a field of it: selects the attention kernel.
_COMMON_CONFIG_KEYWORDS = frozenset({"attn_implementation"})
_TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def _config_fields(config_class: type) -> frozenset[str]:
    parameters = inspect.signature(config_class.__init__).parameters
    names = {name for name in parameters if name not in {"self", "kwargs"}}
    if dataclasses.is_dataclass(config_class):
        names |= {field.name for field in dataclasses.fields(config_class)}
    return frozenset(names | _COMMON_CONFIG_KEYWORDS)


def _build(config_class: type, vocab_size: object, defaults: dict[str, Any], overrides: dict[str, Any]):
    """``config_class(vocab_size=..., **defaults, **overrides)`` after checking the arguments."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    unknown = sorted(set(overrides) - _config_fields(config_class))
    if unknown:
        raise ValueError(f"{config_class.__name__} has no field(s) {unknown}")
    config = config_class(vocab_size=int(vocab_size), **{**defaults, **overrides})
    for field in _TOKEN_ID_FIELDS:
        ids = getattr(config, field, None)
        for token_id in ids if isinstance(ids, (list, tuple)) else [ids]:
            if token_id is not None and not 0 <= token_id < vocab_size:
                raise ValueError(f"{field}={token_id!r} lies outside the vocabulary [0, {vocab_size})")
    return config


def bert_tiny_config(vocab_size: int, **overrides: Any) -> BertConfig:
    """BERT-Tiny (``google/bert_uncased_L-2_H-128_A-2``, Turc et al. 2019): L=2, H=128, A=2, FFN 512.

    With the 30,522-token uncased vocabulary ``BertModel`` has 4,385,920 parameters.
    ``pad_token_id`` stays 0 ([PAD] of the uncased vocabulary).
    """
    from transformers import BertConfig

    defaults = {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 512,
    }
    return _build(BertConfig, vocab_size, defaults, overrides)


def gpt2_small_config(vocab_size: int, **overrides: Any) -> GPT2Config:
    """GPT-2 small (Radford et al. 2019): 12 layers, width 768, 12 heads, 1,024 positions.

    With the 50,257-token GPT-2 vocabulary the model has 124,439,808 parameters (tied head).
    ``bos_token_id`` / ``eos_token_id`` default to 50256 (``<|endoftext|>``); with a smaller
    vocabulary pass them explicitly.
    """
    from transformers import GPT2Config

    return _build(GPT2Config, vocab_size, {}, overrides)


def gemma2_small_config(vocab_size: int, **overrides: Any) -> Gemma2Config:
    """A small Gemma-2 (Gemma Team 2024): 4 layers, width 256, 4 query / 2 key-value heads of 64,
    FFN 1,024, 1,024 positions, local (window 512) and global attention alternating; ~16.8M
    parameters with the GPT-2 vocabulary.

    ``query_pre_attn_scalar`` follows ``head_dim`` (attention scaled by 1/sqrt(head_dim)) unless
    overridden. Special token ids default to None instead of Gemma's 0/1/2, which mean nothing in
    another vocabulary: ``pad_token_id`` becomes the embedding's ``padding_idx``, whose row never
    trains, so set it only to a token that never appears as input. Train with
    ``attn_implementation="eager"`` (pass it here or to the model).
    """
    from transformers import Gemma2Config

    head_dim = overrides.get("head_dim", 64)
    defaults = {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 1024,
        "query_pre_attn_scalar": head_dim,
        "max_position_embeddings": 1024,
        "sliding_window": 512,
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    return _build(Gemma2Config, vocab_size, defaults, overrides)

