"""Per-example clipping under gradient checkpointing: taps that see each layer call in the backward pass.

With checkpointing (transformers' ``gradient_checkpointing_enable()`` / ``activation_checkpointing=True``,
``torch.utils.checkpoint`` reentrant or not, ``checkpoint_wrapper``) a layer's inputs are not kept
after the forward: they are recomputed, segment by segment, when the backward pass reaches them. The
engine's usual route (keep every layer's input and output gradient, take all norms, then the clipped
sum from the same factors) would keep exactly what checkpointing frees. Here each hooked call's output
goes through a *tap*: an identity autograd node that saves the call's input with ``save_for_backward``.
Saved tensors are what checkpointing manages, so the input is dropped after the forward and recomputed
with its segment, and the tap's backward receives (input, output gradient) of that very call, whether
the segment ran in the forward (non-reentrant: the original node, fed from the recomputation) or is
re-run inside the backward (reentrant). No call has to be matched to another by hand.

Two backward passes per micro-batch (the two-pass ghost clipping of Li et al. 2022, "Large language
models can be strong differentially private learners", Sec. 4, here per segment):

1. ``NormPass``: each tap turns its call into per-example gradients (the layer's rule), adds their
   squared norms and drops them; a parameter used by several calls (tied weights, a layer run twice)
   keeps its uses until the last one arrives, so cross terms stay exact
   (``factors.squared_norm_of_sum``). The number of calls per parameter is counted in the forward.
2. ``SumPass``, once the clip factors c_i are known: each tap adds ``sum_i c_i G_i`` of its call
   (``factors.weighted_sum``), so the applied gradient is built from the same factors as the norms,
   as in the one-pass engine: a use no rule saw is missing from the update, never unclipped.

Each pass is ``autograd.grad`` towards the taps' shared ``anchor`` (and, while the self-check runs,
the unverified parameters; and the parameters of layers whose output is read inside their own call,
``Hold``): no parameter gradient is computed for nothing. Reentrant checkpointing
refuses ``autograd.grad``; under it both passes run ``Tensor.backward``, and the gradients autograd
accumulates into ``p.grad`` meanwhile are set aside and restored (``run_pass``). Memory: one segment's
activations and one call's factors at a time, plus the uses of shared parameters, plus
parameter-sized sums. Time: about two backward passes and two recomputations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from hush_hf.clipping.factors import PerExampleGrad, combine_uses, squared_norm_of_sum, weighted_sum

_ABSENT = object()


def _checkpointing_flag(module: nn.Module) -> bool:
    """``module.gradient_checkpointing is True``, read from the instance, else its class: a flag is never a
    parameter, buffer or submodule, so ``nn.Module.__getattr__`` (slow when the name is missing, as on
    most modules) has nothing to add."""
    value = module.__dict__.get("gradient_checkpointing", _ABSENT)
    if value is _ABSENT:
        value = getattr(type(module), "gradient_checkpointing", False)
        if hasattr(value, "__get__"):  # a property or other descriptor: read it as an attribute
            value = getattr(module, "gradient_checkpointing", False)
    return value is True


def recomputes(model: nn.Module) -> bool:
    """Whether some module of ``model`` may re-run its forward inside the backward pass: transformers'
    ``gradient_checkpointing`` flag (set on its layers by ``gradient_checkpointing_enable()``) or
    torch's ``checkpoint_wrapper``. Read at every forward, so one walk of the modules, kept cheap."""
    return any(_checkpointing_flag(m) or type(m).__name__ == "CheckpointWrapper" for m in model.modules())


class Tap(torch.autograd.Function):
    """Identity on a layer call's output that saves the call's input tensors for the backward pass.

    ``forward(output, anchor, sink, tag, *saved)`` returns a detached alias of ``output`` (same values and
    storage; in-place changes of it later are as harmless as on the output itself); ``backward`` hands
    ``(tag, saved tensors, output gradient)`` to ``sink.receive`` while a clipping pass is active, and
    passes the gradient on unchanged. ``anchor`` is a scalar leaf shared by all taps of a forward, whose
    gradient (always 0) nothing uses: ``autograd.grad(loss, anchor)`` runs exactly the part of the
    backward pass that reaches the taps, without computing any parameter's gradient.
    """

    @staticmethod
    def forward(ctx: Any, output: Tensor, anchor: Tensor, sink: Any, tag: Any, *saved: Tensor) -> Tensor:
        ctx.sink, ctx.tag, ctx.count = sink, tag, len(saved)
        ctx.anchor = (anchor.dtype, anchor.device)
        ctx.save_for_backward(*saved)
        return output.detach()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        if ctx.sink.active:
            ctx.sink.receive(ctx.tag, ctx.saved_tensors, grad)  # unpacking recomputes under checkpointing
        dtype, device = ctx.anchor
        return (grad, torch.zeros((), dtype=dtype, device=device), None, None) + (None,) * ctx.count


class Hold(torch.autograd.Function):
    """Saves a layer call's input tensors for the backward pass, off the gradient path: ``forward(anchor,
    *saved)`` returns a new scalar nothing reads, so its ``backward`` never runs. For a call whose output
    is also read inside the call (a router's logits, from which it computes its routing scores): a
    ``Tap`` after the call would see only the gradient of what the model reads later, so the output's
    own gradient hook reads these tensors instead (``GhostClipper._tap``, ``within``). Saved like a
    ``Tap``'s, they are dropped and recomputed with the checkpointed segment."""

    @staticmethod
    def forward(ctx: Any, anchor: Tensor, *saved: Tensor) -> Tensor:
        ctx.count = len(saved)
        ctx.save_for_backward(*saved)
        return anchor.new_zeros(())

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:  # pragma: no cover - its output is never used
        return (torch.zeros_like(grad),) + (None,) * ctx.count


@dataclass
class NormPass:
    """Pass 1: squared per-example norms, parameter by parameter as their last use arrives.

    ``expected[name]``: the calls of the forward that use the parameter; ``rebuild``: names whose
    ``sum_i G_i`` (all clip factors 1) is also kept, for the self-check.
    """

    batch: int
    expected: Counter[str]
    vocab: int | None
    rebuild: set[str]
    device: torch.device
    loss_dtype: torch.dtype
    squared: Tensor = field(init=False)
    pending: dict[str, list[PerExampleGrad]] = field(default_factory=dict)
    arrived: Counter[str] = field(default_factory=Counter)
    rebuilt: dict[str, Tensor] = field(default_factory=dict)
    dtypes: set[torch.dtype] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.squared = torch.zeros(self.batch, dtype=torch.float64, device=self.device)

    @property
    def seen(self) -> set[str]:
        return set(self.arrived)

    def add(self, name: str, use: PerExampleGrad, shape: torch.Size) -> None:
        self.pending.setdefault(name, []).append(use)
        self.arrived[name] += 1
        if self.arrived[name] >= self.expected[name]:
            self._finish(name, shape)

    def _finish(self, name: str, shape: torch.Size) -> None:
        uses = combine_uses(self.pending.pop(name), self.vocab)
        self.squared += squared_norm_of_sum(uses, self.vocab).to(torch.float64)
        if name in self.rebuild:
            ones = torch.ones(self.batch, dtype=self.loss_dtype, device=self.device)
            self.rebuilt[name] = _sum_of(uses, ones, shape)

    def close(self, shapes: dict[str, torch.Size]) -> None:
        """Finish the parameters whose expected uses did not all arrive (outputs the loss never used)."""
        for name in list(self.pending):
            self._finish(name, shapes[name])


@dataclass
class SumPass:
    """Pass 2: ``sum_i c_i G_i`` of every call, added up per parameter."""

    coef: Tensor
    sums: dict[str, Tensor] = field(default_factory=dict)

    def add(self, name: str, use: PerExampleGrad, shape: torch.Size) -> None:
        part = _sum_of([use], self.coef, shape)
        held = self.sums.get(name)
        self.sums[name] = part if held is None else held.add_(part.to(held.dtype))


def _sum_of(uses: list[PerExampleGrad], weights: Tensor, shape: torch.Size) -> Tensor:
    total: Tensor | None = None
    for use in uses:
        part = weighted_sum(use, weights).reshape(shape)
        total = part if total is None else total.add_(part.to(total.dtype))
    assert total is not None
    return total


def run_pass(
    params: list[tuple[str, nn.Parameter]],
    backward: Callable[[], None],
) -> dict[str, Tensor | None]:
    """Run ``backward`` (a ``Tensor.backward`` call) with every ``p.grad`` set aside; returns what autograd
    accumulated per parameter name (None where nothing reached it) and restores the earlier gradients."""
    held = [p.grad for _, p in params]
    for _, p in params:
        p.grad = None
    try:
        backward()
        return {name: p.grad for name, p in params}
    finally:
        for (_, p), g in zip(params, held, strict=True):
            p.grad = g
