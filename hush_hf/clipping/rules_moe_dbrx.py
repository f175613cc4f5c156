"""DBRX's experts: per-example gradients of ``w1``, ``v1``, ``w2`` (each (E * ffn, d), in ``DbrxExpertGLU``).

Read from transformers' ``DbrxExperts.forward``: for every (token t, expert e) pair of the top-k choice,
with W1, V1, W2 the (ffn, d) rows of expert e and w the pair's routing weight,

    h = x_t W1^T,   u = x_t V1^T,   a = act(h) * u,   y = a W2,   out_t += w y.

With dy = w g_t (g_t the token's output gradient), da = dy W2^T, dh = act'(h) (da * u), du = da * act(h),
pair p adds ``dh x^T`` to W1[e], ``du x^T`` to V1[e] and ``a^T dy`` to W2[e]: ``routed.RoutedOuterSum`` of
shape (E, ffn, d), the parameters' (E * ffn, d) read expert-major. The call's hidden states are
(batch, seq, d) (the FFN passes them unflattened), its indices and weights (batch * seq, k), batch-major.
Pairs whose routing weight or output gradient is zero add exactly 0 and are left out.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hush_hf.clipping.registry import RecordedCall, register_norm_rule
from hush_hf.clipping.routed import RoutedOuterSum
from hush_hf.clipping.rules_moe import _as_used, _autocast, _grouped, routed_pairs, sharded_experts_problem

_WEIGHTS = ("mlp.w1", "mlp.v1", "mlp.w2")


def _trainable(experts: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, experts.get_parameter(n)) for n in _WEIGHTS if experts.get_parameter(n).requires_grad]


def dbrx_experts_problem(experts: nn.Module) -> str | None:
    return sharded_experts_problem(experts.mlp)


@register_norm_rule(
    "transformers.models.dbrx.modeling_dbrx.DbrxExperts",
    check=dbrx_experts_problem,
    records_call=True,
    owns=_trainable,
)
def dbrx_experts_grads(experts: nn.Module, call: RecordedCall, g: Tensor) -> dict[str, RoutedOuterSum]:
    """Per-example gradients of DBRX's expert weights from one call (see the module docstring)."""
    hidden, index, weights = (*call.args, *call.kwargs.values())[:3]
    batch, n_experts, ffn = g.shape[0], experts.num_experts, experts.ffn_hidden_size
    hidden = hidden.reshape(-1, hidden.shape[-1])
    g = g.reshape(-1, g.shape[-1])
    tokens, top_k = index.shape
    if hidden.shape[0] != tokens or g.shape[0] != tokens or tokens % batch:
        raise ValueError(
            f"DbrxExperts got {hidden.shape[0]} hidden rows, {tokens} routed tokens and {g.shape[0]} output "
            f"rows for {batch} examples"
        )
    token, expert, weight, example, groups = routed_pairs(index, weights, g, batch, n_experts)
    counts = groups.expert_counts(batch)
    shape = (n_experts, ffn, hidden.shape[-1])
    w1, v1, w2 = (experts.get_parameter(n).detach().view(shape) for n in _WEIGHTS)
    with torch.no_grad(), _autocast(call):
        x = _as_used(hidden[token], call)
        h = _grouped(x, w1, counts, transposed=False)  # x W1[e]^T
        u = _grouped(x, v1, counts, transposed=False)
    with torch.enable_grad(), _autocast(call):
        h_leaf = h.detach().requires_grad_(True)
        act = experts.mlp.activation_fn(h_leaf)
        dy = (g[token] * weight[:, None]).to(h.dtype)
        da = _grouped(dy, w2, counts, transposed=False)  # dy W2[e]^T
        (dh,) = torch.autograd.grad(act, h_leaf, (da * u).to(act.dtype))
    act = act.detach()
    a = act * u
    du = da * act

    def routed(row: Tensor, col: Tensor) -> RoutedOuterSum:
        return RoutedOuterSum(example, expert, row, col, batch, n_experts, groups)

    return {"mlp.w1": routed(dh, x), "mlp.v1": routed(du, x), "mlp.w2": routed(a, dy)}
