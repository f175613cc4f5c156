"""Tiny random-init configs of every model family and training option the one-step test covers (no
tests here).

Each ``Family`` builds a 2-layer model with eager attention and no dropout (float64 in the tests);
``tied`` says whether the output projection shares the word embedding. Each ``Option`` trains one
family with a setting real fine-tunes use (gradient checkpointing). The supported-models tables
(docs/supported_models.md) are generated from ``FAMILIES`` and ``OPTIONS`` by
scripts/supported_models.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

VOCAB, HIDDEN = 96, 16


@dataclass(frozen=True)
class Family:
    name: str  # shown in the docs table
    config_class: str  # transformers class names, for the docs table
    model_class: str
    kind: str  # "causal", "masked" or "seq2seq"
    build: Callable[[bool], nn.Module]  # tied -> model
    ties: tuple[bool, ...] = (True, False)  # the tying settings the config allows
    notes: str = ""
    pads: bool = True  # tested with right-padded rows too (False: the model itself fails on padding)
    reads_padding: bool = False  # a layer reads padded positions: a padded row is refused (padding_readers)
    autograd_reference: bool = False  # the reference takes one autograd backward per example (the forward
    # runs a custom autograd.Function that torch.func cannot differentiate)


def _hf(config_class: str, model_class: str, **config) -> Callable[[bool], nn.Module]:
    def build(tied: bool) -> nn.Module:
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config_class)(tie_word_embeddings=tied, **config)
        cfg._attn_implementation = "eager"
        return getattr(transformers, model_class)(cfg).train()

    return build


_GPT2 = dict(
    vocab_size=VOCAB, n_embd=HIDDEN, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
    attn_pdrop=0.0,
)  # fmt: skip
_DEC = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2)
_LLAMA_LIKE = dict(
    _DEC, intermediate_size=32, num_key_value_heads=1, pad_token_id=0, max_position_embeddings=64
)
_BERT_LIKE = dict(
    _DEC, intermediate_size=32, max_position_embeddings=64, hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0, pad_token_id=0,
)  # fmt: skip


def _moe(
    config_class: str, model_class: str, frozen: tuple[str, ...] = (), **config
) -> Callable[[bool], nn.Module]:
    """A mixture-of-experts model: 4 experts, top-2 (Llama-4: top-1), with transformers' eager expert loop
    (its default grouped_mm has no float64 kernel; the rule does not depend on which one runs).
    ``frozen``: parameter name parts set to requires_grad=False."""
    hf = _hf(config_class, model_class, **config)

    def build(tied: bool) -> nn.Module:
        model = hf(tied)
        model.config._experts_implementation = "eager"
        for name, p in model.named_parameters():
            if any(part in name for part in frozen):
                p.requires_grad_(False)
        return model

    return build


_MOE = dict(_LLAMA_LIKE, num_experts_per_tok=2)
_SSM = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, pad_token_id=0)
_MAMBA2_HEADS = dict(mamba_n_heads=4, mamba_d_head=8, mamba_d_state=4, mamba_chunk_size=4, mamba_d_conv=3)
_SSM_NOTES = "state-space: each Mamba mixer (scan, conv1d, A_log, D, dt) replayed per example"
_LINEAR_ATTENTION = ("linear_attn.conv1d", "linear_attn.norm", "linear_attn.A_log", "linear_attn.dt_bias")


_T5 = dict(
    vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=32, num_layers=2, num_heads=2, dropout_rate=0.0,
    pad_token_id=0, decoder_start_token_id=0, eos_token_id=1,
)  # fmt: skip


def _peft(base: Callable[[bool], nn.Module], config: str, **kwargs: Any) -> Callable[[bool], nn.Module]:
    """``base`` wrapped by ``peft.get_peft_model`` with ``peft.<config>(**kwargs)`` (random-init adapters)."""

    def build(tied: bool) -> nn.Module:
        import peft

        model = base(tied)
        torch.manual_seed(1)
        return peft.get_peft_model(model, getattr(peft, config)(**kwargs))

    return build


def _lora(base: Callable[[bool], nn.Module], targets: list[str], **kwargs: Any):
    return _peft(base, "LoraConfig", r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets,
                 init_lora_weights=False, **kwargs)  # fmt: skip


def _frozen(base: Callable[[bool], nn.Module], parts: tuple[str, ...]) -> Callable[[bool], nn.Module]:
    """``base`` with the parameters whose names contain one of ``parts`` frozen."""

    def build(tied: bool) -> nn.Module:
        model = base(tied)
        for name, p in model.named_parameters():
            if any(part in name for part in parts):
                p.requires_grad_(False)
        return model

    return build


def _adaption_prompt(base: Callable[[bool], nn.Module]) -> Callable[[bool], nn.Module]:
    """PEFT AdaptionPrompt on the last layer, its zero-initialised gate set to 0.5 (at 0 the prompt gets no
    gradient at all)."""
    adapted = _peft(base, "AdaptionPromptConfig", task_type="CAUSAL_LM", adapter_len=3, adapter_layers=1)

    def build(tied: bool) -> nn.Module:
        model = adapted(tied)
        for name, p in model.named_parameters():
            if name.endswith("adaption_gate"):
                p.data.fill_(0.5)
        return model

    return build


TRAINABLE_TOKENS = [5, 17, 40]
"""Token ids whose embedding rows (and, tied, output rows) PEFT's trainable tokens train."""

_LLAMA = _hf("LlamaConfig", "LlamaForCausalLM", **_LLAMA_LIKE)
_SINK_PADDING = (
    "unpadded rows only: its eager sink attention gives right-padded rows a NaN loss (transformers 5.24)"
)


_DEBERTA_NOTE = "the shared relative-position table trained (the encoder replayed per example)"
_READS_PADDING = "unpadded rows only: a padded row is refused (the layer reads padded positions)"

FAMILIES: list[Family] = [
    Family("GPT-2", "GPT2Config", "GPT2LMHeadModel", "causal", _hf("GPT2Config", "GPT2LMHeadModel", **_GPT2)),
    Family("Llama", "LlamaConfig", "LlamaForCausalLM", "causal", _hf(
        "LlamaConfig", "LlamaForCausalLM", **_LLAMA_LIKE)),
    Family("Qwen2", "Qwen2Config", "Qwen2ForCausalLM", "causal", _hf(
        "Qwen2Config", "Qwen2ForCausalLM", **_LLAMA_LIKE)),
    Family("Qwen3", "Qwen3Config", "Qwen3ForCausalLM", "causal", _hf(
        "Qwen3Config", "Qwen3ForCausalLM", head_dim=8, **_LLAMA_LIKE)),
    Family("Mistral", "MistralConfig", "MistralForCausalLM", "causal", _hf(
        "MistralConfig", "MistralForCausalLM", **_LLAMA_LIKE)),
    Family("Phi-3", "Phi3Config", "Phi3ForCausalLM", "causal", _hf(
        "Phi3Config", "Phi3ForCausalLM", resid_pdrop=0.0, embd_pdrop=0.0, **_LLAMA_LIKE)),
    Family("Gemma", "GemmaConfig", "GemmaForCausalLM", "causal", _hf(
        "GemmaConfig", "GemmaForCausalLM", head_dim=8, **_LLAMA_LIKE)),
    Family("Gemma-2", "Gemma2Config", "Gemma2ForCausalLM", "causal", _hf(
        "Gemma2Config", "Gemma2ForCausalLM", head_dim=8, **_LLAMA_LIKE)),
    Family("Gemma-3 (text)", "Gemma3TextConfig", "Gemma3ForCausalLM", "causal", _hf(
        "Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=8, **_LLAMA_LIKE)),
    Family("OPT", "OPTConfig", "OPTForCausalLM", "causal", _hf(
        "OPTConfig", "OPTForCausalLM", vocab_size=VOCAB, hidden_size=HIDDEN, ffn_dim=32, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=HIDDEN, dropout=0.0,
        attention_dropout=0.0, pad_token_id=0), notes="folds batch x sequence in its feed-forward"),
    Family("Falcon", "FalconConfig", "FalconForCausalLM", "causal", _hf(
        "FalconConfig", "FalconForCausalLM", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2,
        num_attention_heads=2, hidden_dropout=0.0, attention_dropout=0.0, pad_token_id=0)),
    Family("GPT-NeoX", "GPTNeoXConfig", "GPTNeoXForCausalLM", "causal", _hf(
        "GPTNeoXConfig", "GPTNeoXForCausalLM", intermediate_size=32, max_position_embeddings=64,
        hidden_dropout=0.0, attention_dropout=0.0, **_DEC)),
    Family("GPT-Neo", "GPTNeoConfig", "GPTNeoForCausalLM", "causal", _hf(
        "GPTNeoConfig", "GPTNeoForCausalLM", vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=2, num_heads=2,
        attention_types=[[["global", "local"], 1]], window_size=8, max_position_embeddings=64,
        resid_dropout=0.0, embed_dropout=0.0, attention_dropout=0.0), notes="local attention window 8"),
    Family("Granite-SWA", "GraniteSWAConfig", "GraniteSWAForCausalLM", "causal", _hf(
        "GraniteSWAConfig", "GraniteSWAForCausalLM", sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], **_LLAMA_LIKE), pads=False,
        notes="sliding window 4, attention sinks (generic replay); " + _SINK_PADDING),
    Family("BERT (MLM)", "BertConfig", "BertForMaskedLM", "masked", _hf(
        "BertConfig", "BertForMaskedLM", **_BERT_LIKE)),
    Family("RoBERTa (MLM)", "RobertaConfig", "RobertaForMaskedLM", "masked", _hf(
        "RobertaConfig", "RobertaForMaskedLM", **dict(_BERT_LIKE, pad_token_id=1)),
        notes="positions from input_ids, counted from padding_idx + 1"),
    Family("Nystromformer (MLM)", "NystromformerConfig", "NystromformerForMaskedLM", "masked", _hf(
        "NystromformerConfig", "NystromformerForMaskedLM", num_landmarks=64, segment_means_seq_len=64,
        **_BERT_LIKE), pads=False, reads_padding=True,
        notes="default positions start at 2 (padding_idx + 1), passed per row from 2; " + _READS_PADDING),
    Family("YOSO (MLM)", "YosoConfig", "YosoForMaskedLM", "masked", _hf(
        "YosoConfig", "YosoForMaskedLM", **_BERT_LIKE), pads=False, reads_padding=True,
        autograd_reference=True,
        notes="expectation attention (a custom autograd.Function: reference by per-example autograd); "
        + _READS_PADDING),
    Family("ConvBERT (MLM)", "ConvBertConfig", "ConvBertForMaskedLM", "masked", _hf(
        "ConvBertConfig", "ConvBertForMaskedLM", embedding_size=HIDDEN, conv_kernel_size=3, **_BERT_LIKE),
        pads=False, reads_padding=True, notes="span-based dynamic convolution; " + _READS_PADDING),
    Family("FNet (MLM)", "FNetConfig", "FNetForMaskedLM", "masked", _hf(
        "FNetConfig", "FNetForMaskedLM", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2,
        intermediate_size=32, max_position_embeddings=64, hidden_dropout_prob=0.0, pad_token_id=0,
        use_tpu_fourier_optimizations=False), pads=False, reads_padding=True,
        notes="Fourier token mixing; " + _READS_PADDING),
    Family("DeBERTa-v2 (MLM)", "DebertaV2Config", "DebertaV2ForMaskedLM", "masked", _hf(
        "DebertaV2Config", "DebertaV2ForMaskedLM", **_BERT_LIKE), notes="absolute positions"),
    Family("DeBERTa-v2 (MLM), relative attention", "DebertaV2Config", "DebertaV2ForMaskedLM", "masked",
        _hf("DebertaV2Config", "DebertaV2ForMaskedLM", relative_attention=True, position_buckets=8,
        max_relative_positions=16, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", **_BERT_LIKE),
        notes="disentangled attention: pos_key_proj and pos_query_proj trained (each "
        "attention replayed per example); " + _DEBERTA_NOTE),
    Family("DeBERTa-v3 (MLM), share_att_key", "DebertaV2Config", "DebertaV2ForMaskedLM", "masked",
        _hf("DebertaV2Config", "DebertaV2ForMaskedLM", relative_attention=True, position_buckets=8,
        max_relative_positions=16, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True,
        **_BERT_LIKE), notes="DeBERTa-v3's layout: the table through query_proj and "
        "key_proj (trained, each attention replayed per example); " + _DEBERTA_NOTE),
    Family("DeBERTa (MLM), relative attention", "DebertaConfig", "DebertaForMaskedLM", "masked",
        _hf("DebertaConfig", "DebertaForMaskedLM", relative_attention=True, max_relative_positions=16,
        pos_att_type=["p2c", "c2p"], **_BERT_LIKE), notes="v1: pos_proj, pos_q_proj, q_bias "
        "and v_bias trained (each attention replayed per example); " + _DEBERTA_NOTE),
    Family("MPNet (MLM)", "MPNetConfig", "MPNetForMaskedLM", "masked", _hf(
        "MPNetConfig", "MPNetForMaskedLM", **dict(_BERT_LIKE, pad_token_id=1)),
        notes="relative_attention_bias trained (the encoder's bias, one copy per example, gathered by "
        "bucket)"),
    Family("T5", "T5Config", "T5ForConditionalGeneration", "seq2seq", _hf(
        "T5Config", "T5ForConditionalGeneration", **_T5),
        notes="relative_attention_bias trained (its per-example gradient gathered by bucket)"),
    Family("UMT5", "UMT5Config", "UMT5ForConditionalGeneration", "seq2seq", _hf(
        "UMT5Config", "UMT5ForConditionalGeneration", **_T5),
        notes="every self-attention's own relative_attention_bias trained (gathered by bucket)"),
    Family("BART", "BartConfig", "BartForConditionalGeneration", "seq2seq", _hf(
        "BartConfig", "BartForConditionalGeneration", vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, scale_embedding=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=2)),
    Family("Mixtral", "MixtralConfig", "MixtralForCausalLM", "causal", _moe(
        "MixtralConfig", "MixtralForCausalLM", num_local_experts=4, **_MOE), ties=(False,),
        notes="MoE: router, 3-D expert weights"),
    Family("Qwen2-MoE", "Qwen2MoeConfig", "Qwen2MoeForCausalLM", "causal", _moe(
        "Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_experts=4, moe_intermediate_size=24,
        shared_expert_intermediate_size=20, **_MOE), ties=(False,),
        notes="MoE with a gated shared expert"),
    Family("Qwen3-MoE", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", "causal", _moe(
        "Qwen3MoeConfig", "Qwen3MoeForCausalLM", head_dim=8, num_experts=4, moe_intermediate_size=24,
        norm_topk_prob=True, **_MOE), ties=(False,), notes="MoE"),
    Family("OLMoE", "OlmoeConfig", "OlmoeForCausalLM", "causal", _moe(
        "OlmoeConfig", "OlmoeForCausalLM", num_experts=4, **_MOE), ties=(False,), notes="MoE"),
    Family("DeepSeek-V3", "DeepseekV3Config", "DeepseekV3ForCausalLM", "causal", _moe(
        "DeepseekV3Config", "DeepseekV3ForCausalLM", **dict(_MOE, num_key_value_heads=2), n_routed_experts=4,
        moe_intermediate_size=24, n_group=2, topk_group=1, n_shared_experts=1, first_k_dense_replace=1,
        q_lora_rank=None, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8),
        ties=(False,), notes="MoE: group-limited routing, float32 router, shared experts, MLA"),
    Family("GPT-OSS", "GptOssConfig", "GptOssForCausalLM", "causal", _moe(
        "GptOssConfig", "GptOssForCausalLM", head_dim=8, num_local_experts=4, sliding_window=8,
        **dict(_MOE, intermediate_size=24)), ties=(False,),
        notes="MoE: transposed experts with biases, router bias, attention sinks"),
    Family("Llama-4 (text)", "Llama4TextConfig", "Llama4ForCausalLM", "causal", _moe(
        "Llama4TextConfig", "Llama4ForCausalLM", head_dim=8, num_local_experts=4, intermediate_size_mlp=32,
        interleave_moe_layer_step=1, **dict(_MOE, num_experts_per_tok=1, intermediate_size=24)),
        ties=(False,), notes="MoE: dense expert-major experts, shared expert"),
    Family("Qwen3-Next", "Qwen3NextConfig", "Qwen3NextForCausalLM", "causal", _moe(
        "Qwen3NextConfig", "Qwen3NextForCausalLM", _LINEAR_ATTENTION, head_dim=8, num_experts=4,
        moe_intermediate_size=24, shared_expert_intermediate_size=20, linear_num_value_heads=2,
        linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8,
        layer_types=["linear_attention", "full_attention"], **_MOE), ties=(False,),
        notes="MoE; linear attention's conv1d, gated norm, A_log, dt_bias frozen (refused otherwise)"),
    Family("Granite-MoE", "GraniteMoeConfig", "GraniteMoeForCausalLM", "causal", _moe(
        "GraniteMoeConfig", "GraniteMoeForCausalLM", num_local_experts=4, **_MOE), ties=(False,),
        notes="MoE: float32 router logits"),
    Family("Granite-MoE-Shared", "GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", "causal", _moe(
        "GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", num_local_experts=4,
        shared_intermediate_size=20, **_MOE), ties=(False,), notes="MoE with a shared MLP"),
    Family("Granite-MoE-Hybrid (attention layers)", "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
        "causal", _moe("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", num_local_experts=4,
        shared_intermediate_size=20, layer_types=["attention", "attention"], mamba_n_heads=4, mamba_d_state=8,
        **_MOE), ties=(False,),
        notes="MoE; its Mamba layers are refused (see the state-space section)"),
    Family("Jamba (attention layers)", "JambaConfig", "JambaForCausalLM", "causal", _moe(
        "JambaConfig", "JambaForCausalLM", num_experts=4, attn_layer_period=1, attn_layer_offset=0,
        expert_layer_period=1, expert_layer_offset=0, use_mamba_kernels=False, **_MOE), ties=(False,),
        notes="MoE; its Mamba layers are refused (see the state-space section)"),
    Family("DeepSeek-V2", "DeepseekV2Config", "DeepseekV2ForCausalLM", "causal", _moe(
        "DeepseekV2Config", "DeepseekV2ForCausalLM", **dict(_MOE, num_key_value_heads=2), n_routed_experts=4,
        moe_intermediate_size=24, n_group=2, topk_group=1, topk_method="group_limited_greedy",
        n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=8, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8), ties=(False,), notes="MoE: group-limited routing, float32 router"),
    Family("DBRX", "DbrxConfig", "DbrxForCausalLM", "causal", _moe(
        "DbrxConfig", "DbrxForCausalLM", vocab_size=VOCAB, d_model=HIDDEN, n_heads=2, n_layers=2,
        max_seq_len=64, attn_config={"kv_n_heads": 1, "rope_theta": 10000.0, "clip_qkv": 8.0},
        ffn_config={"ffn_hidden_size": 24, "moe_num_experts": 4, "moe_top_k": 2}, pad_token_id=0),
        ties=(False,),
        notes="MoE: experts as (E * ffn, d) weights of one GLU"),
    Family("GLM4-MoE", "Glm4MoeConfig", "Glm4MoeForCausalLM", "causal", _moe(
        "Glm4MoeConfig", "Glm4MoeForCausalLM", head_dim=8, n_routed_experts=4, moe_intermediate_size=24,
        n_group=2, topk_group=1, n_shared_experts=1, first_k_dense_replace=1, **_MOE), ties=(False,),
        notes="MoE: group-limited sigmoid routing, float32 router"),
    Family("Ernie-4.5-MoE", "Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", "causal", _moe(
        "Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", moe_num_experts=4, moe_k=2, moe_intermediate_size=24,
        moe_num_shared_experts=1, moe_layer_start_index=1, **_LLAMA_LIKE), ties=(False,),
        notes="MoE: float32 router, shared experts on the folded rows"),
    Family("Cohere2-MoE", "Cohere2MoeConfig", "Cohere2MoeForCausalLM", "causal", _moe(
        "Cohere2MoeConfig", "Cohere2MoeForCausalLM", head_dim=8, num_experts=4, num_shared_experts=1,
        sliding_window=8, **_MOE), ties=(False,), notes="MoE with a shared expert"),
    Family("EXAONE-MoE", "ExaoneMoeConfig", "ExaoneMoeForCausalLM", "causal", _moe(
        "ExaoneMoeConfig", "ExaoneMoeForCausalLM", head_dim=8, num_experts=4, moe_intermediate_size=24,
        first_k_dense_replace=1, sliding_window=8, **_MOE), ties=(False,),
        notes="MoE: sigmoid routing, float32 router, shared expert"),
    Family("HunYuan-MoE", "HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM", "causal", _moe(
        "HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM", head_dim=8, num_experts=4, moe_topk=2,
        **_LLAMA_LIKE), ties=(False,), notes="MoE: router owns an nn.Linear, shared MLP"),
    Family("AfMoE", "AfmoeConfig", "AfmoeForCausalLM", "causal", _moe(
        "AfmoeConfig", "AfmoeForCausalLM", head_dim=8, num_experts=4, moe_intermediate_size=24,
        num_dense_layers=1, num_shared_experts=1, sliding_window=8, global_attn_every_n_layers=2, **_MOE),
        ties=(False,), notes="MoE: sigmoid routing, router owns an nn.Linear, shared experts"),
    Family("Qwen3.5-MoE", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", "causal", _moe(
        "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", _LINEAR_ATTENTION, head_dim=8, num_experts=4,
        moe_intermediate_size=24, shared_expert_intermediate_size=20, linear_num_value_heads=2,
        linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8,
        layer_types=["linear_attention", "full_attention"], **_MOE), ties=(False,),
        notes="MoE; linear attention's conv1d, gated norm, A_log, dt_bias frozen (refused otherwise)"),
    Family("FlexOlmo", "FlexOlmoConfig", "FlexOlmoForCausalLM", "causal", _moe(
        "FlexOlmoConfig", "FlexOlmoForCausalLM", num_experts=4, **_MOE), ties=(False,), notes="MoE"),
    Family("Granite-MoE-SWA", "GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM", "causal", _moe(
        "GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM", num_local_experts=4, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], **_MOE), ties=(False,), pads=False,
        notes="MoE; sliding window 4, attention sinks (generic replay); " + _SINK_PADDING),
    Family("GLM4-MoE-Lite", "Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM", "causal", _moe(
        "Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM", **dict(_MOE, num_key_value_heads=2),
        n_routed_experts=4, moe_intermediate_size=24, n_shared_experts=1, mlp_layer_types=["dense", "sparse"],
        q_lora_rank=None, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8),
        ties=(False,), notes="MoE: float32 router, MLA"),
    Family("Mamba", "MambaConfig", "MambaForCausalLM", "causal", _hf(
        "MambaConfig", "MambaForCausalLM", **_SSM, state_size=4, expand=2, conv_kernel=3), ties=(True,),
        notes=_SSM_NOTES),
    Family("Mamba2", "Mamba2Config", "Mamba2ForCausalLM", "causal", _hf(
        "Mamba2Config", "Mamba2ForCausalLM", **_SSM, state_size=4, expand=2, conv_kernel=3, num_heads=4,
        head_dim=8, n_groups=1, chunk_size=4), ties=(True,), notes=_SSM_NOTES + " (chunked scan)"),
    Family("FalconMamba", "FalconMambaConfig", "FalconMambaForCausalLM", "causal", _hf(
        "FalconMambaConfig", "FalconMambaForCausalLM", **_SSM, state_size=4, expand=2, conv_kernel=3),
        ties=(True,), notes=_SSM_NOTES),
    Family("LFM2", "Lfm2Config", "Lfm2ForCausalLM", "causal", _hf(
        "Lfm2Config", "Lfm2ForCausalLM", layer_types=["conv", "full_attention"], conv_L_cache=3,
        **_LLAMA_LIKE),
        ties=(True,), notes="short-convolution layers replayed per example (generic path), attention layers"),
    Family("Jamba (Mamba + attention)", "JambaConfig", "JambaForCausalLM", "causal", _moe(
        "JambaConfig", "JambaForCausalLM", num_experts=4, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2, expert_layer_offset=1, use_mamba_kernels=False, mamba_d_state=4,
        mamba_d_conv=3, **_MOE), ties=(False,),
        notes="Mamba layer replayed per example; MoE on the attention layer"),
    Family("Bamba", "BambaConfig", "BambaForCausalLM", "causal", _hf(
        "BambaConfig", "BambaForCausalLM", attn_layer_indices=[1], **_MAMBA2_HEADS, **_LLAMA_LIKE),
        ties=(False,), notes=_SSM_NOTES + " (Mamba2 heads), attention layer"),
    Family("Falcon-H1", "FalconH1Config", "FalconH1ForCausalLM", "causal", _hf(
        "FalconH1Config", "FalconH1ForCausalLM", head_dim=8, mamba_d_ssm=32, **_MAMBA2_HEADS, **_LLAMA_LIKE),
        ties=(False,), notes="parallel attention and Mamba2 in every layer; the mixer replayed per example"),
    Family("Zamba2", "Zamba2Config", "Zamba2ForCausalLM", "causal", _hf(
        "Zamba2Config", "Zamba2ForCausalLM", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, mamba_d_state=4, mamba_d_conv=3,
        mamba_headdim=8, n_mamba_heads=4, chunk_size=4, layers_block_type=["mamba", "hybrid"],
        hybrid_layer_ids=[1], attention_head_dim=8, use_mem_rope=False, pad_token_id=0), ties=(True,),
        notes=_SSM_NOTES + "; shared attention block"),
    Family("Granite-MoE-Hybrid (Mamba + attention)", "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
        "causal", _moe("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", num_local_experts=4,
        shared_intermediate_size=20, layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_state=4,
        mamba_d_head=8, mamba_chunk_size=4, mamba_d_conv=3, **_MOE), ties=(False,),
        notes=_SSM_NOTES + "; MoE"),
    Family("Llama + LoRA (peft)", "LlamaConfig", "PeftModelForCausalLM", "causal", _lora(
        _LLAMA, ["q_proj", "v_proj"]), ties=(True,), notes="only the adapters train"),
    Family("GPT-2 + LoRA (peft)", "GPT2Config", "PeftModelForCausalLM", "causal", _lora(
        _hf("GPT2Config", "GPT2LMHeadModel", **_GPT2), ["c_attn"]), ties=(True,),
        notes="only the adapters train"),
    Family("Llama + DoRA (peft)", "LlamaConfig", "PeftModelForCausalLM", "causal", _lora(
        _LLAMA, ["q_proj", "v_proj"], use_dora=True), ties=(True,),
        notes="`LoraConfig(use_dora=True)`; the magnitude vector takes the generic path"),
    Family("Llama + IA3 (peft)", "LlamaConfig", "PeftModelForCausalLM", "causal", _peft(
        _LLAMA, "IA3Config", target_modules=["k_proj", "v_proj", "down_proj"],
        feedforward_modules=["down_proj"], init_ia3_weights=False), ties=(True,),
        notes="each adapted layer is one generic replay"),
    Family("Llama + VeRA (peft)", "LlamaConfig", "PeftModelForCausalLM", "causal", _peft(
        _LLAMA, "VeraConfig", r=4, target_modules=["q_proj", "v_proj"], init_weights=False), ties=(True,),
        notes="each adapted layer is one generic replay"),
    Family("Llama + AdaptionPrompt (peft)", "LlamaConfig", "PeftModelForCausalLM", "causal", _adaption_prompt(
        _LLAMA), ties=(True,), notes="prompt keys/values shared by the batch; the adapted attention by the "
        "generic replay"),
    Family("Llama + trainable tokens (peft)", "LlamaConfig", "PeftModelForCausalLM", "causal", _peft(
        _LLAMA, "TrainableTokensConfig", target_modules=["embed_tokens"], token_indices=TRAINABLE_TOKENS,
        init_weights=False),
        notes="`TrainableTokensConfig`, tokens only in the second micro-batch; tied: their output rows too"),
    Family("Llama + LoRA + trainable tokens (peft)", "LlamaConfig", "PeftModelForCausalLM", "causal", _lora(
        _LLAMA, ["q_proj", "v_proj"], trainable_token_indices=TRAINABLE_TOKENS),
        notes="`LoraConfig(trainable_token_indices=...)`, tokens only in the second micro-batch"),
]  # fmt: skip

PHIMOE = Family("PhiMoE", "PhimoeConfig", "PhimoeForCausalLM", "causal", _moe(
        "PhimoeConfig", "PhimoeForCausalLM", num_local_experts=4, **_MOE), ties=(False,),
        notes="MoE: sparsemixer routing (sampled in training, see the MoE test)")  # fmt: skip
"""Not in ``FAMILIES``: in training PhiMoE samples each token's experts (``sparsemixer``, Gumbel noise) and
differentiates through a custom ``autograd.Function`` that torch.func cannot run; tests/test_clipping_moe.py
compares it with per-example autograd on the same draws."""

BLOOM = Family("BLOOM", "BloomConfig", "BloomForCausalLM", "causal", _hf(
    "BloomConfig", "BloomForCausalLM", vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=2, n_head=2,
    hidden_dropout=0.0, attention_dropout=0.0, pad_token_id=0), notes="ALiBi positions")  # fmt: skip
"""Not in ``FAMILIES``: the one-step test's torch.func reference cannot differentiate ``BloomGelu`` (an
``autograd.Function`` without ``setup_context``); tests/test_example_independence.py uses it."""

CASES: list[tuple[Family, bool]] = [(f, tied) for f in FAMILIES for tied in f.ties]
"""(family, tied) pairs; the test runs each padded + micro-batched and unpadded."""


@dataclass(frozen=True)
class Option:
    """A training setting, tested on ``family`` (its first tying setting): ``args`` are
    ``SecretProtectionConfig`` overrides, ``prepare`` is done to the model before the trainer is built."""

    name: str  # shown in the docs table
    family: str  # a Family's name
    args: dict[str, Any] = field(default_factory=dict)
    prepare: Callable[[nn.Module], None] | None = None
    notes: str = ""


def _enable_checkpointing(model: nn.Module) -> None:
    model.gradient_checkpointing_enable()


_CHECKPOINTING = {"gradient_checkpointing": True}  # transformers 5: non-reentrant unless asked
_REENTRANT = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": True}}
_CKPT_NOTES = "two backward passes per micro-batch; the second stops above the calls the first kept"

OPTIONS: list[Option] = [
    Option("`gradient_checkpointing=True`", "Llama", _CHECKPOINTING, notes=_CKPT_NOTES),
    Option("`gradient_checkpointing=True`", "GPT-2", _CHECKPOINTING, notes="tied embeddings"),
    Option("`gradient_checkpointing=True`", "Gemma-2", _CHECKPOINTING),
    Option("`gradient_checkpointing=True`", "Llama + LoRA (peft)", _CHECKPOINTING),
    Option("`gradient_checkpointing=True`", "T5", _CHECKPOINTING, notes="trainable relative_attention_bias"),
    Option("`gradient_checkpointing=True`", "UMT5", _CHECKPOINTING,
           notes="every self-attention's trainable relative_attention_bias, handed in again when recomputed"),
    Option("`gradient_checkpointing=True`", "OPT", _CHECKPOINTING, notes="batch x sequence folded"),
    Option("`gradient_checkpointing_kwargs={'use_reentrant': True}`", "GPT-2", _REENTRANT),
    Option("`model.gradient_checkpointing_enable()`", "Llama", prepare=_enable_checkpointing),
    Option("`gradient_checkpointing=True`", "Mixtral", _CHECKPOINTING,
           notes="MoE: router logits with the gradient of the scores the router computes from them"),
    Option("`gradient_checkpointing_kwargs={'use_reentrant': True}`", "Mixtral", _REENTRANT),
    Option("`gradient_checkpointing=True`", "DeepSeek-V3", _CHECKPOINTING,
           notes="router takes (b, T, d), returns (b * T, E)"),
    Option("`gradient_checkpointing=True`", "GPT-OSS", _CHECKPOINTING,
           notes="attention sinks (generic replay)"),
    Option("`gradient_checkpointing=True`", "DeBERTa-v3 (MLM), share_att_key", _CHECKPOINTING,
           notes="each attention replayed per example inside the backward"),
    Option("`per_device_train_batch_size=1`", "ConvBERT (MLM)", {"per_device_train_batch_size": 1},
           notes="padded rows: each micro-batch is cut to its one row's length"),
    Option("`per_device_train_batch_size=1`", "YOSO (MLM)", {"per_device_train_batch_size": 1},
           notes="padded rows: each micro-batch is cut to its one row's length"),
    Option("`per_device_train_batch_size=1`", "FNet (MLM)", {"per_device_train_batch_size": 1},
           notes="padded rows (no mask from the collator: inferred from the drawn rows), each micro-batch "
           "cut to its one row's length"),
    Option("`per_device_train_batch_size=1`", "Nystromformer (MLM)", {"per_device_train_batch_size": 1},
           notes="padded rows: each micro-batch is cut to its one row's length"),
]  # fmt: skip


def family_named(name: str) -> Family:
    (found,) = [f for f in FAMILIES if f.name == name]
    return found


def case_id(family: Family, tied: bool) -> str:
    return f"{family.name}-{'tied' if tied else 'untied'}".replace(" ", "_")


def option_id(option: Option) -> str:
    return f"{option.family}-{option.name}".replace(" ", "_").replace("`", "")
