"""Generic per-example gradients of a layer's own small parameters with torch.func.

For a layer without a registered rule (norm scales and biases, learned positions, any elementwise
affine), one call ``y = f(theta, inputs)`` is replayed per example from what the forward recorded:
with g = d(sum_j loss_j)/dy, whose row i is example i's own output gradient (loss_i depends on
example i only), example i's gradient of the layer's own parameters is

    G_i = d/dtheta <f(theta, inputs_i), g_i>,

computed for the whole batch at once by ``vmap(grad(...))`` over the batch dimension (the approach of
Opacus's functorch fallback, ``opacus/grad_sample/functorch.py``). The result is materialised,
``(b, *theta.shape)``, and enters the engine's combination of all uses of each parameter like any other
rule's, so a parameter used by several layers (tied) keeps its exact cross terms.

Limits, refused rather than approximated: layers whose own trainable parameters exceed
``GENERIC_MAX_PARAMS`` (a materialised per-example gradient would cost that much memory per example;
register a factored rule), randomness inside the layer (vmap refuses it: a replay would draw other
numbers), and anything else ``torch.func`` cannot trace (the error is reported with the layer).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from hush_hf.clipping.factors import Materialized
from hush_hf.clipping.registry import LayerRule, RecordedCall, UnsupportedLayerError

GENERIC_MAX_PARAMS = 2**23
"""Most trainable values a layer may own on the generic path: 2^23 floats are 32 MiB per example in
float32 (OPT-1.3b's learned positions, 2050 x 2048, fit; a vocabulary-sized embedding does not)."""


def own_trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The module's own trainable parameters, except those that are also a submodule's parameter (the
    same object, e.g. a head's bias tied to its decoder's): their uses are counted through that
    submodule's calls."""
    shared = {id(p) for child in module.children() for p in child.parameters()}
    return [
        (n, p)
        for n, p in module._parameters.items()
        if p is not None and p.requires_grad and id(p) not in shared
    ]


def generic_problem(module: nn.Module) -> str | None:
    """Why the generic path cannot serve this layer, or None."""
    size = sum(p.numel() for _, p in own_trainable(module))
    if size > GENERIC_MAX_PARAMS:
        return (
            f"its {size} trainable values exceed the generic per-example path's limit of "
            f"{GENERIC_MAX_PARAMS} (each example's gradient would be materialised); freeze them "
            "(requires_grad=False) or register a factored rule with hush_hf.clipping.register_norm_rule"
        )
    return None


def generic_grads(module: nn.Module, call: RecordedCall, g: Tensor) -> dict[str, Materialized]:
    """``{name: Materialized(G)}`` with G[i] = d/dtheta <module(theta, inputs_i), g_i> (see module docstring).

    Every tensor argument of 2+ dimensions whose first dimension is the batch size is split per
    example (as a batch of one); other arguments are passed unchanged. An output shared by the batch,
    (1, ...), was expanded to the batch when recorded (``GhostClipper._record_call``), so row i of g
    is example i's gradient of it and each example's replay gives the same (1, ...) output. Runs with
    the recorded autocast state, without building a graph of the surrounding model.
    """
    b = g.shape[0]
    own = dict(own_trainable(module))
    params = {n: p.detach() for n, p in own.items()}
    flat, spec = tree_flatten((tuple(call.args), dict(call.kwargs)))
    split = [isinstance(v, Tensor) and v.dim() > 1 and v.shape[0] == b for v in flat]
    per_example = [v for v, s in zip(flat, split, strict=True) if s]

    def contribution(theta: dict[str, Tensor], rows: list[Tensor], g_row: Tensor) -> Tensor:
        it = iter(rows)
        values = [next(it).unsqueeze(0) if s else v for v, s in zip(flat, split, strict=True)]
        args, kwargs = tree_unflatten(values, spec)
        out = functional_call(module, theta, tuple(args), kwargs)
        if not isinstance(out, Tensor):
            raise TypeError(f"the layer returned {type(out).__name__}, not a tensor")
        if tuple(out.shape) != (1, *g_row.shape):  # never let broadcasting pair the wrong entries
            expected = (1, *g_row.shape)
            raise ValueError(f"one example's output has shape {tuple(out.shape)}, expected {expected}")
        return (out * g_row.unsqueeze(0)).sum()

    autocast = (
        torch.autocast(call.autocast[0], dtype=call.autocast[1])
        if call.autocast is not None
        else contextlib.nullcontext()
    )
    try:
        with torch.no_grad(), autocast:
            grads = vmap(grad(contribution), in_dims=(None, 0, 0))(params, per_example, g)
    except Exception as err:  # torch.func refusals come as many exception types
        reason = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        if "random" in reason:
            reason = (
                "its forward draws random numbers (e.g. dropout), which a replay cannot reproduce; move "
                "the randomness out of the layer or set its probability to 0"
            )
        raise UnsupportedLayerError(
            f"the generic per-example gradient (torch.func) of {type(module).__name__} failed: {reason}; "
            "freeze its parameters (requires_grad=False) or register a rule with "
            "hush_hf.clipping.register_norm_rule"
        ) from err
    return {n: Materialized(grads[n]) for n in own}


GENERIC_RULE = LayerRule(generic_grads, check=generic_problem, records_call=True)
"""The rule the engine plans for a layer that owns trainable parameters and has no registered rule."""
