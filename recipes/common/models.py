"""The causal LMs of the recipes: a checkpoint when given, else a small GPT-2 built from its config."""

from __future__ import annotations

from typing import Any


def causal_tokenizer(model_name_or_path: str | None) -> Any:
    """The checkpoint's tokenizer, or GPT-2's from the offline files; padding with EOS when it has no pad."""
    from transformers import AutoTokenizer

    from hush_hf.assets import gpt2_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path) if model_name_or_path else gpt2_tokenizer()
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    return tokenizer


def causal_model(model_name_or_path: str | None, vocab_size: int, *, seed: int, **gpt2_fields: Any) -> Any:
    """The checkpoint, or a GPT-2 built from its config (``gpt2_fields``: n_layer, n_embd, ...), initialised
    with ``seed`` so that every run of a recipe starts from the same weights."""
    from transformers import AutoModelForCausalLM, GPT2LMHeadModel, set_seed

    from hush_hf.assets import gpt2_small_config

    set_seed(seed)
    if model_name_or_path is not None:
        return AutoModelForCausalLM.from_pretrained(model_name_or_path)
    return GPT2LMHeadModel(gpt2_small_config(vocab_size, **gpt2_fields))
