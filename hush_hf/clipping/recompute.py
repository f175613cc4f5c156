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

Each pass is ``autograd.grad`` towards the taps' anchors, one scalar leaf per call (and, while the
self-check runs, the unverified parameters; and the parameters of layers whose output is read inside
their own call, ``Hold``): no parameter gradient is computed for nothing.

The calls the norm pass reaches last (the bottom of the network) are the ones the sum pass would reach
last, after recomputing and back-propagating through everything above them. The norm pass keeps the
per-example gradients of the last-arriving calls, as many as the bytes they hold fit in the factor bytes
of the embeddings and ``KEEP_SEGMENTS`` checkpointed segments (``keep_budget``), and the sum pass asks
autograd only for the anchors of the others: autograd runs only the nodes that lead to what is asked for,
so the sum pass stops above the kept calls, and their sums come from the very per-example gradients their
norms were taken of. A kept call is never upstream of an asked one (it arrived after all of them), and
the sum pass ignores a kept call that reports anyway, so every call is summed exactly once
(``SumPass.finish`` checks that every call that was not kept arrived). When every call is kept there is
no sum pass at all. A low-rank adapter's gradient is held materialised, (b, r, d) in float32 where its
factors take (b, T, r + d) (``NormPass``): with bf16 factors, every call of an L-layer model fits roughly
when 2 L r <= T (Llama-1B, 16 layers with rank-16 adapters on all projections, at T = 1024 holds about
half the budget).

Reentrant checkpointing refuses ``autograd.grad``; under it both passes run ``Tensor.backward``, the
gradients autograd accumulates into ``p.grad`` meanwhile are set aside and restored (``run_pass``), and
nothing is kept.

Memory: one segment's activations and one call's factors at a time, plus the uses of shared
parameters, the kept calls' factors and parameter-sized sums. Time: about two backward passes and two
recomputations, less the kept calls' share of the second.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from hush_hf.clipping.factors import (
    Materialized,
    PerExampleGrad,
    combine_uses,
    held_bytes,
    squared_norm_of_sum,
    weighted_sum,
)
from hush_hf.clipping.module_walk import ClassKind, class_kind, reruns_forward
from hush_hf.clipping.zero_steps import drop_zero_steps_if_costly

KEEP_SEGMENTS = 1.0
"""The norm pass keeps the last-arriving calls' per-example gradients up to this many checkpointed
segments' factor bytes (``keep_budget``); 0 keeps only calls below the segments."""


def checkpointed_segments(model: nn.Module) -> tuple[list[nn.Module], dict[int, int]]:
    """The modules that re-run their forward in the backward pass (``module_walk.reruns_forward``) with no
    such module inside them (transformers also flags the base model around its checkpointed layers), in
    ``model.modules()`` order, and the index of the segment each module inside one belongs to (by id).

    One depth-first walk (read at every forward under checkpointing; a walk by name and one per segment
    took 4.3 ms per micro-batch for a 16-layer Llama with LoRA on a 2-core CPU): each module's subtree is
    a range of the walk's order, so a flagged module is a segment when no later flagged one is in its
    range, and its modules are that range."""
    order: list[nn.Module] = []
    ends: list[int] = []
    flagged: list[int] = []
    seen = {id(model)}
    kinds: dict[type, ClassKind] = {}

    def visit(module: nn.Module) -> None:
        at = len(order)
        order.append(module)
        ends.append(at)
        cls = module.__class__
        if reruns_forward(module, kinds[cls] if cls in kinds else kinds.setdefault(cls, class_kind(cls))):
            flagged.append(at)
        for child in module._modules.values():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                visit(child)
        ends[at] = len(order)

    visit(model)
    segments = [at for k, at in enumerate(flagged) if k + 1 == len(flagged) or flagged[k + 1] >= ends[at]]
    within = {id(order[j]): k for k, at in enumerate(segments) for j in range(at, ends[at])}
    return [order[at] for at in segments], within


def checkpoint_configuration(segments: list[nn.Module]) -> tuple[tuple[Any, ...], ...]:
    """What says how each checkpointed segment re-runs its forward: the segment, and the checkpoint function
    it was given (transformers' ``_gradient_checkpointing_func``, a partial that holds ``use_reentrant``;
    torch's ``CheckpointWrapper`` keeps ``checkpoint_fn``). The objects themselves, compared by identity
    (neither defines equality), so a function replaced by a new one is a new configuration. The
    checkpointed step walks the autograd graph for a reentrant checkpoint again when this changes."""
    return tuple(
        (s, s.__dict__.get("_gradient_checkpointing_func"), s.__dict__.get("checkpoint_fn")) for s in segments
    )


def keep_budget(bottom_bytes: int, segment_bytes: list[int]) -> float:
    """Bytes of per-example gradients the norm pass keeps for the sum pass: the factor bytes of the calls
    made before the first checkpointed segment (``bottom_bytes``: the embeddings) and ``KEEP_SEGMENTS``
    times those of the largest segment's calls, so that the bottom segment can be kept whole (a segment
    kept in part is recomputed all the same); none with fewer than two segments, where one segment is
    the whole model. Calls above the segments (a large-vocabulary head) do not count."""
    if len(segment_bytes) < 2:
        return 0.0
    return bottom_bytes + KEEP_SEGMENTS * max(segment_bytes)


class Tap(torch.autograd.Function):
    """Identity on a layer call's output that saves the call's input tensors for the backward pass.

    ``forward(output, anchor, sink, tag, *saved)`` returns a detached alias of ``output`` (same values and
    storage; in-place changes of it later are as harmless as on the output itself); ``backward`` hands
    ``(tag, saved tensors, output gradient)`` to ``sink.receive`` while a clipping pass is active, and
    passes the gradient on unchanged. ``anchor`` is the call's own scalar leaf, whose gradient (always 0)
    nothing uses: ``autograd.grad(loss, anchors)`` runs exactly the part of the backward pass that
    reaches those calls' taps, without computing any parameter's gradient.
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
    ``sum_i G_i`` (all clip factors 1) is also kept, for the self-check. ``keep_bytes``: what the
    last-arriving calls may hold for the sum pass (see the module docstring), counted as the bytes of
    what they hold (``held_bytes``; ``call_bytes``, each call's estimated factor bytes by call index,
    for a form whose bytes are not known). A parameter's only use that ``combine_uses`` materialises is
    held materialised, as its norm was taken: a low-rank adapter's (b, r, d) gradients are a small part
    of its factors, so with LoRA the kept calls can be all of them, and the sum pass, with its second
    recomputation and backward pass, is not run at all.
    """

    batch: int
    expected: Counter[str]
    vocab: int | None
    rebuild: set[str]
    device: torch.device
    loss_dtype: torch.dtype
    keep_bytes: float = 0.0
    call_bytes: list[int] = field(default_factory=list)
    squared: Tensor = field(init=False)
    pending: dict[str, list[PerExampleGrad]] = field(default_factory=dict)
    arrived: Counter[str] = field(default_factory=Counter)
    rebuilt: dict[str, Tensor] = field(default_factory=dict)
    dtypes: set[torch.dtype] = field(default_factory=set)
    calls: dict[int, set[str]] = field(default_factory=dict)  # arrived calls (in order): their parameters
    kept: dict[int, list[tuple[str, PerExampleGrad, torch.Size]]] = field(default_factory=dict)
    kept_sizes: dict[int, int] = field(default_factory=dict)  # bytes held by each kept call
    kept_bytes: int = 0
    not_worth: set[tuple[int, ...]] = field(default_factory=set)  # see ``drop_zero_steps_if_costly``
    compacted: dict[tuple[int, str], bool] = field(default_factory=dict)  # (call, name): steps dropped?

    def __post_init__(self) -> None:
        self.squared = torch.zeros(self.batch, dtype=torch.float64, device=self.device)

    @property
    def seen(self) -> set[str]:
        return set(self.arrived)

    def pruned(self, g: PerExampleGrad, vocab: int | None, call: int, name: str) -> PerExampleGrad:
        """``g`` with its zero steps dropped where that is worth a read (``drop_zero_steps_if_costly``),
        the decision kept per (call, parameter) for the sum pass."""
        out = drop_zero_steps_if_costly(g, vocab, self.not_worth)
        self.compacted[(call, name)] = out is not g
        return out

    def add(self, name: str, use: PerExampleGrad, shape: torch.Size, call: int) -> None:
        self.pending.setdefault(name, []).append(use)
        self.arrived[name] += 1
        if self.arrived[name] >= self.expected[name]:
            combined = self._finish(name, shape)
            if self.arrived[name] == 1 and len(combined) == 1 and isinstance(combined[0], Materialized):
                use = combined[0]  # held as its norm was taken (the factors it was formed from are freed)
        self._keep(call, name, use, shape)

    def _keep(self, call: int, name: str, use: PerExampleGrad, shape: torch.Size) -> None:
        """Hold ``use`` while its call is among the last-arriving ones that fit in ``keep_bytes``: a call's
        use arriving evicts the oldest other held calls until it fits, or all of them, its own included,
        if the call does not fit alone, so the held calls are always the latest to arrive (a call's
        parameters arrive together)."""
        first = call not in self.calls
        self.calls.setdefault(call, set()).add(name)
        if self.keep_bytes <= 0 or (not first and call not in self.kept):
            return  # nothing is kept, or the call was evicted or did not fit
        size = held_bytes(use)
        if size is None:  # a form whose bytes are not known here: the call's estimate, once
            size = self.call_bytes[call] if first else 0
        while self.kept_bytes + size > self.keep_bytes and next(iter(self.kept), call) != call:
            oldest = next(iter(self.kept))
            del self.kept[oldest]
            self.kept_bytes -= self.kept_sizes.pop(oldest)
        if self.kept_bytes + size > self.keep_bytes:
            self.kept.clear()
            self.kept_sizes.clear()
            self.kept_bytes = 0
            return
        self.kept.setdefault(call, []).append((name, use, shape))
        self.kept_sizes[call] = self.kept_sizes.get(call, 0) + size
        self.kept_bytes += size

    def _finish(self, name: str, shape: torch.Size) -> list[PerExampleGrad]:
        """Adds the parameter's squared norms; returns its uses as they were taken (``combine_uses``)."""
        uses = combine_uses(self.pending.pop(name), self.vocab)
        self.squared += squared_norm_of_sum(uses, self.vocab).to(torch.float64)
        if name in self.rebuild:
            ones = torch.ones(self.batch, dtype=self.loss_dtype, device=self.device)
            self.rebuilt[name] = _sum_of(uses, ones, shape)
        return uses

    def close(self, shapes: dict[str, torch.Size]) -> None:
        """Finish the parameters whose expected uses did not all arrive (outputs the loss never used)."""
        for name in list(self.pending):
            self._finish(name, shapes[name])

    def sum_pass(self, coef: Tensor) -> SumPass:
        """The sum pass that follows: it skips the kept calls and starts from their sums."""
        asked = frozenset(self.calls.keys() - self.kept.keys())
        sums = SumPass(coef, frozenset(self.kept), asked, self.compacted)
        for uses in self.kept.values():
            for name, use, shape in uses:
                sums.add(name, use, shape, None)
        return sums

    def second_pass_inputs(self, anchors: list[Tensor], within: list[tuple[str, Tensor]]) -> list[Tensor]:
        """What the sum pass's ``autograd.grad`` asks for: the anchors of the calls that arrived and were
        not kept, and the ``within`` parameters (``Hold``) that one of those calls uses."""
        asked = [c for c in self.calls if c not in self.kept]
        names = set().union(*(self.calls[c] for c in asked))
        leaves = {id(anchors[c]): anchors[c] for c in asked}  # (calls outside the forward share one)
        return [*leaves.values(), *(p for name, p in within if name in names)]


@dataclass
class SumPass:
    """Pass 2: ``sum_i c_i G_i`` of every call, added up per parameter. ``skip``: calls whose sums the norm
    pass kept (added already); ``expect``: the calls that must arrive (``finish``); ``compacted``: the
    norm pass's decisions, per (call, parameter), whether to drop zero steps (``NormPass.pruned``)."""

    coef: Tensor
    skip: frozenset[int] = frozenset()
    expect: frozenset[int] = frozenset()
    compacted: dict[tuple[int, str], bool] = field(default_factory=dict)
    not_worth: set[tuple[int, ...]] = field(default_factory=set)
    sums: dict[str, Tensor] = field(default_factory=dict)
    arrived: set[int] = field(default_factory=set)

    def pruned(self, g: PerExampleGrad, vocab: int | None, call: int | None, name: str) -> PerExampleGrad:
        """``g`` with its zero steps dropped as the norm pass decided for this call's use: not checked
        again where it found nothing worth dropping, checked where it dropped some (the recomputed call
        has the same values), and decided as in the norm pass for a call it did not see."""
        decided = self.compacted.get((call, name)) if call is not None else None
        if decided is False:
            return g
        return drop_zero_steps_if_costly(g, vocab, None if decided else self.not_worth)

    def add(self, name: str, use: PerExampleGrad, shape: torch.Size, call: int | None) -> None:
        if call in self.skip:
            return
        if call is not None:
            self.arrived.add(call)
        part = _sum_of([use], self.coef, shape)
        held = self.sums.get(name)
        self.sums[name] = part if held is None else held.add_(part.to(held.dtype))

    def finish(self) -> dict[str, Tensor]:
        """The clipped sums, once every call the norm pass saw and did not keep has arrived."""
        missing = self.expect - self.arrived
        if missing:
            raise RuntimeError(
                f"{len(missing)} layer call(s) seen by the norm pass did not reach the sum pass; the "
                "clipped sum would miss them (a non-deterministic recomputation?)"
            )
        return self.sums


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
