"""Per-example gradient rules for PEFT adapters that LoRA's ``nn.Linear`` rules do not cover (peft 0.21).

LoRA (and DoRA, whose magnitude vector takes the generic path) needs nothing here; IA3 and VeRA keep
their vectors in a ``ParameterDict`` that the adapter layer reads directly, so the whole adapter layer
is one generic replay (``rules_generic.GENERIC_CONTAINER_RULE``, chosen by ``holds_parameter_container``).
This module adds what the generic path cannot do well or at all:

- ``trainable_token_indices`` / ``TrainableTokensConfig``: a closed-form rule (the generic replay would
  form a vocabulary-sized weight gradient per example inside its vmap);
- LoHa and LoKr: refused at construction, before training (see ``lycoris_problem``).

Registered by qualified class name, so importing this module does not import peft.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hush_hf.clipping.factors import Materialized, PerExampleGrad, compute_dtype
from hush_hf.clipping.registry import register_norm_rule, register_refusal
from hush_hf.clipping.rules_generic import subtree_trainable
from hush_hf.clipping.rules_torch import as_sequence, embedding_config_problem

_DELTAS = "trainable_tokens_delta"


def trainable_tokens_problem(layer: nn.Module) -> str | None:
    """What a ``TrainableTokensLayer`` must look like for ``trainable_tokens_grads`` to be its exact rule."""
    others = [n for n, p in layer.named_parameters() if p.requires_grad and not n.startswith(f"{_DELTAS}.")]
    if others:
        return (
            f"the wrapped layer's own parameter(s) {others} are trainable beside the trainable tokens, and "
            "the adapter reads them directly; freeze them or train the layer without trainable tokens"
        )
    base = layer.get_base_layer()
    if type(base) not in (nn.Embedding, nn.Linear):
        return f"trainable tokens on a {type(base).__name__} (only nn.Embedding and nn.Linear are supported)"
    for adapter, indices in layer.token_indices.items():
        if len(set(indices)) != len(indices):
            return f"adapter {adapter!r} lists a token index more than once (which row wins is undefined)"
    return embedding_config_problem(base) if isinstance(base, nn.Embedding) else None


@register_norm_rule(
    "peft.tuners.trainable_tokens.layer.TrainableTokensLayer",
    check=trainable_tokens_problem,
    casts_input_under_autocast=True,
    owns=subtree_trainable,
)
def trainable_tokens_grads(layer: nn.Module, x: Tensor, g: Tensor) -> dict[str, PerExampleGrad]:
    """PEFT's trainable tokens: the wrapped layer runs with W' = W whose rows ``token_indices[a]`` are
    replaced by ``delta_a`` (``index_copy``). An embedding, y_t = W'[x_t] * s (s its ``embed_scale``, if
    any): row j of delta_a gets sum_{t: x_t = idx_j} s g_t, nothing where x_t is the padding index. An
    output projection, y_t = W' h_t (no bias): row j gets sum_t g_t[idx_j] h_t. Adapters that are not
    active, or merged into the weight, get no gradient."""
    base = layer.get_base_layer()
    steps = x.reshape(x.shape[0], -1) if isinstance(base, nn.Embedding) else as_sequence(x)
    grads = as_sequence(g)
    dtype = compute_dtype(grads, *([steps] if steps.is_floating_point() else []))
    deltas = dict(layer.trainable_tokens_delta.named_parameters(prefix=_DELTAS))
    live = [] if layer.disable_adapters or layer.merged else layer.active_adapters
    out: dict[str, PerExampleGrad] = {}
    for name, delta in deltas.items():
        adapter = name.removeprefix(f"{_DELTAS}.")
        if not delta.requires_grad:
            continue
        if adapter not in live:
            out[name] = Materialized(torch.zeros(x.shape[0], *delta.shape, dtype=dtype, device=g.device))
            continue
        index = torch.as_tensor(layer.token_indices[adapter], device=g.device)
        if isinstance(base, nn.Embedding):
            hits = (steps[:, :, None] == index).to(dtype)  # (b, T, n)
            if base.padding_idx is not None:
                hits = hits * (steps != base.padding_idx)[:, :, None].to(dtype)
            scale = layer._get_embed_scale()
            rows = grads.to(dtype) * (scale.to(dtype) if scale is not None else 1.0)
            out[name] = Materialized(torch.einsum("btn,btd->bnd", hits, rows))
        else:
            picked = grads[:, :, index].to(dtype)  # (b, T, n): the logits gradient of the trainable rows
            out[name] = Materialized(torch.einsum("btn,btd->bnd", picked, steps.to(dtype)))
    return out


def lycoris_problem(layer: nn.Module) -> str | None:
    """LoHa and LoKr (peft's LyCORIS family) draw ``torch.rand`` in every training forward (module
    dropout, even at probability 0), which the generic replay (torch.func) cannot reproduce, and form a
    full-size weight update per call (LoHa with a custom autograd Function); no exact per-example rule
    is registered for them."""
    if not any(p.requires_grad for p in layer.parameters()):
        return None
    method = "LoHa" if ".loha." in type(layer).__module__ else "LoKr"
    return (
        f"PEFT {method} is not supported with per-example clipping: its training forward draws random "
        "numbers (module dropout, drawn even at probability 0) and builds a full-size weight update, so its "
        "per-example gradients cannot be replayed exactly; use LoRA, DoRA, IA3 or VeRA"
    )


for _method, _classes in (("loha", ("Linear", "Conv2d", "Conv1d")), ("lokr", ("Linear", "Conv2d", "Conv1d"))):
    for _name in _classes:
        register_refusal(f"peft.tuners.{_method}.layer.{_name}", lycoris_problem)


def shared_prompt_problem(encoder: nn.Module) -> str | None:
    """Prompt tuning and P-tuning (peft ``get_prompt``): the virtual prompt is computed once, from one row of
    prompt tokens, and ``.repeat(batch_size, 1, 1)`` copies it into every row of the batch. The encoder's
    call therefore sees one row, and its output's gradient is the sum over the batch of every example's
    part before any layer could record one example's: there is no per-example gradient to take there."""
    if not any(p.requires_grad for p in encoder.parameters()):
        return None
    method = "prompt tuning" if type(encoder).__name__ == "PromptEmbedding" else "P-tuning"
    return (
        f"PEFT {method} computes the virtual prompt once per batch (one row of prompt tokens, then "
        "`.repeat(batch_size, 1, 1)`), so the gradient reaching its encoder is already summed over the "
        "examples, which hush_hf does not split per example; use prefix tuning (computed per row), LoRA "
        "or IA3"
    )


register_refusal("peft.tuners.prompt_tuning.model.PromptEmbedding", shared_prompt_problem)
register_refusal("peft.tuners.p_tuning.model.PromptEncoder", shared_prompt_problem)
