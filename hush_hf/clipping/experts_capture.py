"""Mixture-of-experts calls that the engine runs itself while it records, so that the experts rule reads
what it needs from the forward and the backward instead of replaying the call.

The experts rule (``rules_moe.topk_experts_grads``) needs, for every (token, expert) pair p of a call, the
up projection's input x_p, the gate's output a_p, the gradient dh_p at the up projection's output and the
gradient dy_p = w_p g_t at the down projection's output. Replayed, x_p W_up[e]^T and the adjoint
dy_p W_down[e] are computed again: a third of the experts' forward and backward work, twice per step
under gradient checkpointing. transformers' ``grouped_mm`` experts (its default) compute all of them
already, but in an order of pairs that its unstable sort picks, so which row is which pair is not known
from outside.

Here the engine runs the call itself, with transformers' own products (``_grouped_linear``, the
``grouped_mm`` kernel or its per-expert fallback) on the same values: the pairs sorted by expert with a
stable sort (pair id t * k + j ascending within an expert), up projection (+ bias), the family's
``_apply_gate`` (or activation), down projection (+ bias), routing weights, the sum over the k pairs of
each token, exactly as ``grouped_mm_experts_forward`` does (each row's products do not depend on where
its expert's other rows sit). It keeps (detached, aliases of what autograd saves anyway) the rows x and
the gate output a, and:

- untapped (no checkpointing): the gradient edge of the up projection's output, which the engine adds to
  the one ``autograd.grad`` that gives every hooked layer its output gradient (``GhostClipper._first_pass``),
  so dh is autograd's own gradient of sum_i loss_i there; dy comes from the output gradient as before.
- tapped (gradient checkpointing): two identity nodes (``_Report``), after the down projection and after
  the up projection, that save a, resp. x, with ``save_for_backward`` (so checkpointing drops and
  recomputes them with the segment) and receive dy, resp. dh, in each of the two backward passes; the
  second to fire (the up projection's: it lies before the down projection) hands the call's per-example
  gradients to the pass. The engine's own tap of the call's output is then not set.

Taken over only for transformers' ``grouped_mm`` implementation (``config._experts_implementation``),
without expert parallelism or a post-expert norm (refused anyway); any other call runs the class's own
forward and the rule replays it. In float64, for which torch's ``grouped_mm`` has no kernel, the products
run through transformers' per-expert fallback (``grouped_mm_fallback``), where transformers' own forward
would fail.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from hush_hf.clipping.rules_generic import replaying

_GROUPED_MM_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})


@dataclass(eq=False)
class ExpertsCapture:
    """What one experts call computed, per row: rows are the call's (token, expert) pairs sorted by expert,
    then by pair id ``t * top_k + j`` (so by token, and by example, within an expert).

    ``x``/``a``: the up projection's input and the gate's output as the products used them (cast to the
    weights' dtype), detached; ``edge``: the up projection's output (untapped; None when it needs no
    gradient); ``dh``: autograd's gradient there, set by the engine's backward pass."""

    pair: Tensor  # (S,) long
    expert: Tensor  # (S,) long, ascending
    top_k: int
    x: Tensor
    a: Tensor
    edge: GradientEdge | None
    dh: Tensor | None = None
    tapped: bool = False  # tapped: the call's nodes report its per-example gradients in each pass


TAPPED = object()  # what a tapped call leaves for the engine's hook: its per-example gradients are reported


class _Report(torch.autograd.Function):
    """Identity on ``value`` that saves ``saved`` for the backward pass (dropped and recomputed under
    checkpointing) and hands (gradient, saved tensors) to ``receive`` there. ``anchor``: the engine's taps'
    leaf for this call (``recompute.Tap``), so that a pass's ``autograd.grad`` towards it runs this node."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, anchor: Tensor, receive: Callable, *saved: Tensor) -> Tensor:
        ctx.receive, ctx.count = receive, len(saved)
        ctx.anchor = (anchor.dtype, anchor.device)
        ctx.save_for_backward(*saved)
        return value.detach()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        ctx.receive(grad, ctx.saved_tensors)
        dtype, device = ctx.anchor
        return (grad, torch.zeros((), dtype=dtype, device=device), None) + (None,) * ctx.count


def _products(x: Tensor, weight: Tensor, offsets: Tensor, bias: Tensor | None, transposed: bool) -> Tensor:
    """transformers' ``_grouped_linear``; in a dtype torch's ``grouped_mm`` lacks, its per-expert fallback."""
    from transformers.integrations import moe

    if weight.dtype in _GROUPED_MM_DTYPES:
        return moe._grouped_linear(x, weight, offsets, bias=bias, is_transposed=transposed)
    w = weight if transposed else weight.transpose(-2, -1)
    out = torch.ops.transformers.grouped_mm_fallback(x.to(weight.dtype), w, offs=offsets)
    return out.add_(bias) if bias is not None else out


@functools.cache
def _dispatch_code() -> Any:
    """The code of the ``forward`` that transformers' ``use_experts_implementation`` gives a class."""
    from transformers.integrations import moe

    class _Probe(nn.Module):
        def forward(self, *args: Any) -> None:
            return None

    return moe.use_experts_implementation(_Probe).forward.__code__


def takes_over(experts: nn.Module) -> bool:
    """Whether this call of ``experts`` runs here: a class whose forward is transformers' dispatch over the
    default experts functions (``use_experts_implementation``), set to its default ``grouped_mm``, which is
    transformers' ``grouped_mm_experts_forward``; no expert parallelism, no post-expert norm."""
    from transformers.integrations import moe

    config = getattr(experts, "config", None)
    if getattr(config, "_experts_implementation", None) != "grouped_mm":
        return False
    forward = type(experts).forward
    if getattr(forward, "__code__", None) is not _dispatch_code():
        return False
    if inspect.getclosurevars(forward).nonlocals.get("experts_interface") is not moe.ALL_EXPERTS_FUNCTIONS:
        return False
    return (
        moe.ALL_EXPERTS_FUNCTIONS.get("grouped_mm") is moe.grouped_mm_experts_forward
        and not getattr(experts, "_is_expert_parallel", False)
        and not getattr(experts, "has_post_expert_norm", False)
    )


def experts_forward(
    experts: nn.Module,
    hidden: Tensor,
    index: Tensor,
    weights: Tensor,
    report: Callable[[ExpertsCapture], None] | None = None,
    anchor: Tensor | None = None,
) -> tuple[Tensor, ExpertsCapture]:
    """``grouped_mm_experts_forward`` with the pairs in a known order (see the module docstring).

    Untapped (``report`` None): the returned capture holds x, a and the up projection's edge. Tapped:
    the capture holds only the pairs' order while the step runs (x and a are saved by the ``_Report``
    nodes, which checkpointing drops and recomputes); in each backward pass ``report(capture)`` gets it
    filled with x, a, dh and dy (``dy`` set as an attribute)."""
    tokens, top_k = index.shape
    n_experts = experts.num_experts
    flat = index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    expert = flat[order].long()
    counts = torch.bincount(expert, minlength=n_experts)
    if counts.shape[0] != n_experts:
        raise ValueError(f"{type(experts).__name__} got expert indices beyond its {n_experts} experts")
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    up_name = "gate_up_proj" if experts.has_gate else "up_proj"
    up, down = getattr(experts, up_name), experts.down_proj
    transposed = bool(experts.is_transposed)
    up_bias = getattr(experts, f"{up_name}_bias")[expert] if experts.has_bias else None
    down_bias = experts.down_proj_bias[expert] if experts.has_bias else None
    tapped = report is not None and anchor is not None
    empty = order.new_empty(0)

    rows = hidden[order // top_k]
    h = _products(rows, up, offsets, up_bias, transposed)
    capture = ExpertsCapture(order, expert, top_k, empty, empty, None)
    held: dict[str, Tensor] = {}
    # Tapped, the call reports only when a gradient reaches its up projection (then one reaches the down
    # projection's output too); else the engine taps it as any call and the rule replays it.
    reports = tapped and h.requires_grad
    if reports:

        def receive_dh(dh: Tensor, saved: tuple[Tensor, ...]) -> None:
            if "dy" in held:
                filled = ExpertsCapture(order, expert, top_k, saved[0], held.pop("a"), None, dh)
                report(filled, held.pop("dy"))  # type: ignore[misc]

        h = _Report.apply(h, anchor, receive_dh, rows.detach().to(up.dtype))
    elif not tapped:
        capture.x = rows.detach().to(up.dtype)
        capture.edge = get_gradient_edge(h) if h.requires_grad else None
    a = experts._apply_gate(h) if experts.has_gate else experts.act_fn(h)
    used = a.to(down.dtype)
    y = _products(used, down, offsets, down_bias, transposed)
    if reports:

        def receive_dy(dy: Tensor, saved: tuple[Tensor, ...]) -> None:
            held["dy"], held["a"] = dy, saved[0]

        y = _Report.apply(y, anchor, receive_dy, used.detach())
        capture.tapped = True
    elif not tapped:
        capture.a = used.detach()
    weighted = y * weights.reshape(-1)[order].unsqueeze(-1)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.shape[0], device=order.device)
    out = weighted[inverse].view(tokens, top_k, -1).sum(dim=1)
    return out.to(hidden.dtype), capture


def _routed_bytes(module: nn.Module, layer: Any, pairs: int, dtype: torch.dtype) -> int:
    """A tapped experts call's factors, estimated: each (E, rows, cols) weight's rows and columns for every
    routed pair, each (E, n) bias's n."""
    widths = (sum(module.get_parameter(n).shape[1:]) for n in layer.param_names)
    return pairs * sum(widths) * dtype.itemsize


class OwnForward:
    """The engine's forward of one experts module (an instance attribute shadowing the class's ``forward``
    while a clipper is attached; ``remove()`` takes it off). ``recorder``: the clipper (its ``_tapping``,
    ``_tap_anchor`` and ``_report_captured``); ``take()``: what the last call left for the engine's hook."""

    def __init__(self, module: nn.Module, recorder: Any, layer: Any) -> None:
        self.module, self.recorder, self.layer = module, recorder, layer
        self.left: ExpertsCapture | object | None = None
        module.__dict__["forward"] = self

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor:
        module, recorder = self.module, self.recorder
        self.left = None
        if replaying() or not takes_over(module):
            return type(module).forward(module, *args, **kwargs)
        from hush_hf.clipping.rules_moe import call_arguments

        hidden, index, weights = call_arguments(module, args, kwargs)
        if not torch.is_grad_enabled():  # (reentrant checkpointing's first forward: the same values)
            return experts_forward(module, hidden, index, weights)[0]
        if not recorder._tapping:
            out, capture = experts_forward(module, hidden, index, weights, None, None)
            self.left = capture
            return out
        layer, dtype = self.layer, hidden.dtype
        nbytes = _routed_bytes(module, layer, index.numel(), dtype)
        anchor, call = recorder._tap_anchor(hidden.device, nbytes, module)

        def report(capture: ExpertsCapture, dy: Tensor) -> None:
            recorder._report_captured(layer, capture, dy, dtype, call)

        out, capture = experts_forward(module, hidden, index, weights, report, anchor)
        # (no gradient reaches the up projection: the engine taps the call and the rule replays it)
        self.left = TAPPED if capture.tapped else None
        return out

    def take(self) -> ExpertsCapture | object | None:
        left, self.left = self.left, None
        return left

    def remove(self) -> None:
        if self.module.__dict__.get("forward") is self:
            del self.module.__dict__["forward"]

    def __deepcopy__(self, memo: dict) -> Any:
        """A copy of the model (a reference model made with ``copy.deepcopy``) is not attached: its experts
        run their class's forward (this clipper's records are not the copy's)."""
        copied = memo.get(id(self.module))
        if copied is None:
            raise TypeError("the engine's experts forward is copied only with its module")
        return type(copied).forward.__get__(copied)
