"""The mixture-of-experts families beyond those ``rules_moe`` was written from, mapped onto its rules.

Read from transformers' modeling files (5.24). Every block below flattens its (batch, seq, d) input to
(batch * seq, d) with ``view``/``reshape`` of a contiguous tensor, rows batch-major, before its router and
experts (``register_batch_fold``: row r belongs to example r // seq); its shared experts see either layout.
Every router computes one token's logits from that token's hidden state alone, and its top-k choice and
routing weights from those logits inside the call, with no capacity limit and no dropped tokens: example
i's routing and gradient depend on example i alone (the token -> example map is r // seq).

- routers ``logits = F.linear(x, W)`` returning ``(logits, weights, index)`` (Granite-MoE and its Shared,
  Hybrid and SWA variants (``.float()`` after the product), Jamba, Cohere2-MoE, Qwen3.5-MoE, FlexOlmo):
  ``rules_moe.router_grads`` on the logits (``output_index=0``);
- routers ``F.linear(x.float(), W.float())`` (DeepSeek-V2, GLM4-MoE, GLM4-MoE-Lite, EXAONE-MoE,
  Ernie-4.5-MoE): the float32 router rule, as DeepSeek-V3's;
- PhiMoE's router is an ``nn.Linear`` subclass returning ``(logits, weights, index)``: nn.Linear's rule on
  the logits. In training its ``sparsemixer`` samples each token's experts (Gumbel noise drawn per token)
  and its multiplier's backward is a custom estimator; both act on that token's logits only, so the
  logits' gradient still carries all of W's, and the recorded call holds the experts drawn;
- routers that own an ``nn.Linear`` (HunYuan-MoE's ``wg``, AfMoE's ``gate``, DBRX's ``layer``): nothing to
  register but the fold; the Linear's own rule sees the flattened tokens;
- experts built by ``use_experts_implementation`` (3-D ``gate_up_proj``/``down_proj``): ``rules_moe``'s
  replay; DBRX's experts (``w1``, ``v1``, ``w2`` of shape (E * ffn, d), in ``DbrxExpertGLU``): their own
  rule (``rules_moe_dbrx``).

Refused: NLLB-MoE (its router's expert capacity is counted over the whole batch's tokens), JetMoE (its
``JetMoeParallelExperts`` get rows the router already gathered and sorted: which token, hence which
example, a row holds is not in the call) and PhiMoE/DBRX input jitter (an in-place multiplication of the
layer input by fresh noise, which the recorded input would not show).

Registered by qualified class name, so importing this module does not import transformers.
"""

from __future__ import annotations

from torch import Tensor, nn

from hush_hf.clipping.experts_capture import OwnForward
from hush_hf.clipping.factors import PerExampleGrad
from hush_hf.clipping.registry import register_batch_fold, register_norm_rule, register_refusal
from hush_hf.clipping.rules_moe import (
    experts_problem,
    float32_router_grads,
    gated_delta_net_problem,
    router_grads,
    topk_experts_grads,
)
from hush_hf.clipping.rules_torch import linear_grads

_MODELS = "transformers.models"

# (module, block, router or None when the router owns an nn.Linear, router kind, experts or None)
_FAMILIES: tuple[tuple[str, str, str | None, str, str | None], ...] = (
    ("granitemoe", "GraniteMoeMoE", "GraniteMoeTopKRouter", "linear", "GraniteMoeExperts"),
    ("granitemoeshared", "GraniteMoeSharedMoE", "GraniteMoeSharedTopKRouter", "linear",
     "GraniteMoeSharedExperts"),
    ("granitemoehybrid", "GraniteMoeHybridMoE", "GraniteMoeHybridTopKRouter", "linear",
     "GraniteMoeHybridExperts"),
    ("granitemoe_swa", "GraniteMoeSWAMoE", "GraniteMoeSWATopKRouter", "linear", "GraniteMoeSWAExperts"),
    ("jamba", "JambaSparseMoeBlock", "JambaTopKRouter", "linear", "JambaExperts"),
    ("cohere2_moe", "Cohere2MoeSparseMoeBlock", "Cohere2MoeTopKRouter", "linear", "Cohere2MoeExperts"),
    ("qwen3_5_moe", "Qwen3_5MoeSparseMoeBlock", "Qwen3_5MoeTopKRouter", "linear", "Qwen3_5MoeExperts"),
    ("flex_olmo", "FlexOlmoSparseMoeBlock", "FlexOlmoTopKRouter", "linear", "FlexOlmoExperts"),
    ("deepseek_v2", "DeepseekV2Moe", "DeepseekV2TopkRouter", "float32", "DeepseekV2Experts"),
    ("glm4_moe", "Glm4MoeMoE", "Glm4MoeTopkRouter", "float32", "Glm4MoeExperts"),
    ("glm4_moe_lite", "Glm4MoeLiteMoE", "Glm4MoeLiteTopkRouter", "float32", "Glm4MoeLiteExperts"),
    ("exaone_moe", "ExaoneMoeSparseMoEBlock", "ExaoneMoeTopkRouter", "float32", "ExaoneMoeExperts"),
    ("ernie4_5_moe", "Ernie4_5_MoeSparseMoeBlock", "Ernie4_5_MoeTopKRouter", "float32",
     "Ernie4_5_MoeExperts"),
    ("phimoe", "PhimoeSparseMoeBlock", "PhimoeTopKRouter", "nn.Linear", "PhimoeExperts"),
    ("hunyuan_v1_moe", "HunYuanMoEV1Moe", None, "", "HunYuanMoEV1Experts"),
    ("afmoe", "AfmoeSparseMoeBlock", None, "", "AfmoeExperts"),
    ("dbrx", "DbrxFFN", None, "", None),
)  # fmt: skip


def _name(module: str, cls: str) -> str:
    return f"{_MODELS}.{module}.modeling_{module}.{cls}"


def _nn_linear_router_grads(router: nn.Linear, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """An ``nn.Linear`` subclass whose forward returns (logits, ...) with logits its Linear output."""
    return linear_grads(router, x, g)


_ROUTER_RULES = {
    "linear": router_grads,
    "float32": float32_router_grads,
    "nn.Linear": _nn_linear_router_grads,
}

for _module, _block, _router, _kind, _experts in _FAMILIES:
    register_batch_fold(_name(_module, _block))
    if _router is not None:
        register_norm_rule(_name(_module, _router), casts_input_under_autocast=True, output_index=0)(
            _ROUTER_RULES[_kind]
        )
    if _experts is not None:
        register_norm_rule(
            _name(_module, _experts), check=experts_problem, records_call=True, own_forward=OwnForward
        )(topk_experts_grads)


def _jitter_problem(block: nn.Module) -> str | None:
    """Input jitter multiplies the layer's input in place by noise drawn in the forward."""
    for name in ("input_jitter_noise", "moe_jitter_eps"):
        value = getattr(block, name, None)
        if value is None and hasattr(block, "router"):
            value = getattr(block.router, name, None)
        if value:
            return (
                f"{name}={value} multiplies the layer input in place by fresh noise during training; "
                f"set {name}=0 (or None) in the model config"
            )
    return None


for _module, _block in (("phimoe", "PhimoeSparseMoeBlock"), ("dbrx", "DbrxFFN")):
    register_refusal(_name(_module, _block), _jitter_problem)


def jetmoe_problem(layer: nn.Module) -> str | None:
    """JetMoE's experts see the tokens gathered and sorted by the router (``batch_index``), not the tokens."""
    if not any(p.requires_grad for p in layer.parameters()):
        return None
    return (
        "its JetMoeParallelExperts are called on rows the router gathered and sorted by expert, so which "
        "example a row belongs to is not in the call; per-example gradients of JetMoE's experts are not "
        "supported (freeze the MoE and MoA layers, e.g. train LoRA adapters on the other projections)"
    )


for _block in ("JetMoeMoE", "JetMoeMoA"):
    register_refusal(_name("jetmoe", _block), jetmoe_problem)


# Qwen3.5-MoE's Gated DeltaNet layers are Qwen3-Next's (same parameters read the same way).
register_refusal(_name("qwen3_5_moe", "Qwen3_5MoeGatedDeltaNet"), gated_delta_net_problem)


def capacity_routing_problem(layer: nn.Module) -> str:
    """NLLB-MoE's top-2 router drops the tokens beyond each expert's capacity, counted by a cumulative sum
    over all the tokens of the batch: whether a token of example i reaches its expert depends on how many
    tokens of the other examples went there first, so example i's output (and every gradient after this
    layer) depends on the other examples."""
    return (
        "its router drops tokens beyond each expert's capacity, counted over all the tokens of the batch, so "
        "one example's output depends on the other examples and no per-example gradient of this model is "
        "bounded by C; NLLB-MoE cannot be trained with per-example clipping (use the dense NLLB / M2M100)"
    )


register_refusal(_name("nllb_moe", "NllbMoeSparseMLP"), capacity_routing_problem)
