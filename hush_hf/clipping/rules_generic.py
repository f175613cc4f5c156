"""Generic per-example gradients of a layer's own parameters with torch.func.

For a layer without a registered rule (norm scales and biases, learned positions, any elementwise
affine), one call ``y = f(theta, inputs)`` is replayed per example from what the forward recorded:
with g = d(sum_j loss_j)/dy, whose row i is example i's own output gradient (loss_i depends on
example i only), example i's gradient of the layer's own parameters is

    G_i = d/dtheta <f(theta, inputs_i), g_i>,

computed for many examples at once by ``vmap(grad(...))`` over the batch dimension (the approach of
Opacus's functorch fallback, ``opacus/grad_sample/functorch.py``). The result is materialised,
``(b, *theta.shape)``, and enters the engine's combination of all uses of each parameter like any other
rule's, so a parameter used by several layers (tied) keeps its exact cross terms. A parameter whose
gradients for the whole batch would exceed ``GENERIC_CHUNK_VALUES`` values (a vocabulary-sized scaled
embedding, OPT-6.7B's learned positions) is ``Replayed`` instead: the same replay, a chunk of examples at
a time, whenever its norm or its clipped sum is taken, so its memory stays bounded at any size.

The same path serves a PEFT adapter layer that reads its parameters directly from a
``ParameterDict`` (IA3, VeRA, ...: ``GENERIC_CONTAINER_RULE``): the replay runs the adapter layer's
own forward, differentiated w.r.t. those parameters.

Limits, refused rather than approximated: randomness inside the layer (dropout with p > 0 at
construction, any other random draw when vmap meets it: a replay would draw other numbers), and
anything else ``torch.func`` cannot trace (the error is reported with the layer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from hush_hf.clipping.factors import Materialized, PerExampleGrad, Replayed
from hush_hf.clipping.registry import LayerRule, RecordedCall, UnsupportedLayerError

GENERIC_CHUNK_VALUES = 2**25
"""Most per-example gradient values the generic path forms at once (128 MiB in float32): below it the
whole batch's gradients are materialised and kept like any rule's; above it, ``Replayed`` in chunks of
``max(1, GENERIC_CHUNK_VALUES // parameter size)`` examples."""


_replays = 0  # rule calls and generic replays running now (possibly nested)


def replaying() -> bool:
    """Whether a rule or a generic replay is running: the module calls it makes are not the model's
    (hooks must not record them). Replays run lazily too (``Replayed``), outside any rule call."""
    return _replays > 0


@contextlib.contextmanager
def replay() -> Iterator[None]:
    """Marks the module calls made inside as a rule's own (``replaying``), not the model's."""
    global _replays
    _replays += 1
    try:
        yield
    finally:
        _replays -= 1


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


def subtree_trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Every trainable parameter of the module and its submodules, by dotted name (each once)."""
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


_CONTAINERS = (nn.ParameterDict, nn.ParameterList)


def container_trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The module's own trainable parameters and those of its ``ParameterDict``/``ParameterList``
    children, by dotted name (other submodules keep theirs: they are called, and have their own rules)."""
    held = [
        (f"{child_name}.{n}", p)
        for child_name, child in module.named_children()
        if isinstance(child, _CONTAINERS)
        for n, p in child.named_parameters()
        if p.requires_grad
    ]
    return own_trainable(module) + held


def holds_parameter_container(module: nn.Module) -> bool:
    """Whether a direct child is a ``ParameterDict``/``ParameterList`` holding a trainable parameter.

    Such a container is never called: the module reads its parameters directly (PEFT's IA3 ``ia3_l``,
    VeRA's ``vera_lambda_*``), so the module is the layer whose call the per-example gradient of those
    parameters is taken of (``GENERIC_CONTAINER_RULE``)."""
    return any(
        isinstance(child, _CONTAINERS) and any(p.requires_grad for p in child.parameters())
        for child in module.children()
    )


def random_submodule(module: nn.Module) -> str | None:
    """The path of a dropout with p > 0 inside the module (itself included), or None."""
    for path, sub in module.named_modules():
        if isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p > 0:
            return path or "<itself>"
    return None


def generic_problem(module: nn.Module) -> str | None:
    """Why the generic path cannot serve this layer (known before training), or None."""
    random = random_submodule(module)
    if random is not None:
        return (
            f"its forward draws random numbers (dropout with p > 0 at '{random}'), which the per-example "
            "replay of the generic path cannot reproduce; set that dropout probability to 0 (e.g. "
            "lora_dropout=0.0) or register a rule with hush_hf.clipping.register_norm_rule"
        )
    return None


def _failure(module: nn.Module, err: Exception) -> UnsupportedLayerError:
    reason = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
    if "random" in reason:
        reason = (
            "its forward draws random numbers (e.g. dropout), which a replay cannot reproduce; move "
            "the randomness out of the layer or set its probability to 0"
        )
    kind = type(module)
    name = kind.__name__ if kind.__module__.startswith("torch.") else f"{kind.__module__}.{kind.__qualname__}"
    return UnsupportedLayerError(
        f"the generic per-example gradient (torch.func) of {name} failed: {reason}; freeze its parameters "
        "(requires_grad=False) or register a rule with hush_hf.clipping.register_norm_rule"
    )


def generic_grads(
    module: nn.Module,
    call: RecordedCall,
    g: Tensor,
    *,
    owns: Callable[[nn.Module], list[tuple[str, nn.Parameter]]] = own_trainable,
    rows_at_once: int | None = None,
) -> dict[str, PerExampleGrad]:
    """``{name: G}`` with G[i] = d/dtheta <module(theta, inputs_i), g_i> (see module docstring), for the
    parameters ``owns`` selects: the module's own trainable ones, or with ``container_trainable`` those
    of its ``ParameterDict`` children too (dotted names). ``rows_at_once``: replay at most that many
    examples at a time (a module whose forward holds much more than its parameters' gradients, a whole
    encoder), materialising the same result.

    Every tensor argument of 2+ dimensions whose first dimension is the batch size is split per
    example (as a batch of one); other arguments are passed unchanged. An output shared by the batch,
    (1, ...), was expanded to the batch when recorded (``GhostClipper._record_call``), so row i of g
    is example i's gradient of it and each example's replay gives the same (1, ...) output. Runs with
    the recorded autocast state, without building a graph of the surrounding model.
    """
    b = g.shape[0]
    own = dict(owns(module))
    params = {n: p.detach() for n, p in own.items()}
    flat, spec = tree_flatten((tuple(call.args), dict(call.kwargs)))
    split = [isinstance(v, Tensor) and v.dim() > 1 and v.shape[0] == b for v in flat]
    per_example = [v for v, s in zip(flat, split, strict=True) if s]

    def contribution(theta: dict[str, Tensor], fixed: dict[str, Tensor], rows: list[Tensor], g_row: Tensor):
        it = iter(rows)
        values = [next(it).unsqueeze(0) if s else v for v, s in zip(flat, split, strict=True)]
        args, kwargs = tree_unflatten(values, spec)
        out = functional_call(module, {**fixed, **theta}, tuple(args), kwargs)
        if not isinstance(out, Tensor):
            raise TypeError(f"the layer returned {type(out).__name__}, not a tensor")
        if tuple(out.shape) != (1, *g_row.shape):  # never let broadcasting pair the wrong entries
            expected = (1, *g_row.shape)
            raise ValueError(f"one example's output has shape {tuple(out.shape)}, expected {expected}")
        return (out * g_row.unsqueeze(0)).sum()

    def run(names: list[str], rows: slice) -> dict[str, Tensor]:
        theta = {n: params[n] for n in names}
        fixed = {n: v for n, v in params.items() if n not in theta}
        autocast = (
            torch.autocast(call.autocast[0], dtype=call.autocast[1])
            if call.autocast is not None
            else contextlib.nullcontext()
        )
        try:
            with replay(), torch.no_grad(), autocast:
                return vmap(grad(contribution), in_dims=(None, None, 0, 0))(
                    theta, fixed, [v[rows] for v in per_example], g[rows]
                )
        except Exception as err:  # torch.func refusals come as many exception types
            raise _failure(module, err) from err

    if b * sum(p.numel() for p in params.values()) <= GENERIC_CHUNK_VALUES:
        step = max(1, rows_at_once or b)
        parts = [run(list(params), slice(start, start + step)) for start in range(0, b, step)]
        if len(parts) == 1:
            return {n: Materialized(parts[0][n]) for n in own}
        return {n: Materialized(torch.cat([part[n] for part in parts])) for n in own}
    replayed: dict[str, PerExampleGrad] = {}
    for n, p in params.items():
        compute: Callable[[slice], Tensor] = partial(_single, run, n)
        replayed[n] = Replayed(compute, b, max(1, GENERIC_CHUNK_VALUES // p.numel()))
    return replayed


def _single(run: Callable[[list[str], slice], dict[str, Tensor]], name: str, rows: slice) -> Tensor:
    return run([name], rows)[name]


GENERIC_RULE = LayerRule(generic_grads, check=generic_problem, records_call=True)
"""The rule the engine plans for a layer that owns trainable parameters and has no registered rule."""

GENERIC_CONTAINER_RULE = LayerRule(
    partial(generic_grads, owns=container_trainable),
    check=generic_problem,
    records_call=True,
    owns=container_trainable,
)
"""The rule for a module that reads trainable parameters of a ``ParameterDict``/``ParameterList`` child
(``holds_parameter_container``): one generic replay of the module for them and its own."""
