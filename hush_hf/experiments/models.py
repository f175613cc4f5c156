"""The models of the experiments: a causal LM (a checkpoint, else a small GPT-2 built from its config) and a
BERT masked LM with a choice of what trains."""

from __future__ import annotations

from collections.abc import Callable
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
    with ``seed`` so that every run of an experiment starts from the same weights."""
    from transformers import AutoModelForCausalLM, GPT2LMHeadModel, set_seed

    from hush_hf.assets import gpt2_small_config

    set_seed(seed)
    if model_name_or_path is not None:
        return AutoModelForCausalLM.from_pretrained(model_name_or_path)
    return GPT2LMHeadModel(gpt2_small_config(vocab_size, **gpt2_fields))


MASKED_LM_TRAINABLE = ("head", "lora", "all")


def bert_masked_lm(model_name_or_path: str | None, *, trainable: str, seed: int, lora_rank: int = 8) -> Any:
    """A BERT masked LM whose output head runs only at the masked positions (``BertForMaskedPositionsLM``,
    the same init for every ``seed``): the checkpoint, or the offline pretrained MiniLM-L6-H384 encoder
    with a new MLM head. ``trainable``: ``all``; ``head`` (the head's transform and output bias, never the
    tied decoder, which is the frozen word embedding); ``lora`` (rank-``lora_rank`` adapters on every
    query and value projection, plus that head)."""
    from transformers import set_seed

    from hush_hf.assets import minilm_masked_lm
    from hush_hf.trainer import BertForMaskedPositionsLM

    if trainable not in MASKED_LM_TRAINABLE:
        raise ValueError(f"trainable must be one of {list(MASKED_LM_TRAINABLE)}, got {trainable!r}")
    set_seed(seed)
    if model_name_or_path is None:
        model = minilm_masked_lm(BertForMaskedPositionsLM, seed=seed)
    else:
        model = BertForMaskedPositionsLM.from_pretrained(model_name_or_path)
    if trainable == "all":
        return model
    # The head's transform and output bias; its decoder is the (frozen) word embedding it is tied to.
    head = {id(p) for p in model.cls.parameters()} - {id(model.bert.embeddings.word_embeddings.weight)}
    for parameter in model.parameters():
        parameter.requires_grad_(id(parameter) in head)
    if trainable == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules=["query", "value"])
        model = get_peft_model(model, lora)  # freezes everything but the adapters: unfreeze the head again
        for parameter in model.parameters():
            parameter.requires_grad_(parameter.requires_grad or id(parameter) in head)
    return model


def gemma2_model(
    config_name: str | None, vocab_size: int, *, width: int, layers: int, max_length: int, seed: int
) -> Any:
    """A Gemma-2 causal LM trained from scratch (initialised with ``seed``, eager attention): from the
    config ``config_name``, or a small one built from its config: ``layers`` layers of ``width``,
    max(2, width / 32) query and half as many key-value heads of 32, FFN 2 x width, positions and
    sliding window max(128, ``max_length``)."""
    from transformers import AutoConfig, Gemma2ForCausalLM, set_seed

    set_seed(seed)
    if config_name is not None:
        config = AutoConfig.from_pretrained(config_name, attn_implementation="eager")
    else:
        from hush_hf.assets import gemma2_small_config

        heads = max(2, width // 32)
        config = gemma2_small_config(
            vocab_size, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2), head_dim=32, intermediate_size=2 * width,
            max_position_embeddings=max(128, max_length), sliding_window=max(128, max_length),
            attn_implementation="eager",
        )
    return Gemma2ForCausalLM(config)


def copied_builds(build: Callable[[], Any]) -> Callable[[], Any]:
    """``build`` repeated by copying: the first call builds (and keeps a pristine deep copy and the global
    random states the build left: Python's, NumPy's, torch's CPU and CUDA); every later call restores
    those states and returns a deep copy of the kept model. Exactly ``build()`` again when ``build`` seeds
    every generator it draws from before drawing (``bert_masked_lm`` and ``causal_model`` call
    ``set_seed``), so each call returns the same weights and leaves the same states; what it saves is
    the construction (the demo's MiniLM: ~0.55 s a run against ~0.06 s for the copy)."""
    import copy
    import random

    import numpy as np
    import torch

    kept: list[Any] = []

    def states() -> tuple[Any, ...]:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda

    def built() -> Any:
        if not kept:
            model = build()
            kept.extend([copy.deepcopy(model), states()])
            return model
        template, (python_state, numpy_state, torch_state, cuda_state) = kept
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
        return copy.deepcopy(template)

    return built
