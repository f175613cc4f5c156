"""Per-example gradient rules for mixture-of-experts layers (transformers 5): routers, experts, and the
MoE blocks that fold batch x sequence into rows.

Read from transformers' modeling files (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3, GPT-OSS,
Llama-4 text, Qwen3-Next): an MoE block flattens its (batch, seq, d) input to (batch * seq, d), rows
batch-major (``register_batch_fold``), and calls

- a router: ``logits = x W^T (+ b)``, then the top-k choice (DeepSeek-V3: group-limited, on scores
  plus ``e_score_correction_bias``, a buffer that is not trained) and the routing weights, all
  functions of the logits computed inside the call. So the logits' gradient carries all of W's and
  the rule is nn.Linear's on the unfolded tokens (``output_index``: the logits' place in the returned
  tuple). Every token is routed by its own hidden state; no family here has a capacity limit or drops
  tokens, so example i's routing, and its gradient, depend on example i alone.
- the experts: one parameter per projection holding all E experts, (E, out, in) or, transposed,
  (E, in, out) (GPT-OSS, Llama-4), plus (E, out) biases (GPT-OSS), applied to each (token, expert)
  pair of the top-k choice: ``h = W_up[e] x (+ b)``, ``a = gate(h)`` (``act(gate) * up`` or the
  family's own ``_apply_gate``), ``y = W_down[e] a (+ b)``, and the token's output ``sum_k w_k y_k``.
  The rule replays the pairs of the recorded call once, expert by expert as transformers' eager loop
  does (only the pairs whose routing weight and output gradient are nonzero: the others add exactly
  0): ``dy = w g_t`` is the gradient at the down projection's output, and ``dh`` the vector-Jacobian
  product of the gate at h with ``dy W_down[e]``. Pair p then adds ``dy a^T`` to W_down[e] and
  ``dh x^T`` to W_up[e] (transposed layouts: the transposes): ``routed.RoutedOuterSum``, whose norm
  never forms a per-example copy of all experts. The replay costs one pass over the experts'
  up-projections and gates and one product with the down projections, about a third of the layer's
  forward and backward work. For transformers' default ``grouped_mm`` experts the engine runs the call
  itself while it records (``experts_capture``: the same products, the pairs in a known order) and the
  rule reads x, a and dh from that forward and the engine's backward pass instead (``captured_grads``);
  other implementations (the eager loop, ``batched_mm``, kernels) are replayed.
- shared experts (Qwen2-MoE, DeepSeek-V3, Llama-4, Qwen3-Next) are ordinary Linear layers, folded.

GPT-OSS's attention also owns ``sinks`` (one extra softmax logit per head) and returns a tuple: its first
output is differentiated by the generic torch.func replay (``rules_generic``). Qwen3-Next's Gated DeltaNet
(linear attention) layers read ``conv1d.weight`` in their own forward and run their gated norm on
(batch * seq * heads) rows: those parameters are refused (frozen, the layers' projections train).

Llama-4's experts run densely on (E * batch * seq, d) rows, expert-major, each row the token scaled by
its router score (zero for an expert it is not routed to): a layout of its own, read by its own rule.

The router's load-balancing loss (``output_router_logits=True``) is a function of every token's routing
in the batch, so it is no per-example loss: ``trainer.losses`` refuses it.

Registered by qualified class name, so importing this module does not import transformers.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from hush_hf.clipping.experts_capture import ExpertsCapture, OwnForward
from hush_hf.clipping.factors import DenseFactor, OuterSum, PerExampleGrad
from hush_hf.clipping.registry import RecordedCall, register_batch_fold, register_norm_rule, register_refusal
from hush_hf.clipping.routed import PairGroups, RoutedOuterSum, pair_groups
from hush_hf.clipping.rules_generic import generic_grads, generic_problem, own_trainable
from hush_hf.clipping.rules_torch import as_sequence, bias_grad, linear_grads

_MODELS = "transformers.models"

# The MoE blocks: each flattens (batch, seq, d) to (batch * seq, d), batch-major, before its router,
# experts and shared experts (DeepSeek-V3's router flattens inside, its shared experts see (b, seq, d)).
for _block in (
    "mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
    "olmoe.modeling_olmoe.OlmoeSparseMoeBlock",
    "deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE",
    "gpt_oss.modeling_gpt_oss.GptOssMLP",
    "llama4.modeling_llama4.Llama4TextMoe",
    "qwen3_next.modeling_qwen3_next.Qwen3NextSparseMoeBlock",
):
    register_batch_fold(f"{_MODELS}.{_block}")


# ----------------------------------------------------------------------------- routers
@register_norm_rule(
    *(
        f"{_MODELS}.{_router}"
        for _router in (
            "mixtral.modeling_mixtral.MixtralTopKRouter",
            "qwen2_moe.modeling_qwen2_moe.Qwen2MoeTopKRouter",
            "qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter",
            "olmoe.modeling_olmoe.OlmoeTopKRouter",
            "gpt_oss.modeling_gpt_oss.GptOssTopKRouter",
            "qwen3_next.modeling_qwen3_next.Qwen3NextTopKRouter",
        )
    ),
    casts_input_under_autocast=True,
    output_index=0,
)
def router_grads(router: nn.Module, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """``logits = x W^T (+ b)`` (``F.linear`` on the tokens): example i's gradient is
    ``sum_t dlogits_t x_t^T`` (and ``sum_t dlogits_t`` for a bias), nn.Linear's rule."""
    grads: dict[str, PerExampleGrad] = {
        "weight": OuterSum(DenseFactor(as_sequence(g)), DenseFactor(as_sequence(x)))
    }
    if getattr(router, "bias", None) is not None:
        grads["bias"] = bias_grad(g)
    return grads


@register_norm_rule(
    f"{_MODELS}.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter",
    casts_input_under_autocast=True,
    output_index=0,
)
def float32_router_grads(router: nn.Module, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """DeepSeek-V3: ``logits = F.linear(x.float(), W.float())``: the router rule on the input in float32
    (exact for a bf16 or float32 input, and what the op saw in a float64 model)."""
    return router_grads(router, x.float(), g)


@register_norm_rule(
    f"{_MODELS}.llama4.modeling_llama4.Llama4Router", casts_input_under_autocast=True, output_index=1
)
def llama4_router_grads(router: nn.Linear, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """Llama-4's router is an nn.Linear whose forward returns (scores, logits), logits its Linear output."""
    return linear_grads(router, x, g)


# ----------------------------------------------------------------------------- experts
def experts_problem(experts: nn.Module) -> str | None:
    """Expert layouts the rule does not replay (read from transformers' ``use_experts_implementation``)."""
    if not all(hasattr(experts, a) for a in ("has_gate", "has_bias", "is_transposed", "num_experts")):
        return "its experts are not built by transformers' use_experts_implementation (unknown layout)"
    if getattr(experts, "has_post_expert_norm", False):
        return "a norm after each expert is not supported by the mixture-of-experts rule"
    if getattr(experts, "_is_expert_parallel", False):
        return "expert parallelism (experts sharded across ranks) is not supported with DP training"
    return sharded_experts_problem(experts)


def sharded_experts_problem(experts: nn.Module) -> str | None:
    """The replay reads the whole expert weights after the backward, when FSDP2 has resharded them."""
    if any(isinstance(p, DTensor) for p in experts.parameters(recurse=False)):
        return "expert weights sharded by FSDP2 (fully_shard) are not supported; use DDP for MoE models"
    return None


def _autocast(call: RecordedCall) -> contextlib.AbstractContextManager:
    if call.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(call.autocast[0], dtype=call.autocast[1])


def _as_used(x: Tensor, call: RecordedCall) -> Tensor:
    """The input as the experts' first product saw it: cast to the autocast dtype under autocast."""
    if call.autocast is not None and x.is_floating_point():
        return x.to(call.autocast[1])
    return x


def _nonzero(rows: Tensor) -> Tensor:
    """(n,) mask of the rows of a 2-D tensor that are not all zero (NaN rows kept)."""
    high = rows.amax(dim=-1)
    return (high > 0) | (rows.amin(dim=-1) < 0) | high.isnan()


def _grouped(
    x: Tensor, weight: Tensor, counts: Sequence[int], transposed: bool, *, adjoint: bool = False
) -> Tensor:
    """Rows of ``x`` (pairs grouped by expert, ``counts[e]`` rows for expert e) times their expert's
    matrix, expert by expert as transformers' eager loop runs them: ``x W[e]^T`` for W[e] (out, in),
    ``x W[e]`` for a transposed W[e] (in, out); with ``adjoint``, the product back to the input side
    (``x W[e]``, resp. ``x W[e]^T``)."""
    width = weight.shape[2] if transposed != adjoint else weight.shape[1]
    # Written in place where autocast does not pick the product's dtype: no concatenated copy.
    direct = x.dtype == weight.dtype and not torch.is_autocast_enabled(x.device.type)
    out = x.new_empty(x.shape[0], width) if direct else None
    parts, start = [], 0
    for e, count in enumerate(counts):
        if count:
            rows, w = x[start : start + count], weight[e] if transposed != adjoint else weight[e].T
            if out is not None:
                torch.mm(rows, w, out=out[start : start + count])
            else:
                parts.append(rows @ w)
            start += count
    if out is not None:
        return out
    return torch.cat(parts) if parts else x.new_zeros(0, width)


def routed_pairs(
    index: Tensor, weights: Tensor, g: Tensor, batch: int, n_experts: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, PairGroups]:
    """(token, expert, routing weight, example) of the (token, expert) pairs of a top-k call that carry
    something (an expert index in range, a nonzero weight and output gradient: the others add exactly 0),
    grouped by expert as the eager loop runs them and, within an expert, by example (tokens ascend), with
    their ``PairGroups``: one device-to-host read, no boolean indexing. ``index``/``weights``: (n, k);
    ``g``: the call's output gradient, (n, d), batch-major."""
    tokens, top_k = index.shape
    token = torch.arange(tokens, device=index.device).repeat_interleave(top_k)
    expert, weight = index.reshape(-1).long(), weights.reshape(-1)
    live = (expert < n_experts) & (weight != 0) & _nonzero(g)[token]
    expert = torch.where(live, expert, n_experts)  # the others sort last, past every expert
    order = torch.argsort(expert, stable=True)
    token, expert, weight = token[order], expert[order], weight[order]
    example = token // (tokens // batch)
    groups = pair_groups(example, expert, batch, n_experts + 1)
    assert groups.order is None  # grouped by construction
    sizes = groups.sizes[: batch * n_experts]
    kept = sum(sizes)
    return token[:kept], expert[:kept], weight[:kept], example[:kept], PairGroups(None, sizes)


def call_arguments(experts: nn.Module, args: Sequence, kwargs: dict) -> tuple[Tensor, Tensor, Tensor]:
    """(hidden states (n, d), expert indices (n, k), routing weights (n, k)) of one experts call; the
    names differ by family (GPT-OSS: router_indices, routing_weights), the order does not."""
    bound = inspect.signature(type(experts).forward).bind(experts, *args, **kwargs)
    values = list(bound.arguments.values())[1:4]
    if len(values) != 3 or not all(isinstance(v, Tensor) for v in values):
        raise ValueError(
            f"{type(experts).__name__} must be called with (hidden_states, top_k_index, top_k_weights)"
        )
    hidden, index, weights = values
    if hidden.dim() != 2 or index.shape != weights.shape or index.shape[0] != hidden.shape[0]:
        raise ValueError(
            f"{type(experts).__name__} got hidden states {tuple(hidden.shape)}, indices {tuple(index.shape)} "
            f"and weights {tuple(weights.shape)}; expected (n, d), (n, k), (n, k)"
        )
    return hidden, index, weights


def _call_arguments(experts: nn.Module, call: RecordedCall) -> tuple[Tensor, Tensor, Tensor]:
    return call_arguments(experts, call.args, dict(call.kwargs))


@register_norm_rule(
    *(
        f"{_MODELS}.{_experts}"
        for _experts in (
            "mixtral.modeling_mixtral.MixtralExperts",
            "qwen2_moe.modeling_qwen2_moe.Qwen2MoeExperts",
            "qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts",
            "olmoe.modeling_olmoe.OlmoeExperts",
            "deepseek_v3.modeling_deepseek_v3.DeepseekV3Experts",
            "gpt_oss.modeling_gpt_oss.GptOssExperts",
            "qwen3_next.modeling_qwen3_next.Qwen3NextExperts",
        )
    ),
    check=experts_problem,
    records_call=True,
    own_forward=OwnForward,
)
def topk_experts_grads(experts: nn.Module, call: RecordedCall, g: Tensor) -> dict[str, RoutedOuterSum]:
    """Per-example gradients of every expert parameter from one call (see the module docstring)."""
    problem = experts_problem(experts)
    if problem is not None:  # expert parallelism can be switched on after the clipper was built
        raise ValueError(f"{type(experts).__name__}: {problem}")
    hidden, index, weights = _call_arguments(experts, call)
    batch, n_experts = g.shape[0], experts.num_experts
    g = g.reshape(-1, g.shape[-1])  # the rows as the call returned them (batch-major)
    tokens, top_k = index.shape
    if g.shape[0] != tokens:
        raise ValueError(f"{type(experts).__name__} returned {g.shape[0]} rows for {tokens} tokens")
    capture = call.capture
    if isinstance(capture, ExpertsCapture) and capture.dh is not None:
        # dL/d(the pair's down-projection output): the token's output gradient times its routing weight
        pair = capture.pair
        dy = (g[pair // top_k] * weights.reshape(-1)[pair][:, None]).to(capture.dh.dtype)
        return captured_grads(experts, capture, dy, batch, tokens)
    token, expert, weight, example, groups = routed_pairs(index, weights, g, batch, n_experts)
    counts = groups.expert_counts(batch)
    up_name = "gate_up_proj" if experts.has_gate else "up_proj"
    up, down = getattr(experts, up_name).detach(), experts.down_proj.detach()
    transposed = bool(experts.is_transposed)
    with torch.no_grad(), _autocast(call):
        x = _as_used(hidden[token], call)
        h = _grouped(x, up, counts, transposed)
        if experts.has_bias:
            h = h + getattr(experts, f"{up_name}_bias").detach()[expert]
    with torch.enable_grad(), _autocast(call):
        h_leaf = h.detach().requires_grad_(True)
        a = experts._apply_gate(h_leaf) if experts.has_gate else experts.act_fn(h_leaf)
        # d loss / d (the pair's down-projection output): the token's output gradient times its routing
        # weight, in the dtype the projection returned (autograd casts it there too).
        dy = (g[token] * weight[:, None]).to(h.dtype)
        da = _grouped(dy, down, counts, transposed, adjoint=True)
        (dh,) = torch.autograd.grad(a, h_leaf, da.to(a.dtype))
    return _pair_grads(experts, example, expert, x, a.detach(), dh, dy, batch, groups)


def _pair_grads(
    experts: nn.Module,
    example: Tensor,
    expert: Tensor,
    x: Tensor,
    a: Tensor,
    dh: Tensor,
    dy: Tensor,
    batch: int,
    groups: PairGroups | None,
) -> dict[str, RoutedOuterSum]:
    """Every expert parameter's per-example gradient from the pairs' x (up projection input), a (gate
    output), dh and dy (gradients at the up and down projections' outputs)."""
    n_experts = experts.num_experts
    up_name = "gate_up_proj" if experts.has_gate else "up_proj"

    def routed(row: Tensor, col: Tensor) -> RoutedOuterSum:
        return RoutedOuterSum(example, expert, row, col, batch, n_experts, groups)

    if experts.is_transposed:
        grads = {up_name: routed(x, dh), "down_proj": routed(a, dy)}
    else:
        grads = {up_name: routed(dh, x), "down_proj": routed(dy, a)}
    if experts.has_bias:
        ones = dy.new_ones(dy.shape[0], 1)
        grads[f"{up_name}_bias"] = routed(dh, ones)
        grads["down_proj_bias"] = routed(dy, ones)
    return grads


def captured_grads(
    experts: nn.Module, capture: ExpertsCapture, dy: Tensor, batch: int, tokens: int
) -> dict[str, RoutedOuterSum]:
    """The rule from what the engine's own run of the call kept (``experts_capture``): rows already
    grouped by expert and, within one, by example. Rows whose gradients are zero (a zero routing weight,
    a token without a target) are kept: they add exactly 0, and gathering the others would copy every
    row's x, a, dh and dy."""
    if batch == 0 or tokens % batch:
        name = type(experts).__name__
        raise ValueError(f"{name} ran on {tokens} tokens, not a multiple of {batch} examples")
    assert capture.dh is not None
    example = capture.pair // (capture.top_k * (tokens // batch))
    return _pair_grads(experts, example, capture.expert, capture.x, capture.a, capture.dh, dy, batch, None)


@register_norm_rule(
    f"{_MODELS}.llama4.modeling_llama4.Llama4TextExperts", check=sharded_experts_problem, records_call=True
)
def llama4_experts_grads(experts: nn.Module, call: RecordedCall, g: Tensor) -> dict[str, RoutedOuterSum]:
    """Llama-4: ``h = x_r W_up[e]``, ``a = up * act(gate)``, ``y = a W_down[e]`` on every row r = e * n + t
    of the (E * n, d) input (expert-major; x_r = score(t, e) * token t, zero where t is not routed to e).
    Rows with a zero input or output gradient add exactly 0 and are left out."""
    (hidden,) = [*call.args, *call.kwargs.values()]
    batch, n_experts = g.shape[0], experts.num_experts
    g = g.reshape(-1, g.shape[-1])
    rows = hidden.shape[0]
    if g.shape[0] != rows or rows % (n_experts * batch):
        raise ValueError(
            f"{type(experts).__name__} got {rows} rows for {n_experts} experts and {batch} examples"
        )
    tokens = rows // n_experts
    live = torch.nonzero(_nonzero(hidden) & _nonzero(g)).flatten()  # expert-major: grouped by expert
    expert, token = live // tokens, live % tokens
    counts = torch.bincount(expert, minlength=n_experts).tolist()
    up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
    with torch.no_grad(), _autocast(call):
        x = _as_used(hidden[live], call)
        h = _grouped(x, up, counts, transposed=True)
    with torch.enable_grad(), _autocast(call):
        h_leaf = h.detach().requires_grad_(True)
        gate, value = h_leaf.chunk(2, dim=-1)
        a = value * experts.act_fn(gate)
        dy = g[live].to(h.dtype)
        da = _grouped(dy, down, counts, transposed=True, adjoint=True)
        (dh,) = torch.autograd.grad(a, h_leaf, da.to(a.dtype))
    example = token // (tokens // batch)
    return {
        "gate_up_proj": RoutedOuterSum(example, expert, x, dh, batch, n_experts),
        "down_proj": RoutedOuterSum(example, expert, a.detach(), dy, batch, n_experts),
    }


# ----------------------------------------------------------------------------- GPT-OSS attention sinks
class _Output(nn.Module):
    """``layer(...)[index]`` as a module that owns the layer's own trainable parameters (the same
    Parameter objects; the layer itself is held outside the module tree), so that the generic replay
    differentiates that one output of a layer returning a tuple."""

    def __init__(self, layer: nn.Module, index: int) -> None:
        super().__init__()
        object.__setattr__(self, "layer", layer)
        self.index = index
        self.names = [n for n, _ in own_trainable(layer)]
        for name, p in own_trainable(layer):
            self.register_parameter(name, p)

    def forward(self, *args: object, **kwargs: object) -> Tensor:
        theta = {n: getattr(self, n) for n in self.names}
        return torch.func.functional_call(self.layer, theta, args, kwargs)[self.index]


@register_norm_rule(
    f"{_MODELS}.gpt_oss.modeling_gpt_oss.GptOssAttention",
    check=generic_problem,
    records_call=True,
    output_index=0,
)
def attention_sinks_grads(attention: nn.Module, call: RecordedCall, g: Tensor) -> dict[str, PerExampleGrad]:
    """GPT-OSS attention returns (output, weights); ``sinks`` (per head) by the generic replay of the output.

    The replay runs without the key/value cache the forward got (it holds the keys and values of the
    whole batch once the forward ran): exact for a training forward, which starts from an empty cache
    (checked: the cache holds no more positions than this call added)."""
    kwargs = dict(call.kwargs)
    for name in ("cache", "past_key_values"):
        cache = kwargs.get(name)
        if cache is None:
            continue
        primary = call.primary
        # (PEFT's AdaptedAttention wraps the attention that carries the layer index)
        inner = getattr(attention, "model", None)
        layer_idx = getattr(attention, "layer_idx", getattr(inner, "layer_idx", 0))
        length = cache.get_seq_length(layer_idx) if hasattr(cache, "get_seq_length") else None
        if primary is None or length != primary.shape[1]:
            raise ValueError(
                f"{type(attention).__name__} ran with a key/value cache that held earlier positions; "
                "training forwards must not pass past_key_values"
            )
        kwargs[name] = None
    return generic_grads(_Output(attention, 0), replace(call, kwargs=kwargs), g)


def gated_delta_net_problem(layer: nn.Module) -> str | None:
    """Qwen3-Next's Gated DeltaNet: ``conv1d.weight`` is read by the layer's own forward
    (``causal_conv1d_fn``), not through ``conv1d``; its gated norm runs on (batch * seq * heads) rows with
    a second input; ``A_log`` and ``dt_bias`` act inside the chunked delta rule, which the generic
    torch.func replay does not get through (measured: a shape error inside the rule under vmap)."""
    names = ("conv1d.weight", "norm.weight", "A_log", "dt_bias")
    trainable = [n for n in names if layer.get_parameter(n).requires_grad]
    if not trainable:
        return None
    return (
        f"its {', '.join(trainable)} have no exact per-example gradient here (conv1d.weight is read by the "
        "layer's own forward, the gated norm sees (batch * seq * heads) rows, A_log and dt_bias act inside "
        "the chunked delta rule); freeze them on every linear_attn layer (its in_proj_qkvz, in_proj_ba and "
        "out_proj train exactly)"
    )


register_refusal(f"{_MODELS}.qwen3_next.modeling_qwen3_next.Qwen3NextGatedDeltaNet", gated_delta_net_problem)
