"""GhostClipper: exact per-example gradient norms and clipped gradients for a plain HF model.

DP-SGD needs ``sum_i clip(g_i, C) = sum_i min(1, C/||g_i||) g_i`` with g_i the gradient of loss_i
w.r.t. ALL trainable parameters (Hush, Algorithm 2, lines 6 and 9; Abadi et al. 2016). Ghost
clipping (Li et al. 2022) gets ||g_i|| from each layer's input x and output gradient dL/dy without
forming g_i. Book-keeping (Bu et al. 2023, "Differentially private optimization on large model at
small cost") then gets the clipped sum from the same x and dy, with no second backward pass: for a
Linear weight, ``sum_i c_i sum_t dy_{i,t} x_{i,t}^T`` is one matmul with c_i folded into dy
(``factors.weighted_sum``). One backward pass (without the parameter gradients) plus the norms and
one weight-gradient-sized product per layer: about the cost of a plain step. A weight whose
per-example gradient is no larger than its factors (up to 5/4 of them for float32 factors, whatever
the matmul precision) is materialised once and kept, and both its norm and its clipped sum are read off
it; the others take the norm from Gram matrices (mixed ghost clipping, ``factors.norm_strategy``); never
with a vocabulary-sized dimension.

Why not Opacus's ``GradSampleHooksFastGradientClipping`` itself: it computes each layer's norm in
isolation inside a per-layer backward hook and raises on tied parameters ("Parameter tying is not
supported with Ghost Clipping"), while GPT-2, Gemma-2 and BERT-MLM all tie the output projection
to the word embedding. The exact norm of a tied weight needs all of its uses together (the cross
term, see ``factors.squared_norm_of_sum``); summing per-use norms can under-estimate it, which
would void the guarantee. Its embedding norm also ignores ``padding_idx`` (over-estimates). So this
engine keeps Opacus's design (forward hooks that record activations, a registry of per-layer rules
keyed by exact type, hooks only, no wrapping) but records each layer call, gets all output gradients
at once with one ``torch.autograd.grad`` (which skips the parameter gradients), combines the uses of
each parameter before taking the norm, and builds the clipped gradient itself from the factors.
Because the applied gradient is built from the very factors the norms were taken of, a parameter use
that no rule saw cannot reach ``p.grad`` unclipped: it is missing from the update instead.

Under gradient checkpointing the layer inputs are not kept, so the same per-layer rules run inside
the backward pass, segment by segment, in two passes (norms, then the clipped sum; ``recompute``).

What it refuses rather than under-clip: a parameter read outside its layer's call (the self-check
compares autograd's gradient with the one the norms describe, see ``GhostClipper._self_check``),
modules that couple the examples of a batch (BatchNorm, at construction), and rounding (a clip
margin, see ``CLIP_MARGINS``).
"""

from __future__ import annotations

import logging
import numbers
import weakref
from collections import Counter
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Partial
from torch.utils.hooks import RemovableHandle

from hush_hf.clipping import clipped_sums, gram_batches, sum_batches
from hush_hf.clipping.checkpointed_step import CheckpointedStep
from hush_hf.clipping.factor_memo import FactorMemo, sum_requests
from hush_hf.clipping.factors import (
    PerExampleGrad,
    combine_uses,
    pack_small,
    weighted_sum,
)
from hush_hf.clipping.graph_dtypes import graph_dtypes
from hush_hf.clipping.layer_calls import (
    _UNRECOGNISED_CHECKPOINT,
    CLIP_MARGINS,
    _Call,
    _canonical_names,
    _HookedLayer,
    _inner_captures,
    _own_forwards,
    _Pass,
    _plan_layers,
    _trainable,
    _type_name,
    _unfold,
    _vocabulary_size,
    _walk_graph,
)
from hush_hf.clipping.module_walk import ModelWalk, trainable_ids, walk_model
from hush_hf.clipping.recompute import NormPass, SumPass
from hush_hf.clipping.recording import CallRecorder
from hush_hf.clipping.registry import RecordedCall
from hush_hf.clipping.rule_batches import HeldCalls
from hush_hf.clipping.self_check import SelfCheck
from hush_hf.clipping.tensor_views import as_shape
from hush_hf.clipping.zero_steps import drop_zero_steps_all

logger = logging.getLogger(__name__)


# Models that currently carry a GhostClipper's hooks (a second one would double-record every call).
_ATTACHED: weakref.WeakSet[nn.Module] = weakref.WeakSet()

# The engine is split by concern: what is hooked and recorded (``layer_calls``), the forward hooks
# (``recording``), the first-call self-check (``self_check``, tolerances in ``precision``); this module
# runs the passes: norms, clip coefficients, clipped sums.


class GhostClipper(CallRecorder, SelfCheck, CheckpointedStep):
    """Per-example gradient norms and clipped gradient sums via hooks on ``model`` (in place).

    Usage, once per micro-batch::

        outputs = model(**batch)                      # exactly one forward, hooks record
        loss = example_cross_entropy(outputs.logits, batch["labels"], causal=True)
        norms = clipper.clipped_backward(loss)        # p.grad += sum_i min(1, C/||g_i||) g_i

    The model stays a plain module (class, forward and state_dict unchanged); ``remove()`` takes
    the hooks off. Parameters with ``requires_grad=False`` at construction are ignored; changing the
    set of trainable parameters later is an error (build a new clipper). Every layer holding a
    trainable parameter must see the batch in dimension 0: pass (batch, seq) ``position_ids``.
    loss_i must depend on example i only (true of transformers' LMs); modules that couple the
    examples of a batch or store batch statistics (BatchNorm, SyncBatchNorm, InstanceNorm with
    running stats) are refused at construction, with or without trainable parameters.
    Norms are exact up to floating-point rounding (products in at least float32, every sum of them
    accumulated in float64: ``factors.exact_sum``); examples are clipped to C * (1 - margin), with a
    rounding margin (``CLIP_MARGINS``: 2^-20 in float32, 2^-6 under bf16/fp16) so the gradient actually
    applied stays within C.

    Gradient checkpointing (transformers' flag on the model's layers, reentrant or not, or torch's
    ``checkpoint_wrapper``): decided at each forward; the calls are then tapped and the step takes two
    backward passes, norms then clipped sum, the first recomputing every checkpointed segment and the
    second those above the calls whose per-example gradients the first kept (about one segment's worth,
    ``recompute``), so the memory checkpointing saves stays saved; a router, which also reads its logits
    inside its own call, is taken from the logits' own gradient hook (``_tap``). Not under FSDP2.

    Self-check: the norms only count parameter uses that go through a hooked layer's call; a
    parameter read directly (``h @ self.wte.weight.T``, ``F.linear(x, mod.weight)``) would get gradient
    that no norm counted. So, parameter by parameter, until each has been seen with a nonzero
    gradient, a call compares the gradient autograd computes with the one rebuilt from the recorded
    factors, and raises ``UnsupportedLayerError`` naming the parameter on a mismatch; and any call
    refuses a parameter that the loss reaches although no hooked call of it ran (``_self_check``);
    nothing of that call reaches ``p.grad`` then. See ``_names_to_check`` for what that costs.
    A use the record misses could only be missing from the update (the applied gradient is built from
    the recorded factors), never applied unclipped. The norms are per-example statistics of private
    data: do not log them.

    FSDP2 (``fully_shard``): parameters are matched by name (FSDP2 swaps sharded and unsharded
    parameter objects), the norms need only this rank's activations and output gradients, and each
    sharded parameter gets the sum over ranks of the ranks' clipped sums, reduce-scattered to its
    shard (``_accumulate``). That is a collective: every rank must call ``clipped_backward`` equally
    often, each with at least one example (FSDP's own forward all-gathers demand the same). The
    self-check runs then once for all parameters, on every rank at the same call.
    """

    def __init__(self, model: nn.Module, max_norm: float) -> None:
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real):
            raise ValueError(f"max_norm must be a positive finite number, got {max_norm!r}")
        if not (0.0 < float(max_norm) < float("inf")):
            raise ValueError(f"max_norm must be a positive finite number, got {max_norm!r}")
        if model in _ATTACHED:
            raise ValueError("model already has an active GhostClipper; call its remove() first")
        self._model = model
        self._max_norm = float(max_norm)
        self._layers = _plan_layers(model)
        self._vocab = _vocabulary_size(self._layers)
        self._params = _trainable(model)
        self._trainable_ids = [id(p) for _, p in self._params]
        self._clipped_walk: ModelWalk | None = None
        self._names = _canonical_names(model, self._layers)
        self._unverified = {name for name, _ in self._params}  # not yet through the self-check
        # Parameters of layers tapped ``within`` (see ``_tap``): inputs of each two-pass backward.
        self._within = [
            (self._names[(id(layer.module), n)], layer.module.get_parameter(n))
            for layer in self._layers
            if layer.rule.output_index is not None
            for n in layer.param_names
        ]
        self._calls: list[_Call] = []
        self._forwards = 0
        self._tapping = False  # this forward runs under gradient checkpointing: calls are tapped
        self._in_forward = False  # between the root module's forward pre-hook and its forward hook
        self._expected: Counter[str] = Counter()  # tapped forward: calls per parameter
        self._forward_modules: list[nn.Module] = []  # the last forward's walk of the modules
        # Tapped forward: each call's leaf (``recompute.Tap``) and factor bytes; per checkpointed segment
        # and below the segments, the bytes of the calls made there (``recompute.keep_budget``).
        self._anchors, self._call_bytes, self._segment_bytes, self._bottom_bytes = [], [], [], 0
        self._in_segment: dict[int, int] = {}  # module id -> its checkpointed segment's index
        # The last tapped forward's checkpoint configuration (``recompute.checkpoint_configuration``), and
        # the one whose autograd graph was last walked for a reentrant checkpoint, with what that walk found.
        self._checkpointing: tuple = ()
        self._walked: tuple[tuple, bool] | None = None
        self._leaves: dict[torch.device, list[Tensor]] = {}  # the anchors, reused at every step
        self._graph_dtypes: set[torch.dtype] | None = None  # what the backward computes in (first step)
        self._pass: NormPass | SumPass | None = None  # the two-pass step's current backward
        self._handles: list[RemovableHandle] = [
            model.register_forward_pre_hook(self._on_forward),
            model.register_forward_hook(self._after_forward, always_call=True),
        ]
        self._own_forwards = _own_forwards(self._layers, self)  # layers the engine runs itself, by id
        self._handles.extend(self._own_forwards.values())
        for layer in self._layers:
            if layer.rule.injects is not None:
                hook = partial(self._inject, layer)
                self._handles.append(layer.module.register_forward_pre_hook(hook, with_kwargs=True))
            else:
                hook = partial(self._record, layer)
                self._handles.append(layer.module.register_forward_hook(hook, with_kwargs=True))
        self._removed = False
        _ATTACHED.add(model)
        counts = Counter(_type_name(layer.module) for layer in self._layers)
        logger.debug("GhostClipper hooked %d layers: %s", len(self._layers), dict(counts))

    @property
    def max_norm(self) -> float:
        """The clip norm C."""
        return self._max_norm

    @property
    def verified(self) -> bool:
        """Whether every trainable parameter has passed the self-check (see the class docstring)."""
        return not self._unverified

    @property
    def active(self) -> bool:
        """Whether a two-pass backward is running (``recompute.Tap`` reports to ``receive`` then)."""
        return self._pass is not None

    # ----------------------------------------------------------------------------- hooks
    def _check_usable(self) -> None:
        if self._removed:
            raise RuntimeError("this GhostClipper was removed; build a new one")
        # The trainable parameters in ``named_parameters`` order, by identity, read now from the modules
        # the forward walked (one walk per micro-batch, see ``CallRecorder._on_forward``; a parameter
        # replaced or toggled since then is seen, a module added since then ran in no forward and is seen
        # at the next). FSDP2 swaps parameter objects (sharded / unsharded) by design: compare names there.
        walk = self._forward_walk or walk_model(self._model)
        self._clipped_walk = walk
        if walk.fsdp:
            same = [n for n, _ in _trainable(self._model)] == [n for n, _ in self._params]
        else:
            same = trainable_ids(walk.modules) == self._trainable_ids
        if not same:
            raise RuntimeError(
                "the trainable parameters of the model changed since the GhostClipper was built "
                "(requires_grad toggled or parameters replaced); remove() it and build a new one"
            )

    def _fsdp_managed(self) -> bool:
        """Whether FSDP2 manages some part of the model, as the walk of the micro-batch being clipped read
        it (``_check_usable``), else as a walk now reads it."""
        walk = self._clipped_walk or walk_model(self._model)
        return walk.fsdp

    @staticmethod
    def _check_loss(per_example_loss: Any) -> Tensor:
        if not isinstance(per_example_loss, Tensor):
            got = type(per_example_loss).__name__
            raise ValueError(f"per_example_loss must be a torch.Tensor, got {got}")
        if per_example_loss.dim() != 1 or not per_example_loss.is_floating_point():
            raise ValueError(
                "per_example_loss must be a 1-D floating tensor (one loss per example), got shape "
                f"{tuple(per_example_loss.shape)} and dtype {per_example_loss.dtype}"
            )
        if per_example_loss.numel() and not per_example_loss.requires_grad:
            raise ValueError(
                "per_example_loss does not require grad: compute it from a forward with grad enabled"
            )
        bad = torch.nonzero(~torch.isfinite(per_example_loss.detach())).flatten()
        if bad.numel():
            raise ValueError(f"per_example_loss is not finite for example(s) {bad.tolist()}")
        return per_example_loss

    def _take_calls(self) -> tuple[list[_Call], int, Counter[str]]:
        """The calls, root forwards and (tapped) expected uses recorded since the last use, after checking
        that the model is still usable; the record is reset at once, so a failed call never leaks into the
        next one."""
        taken = self._calls, self._forwards, self._expected
        try:
            self._check_usable()
        finally:
            self.reset()
        return taken

    @staticmethod
    def _check_forwards(forwards: int) -> None:
        if forwards != 1:
            raise RuntimeError(
                f"exactly one forward pass of the model must precede each call; saw {forwards} "
                "(call reset() to discard a forward you will not back-propagate)"
            )

    @classmethod
    def _check_calls(cls, calls: list[_Call], forwards: int, batch: int) -> None:
        cls._check_forwards(forwards)
        if batch and not calls:
            raise RuntimeError("no layer with trainable parameters ran in the forward pass")
        for c in calls:
            # (An in-place change of the output is harmless: its gradient edge is the layer's own.)
            if c.x_source._version != c.x_version:
                raise RuntimeError(
                    f"the input of {c.layer.label} was modified in place after it ran; "
                    "its per-example gradient cannot be recovered"
                )

    def reset(self) -> None:
        """Discard what the hooks recorded since the last call (e.g. after an aborted step)."""
        self._calls = []
        self._forwards = 0
        self._expected = Counter()
        self._forward_walk: ModelWalk | None = None

    # ----------------------------------------------------------------------------- norms
    def _first_pass(
        self, loss: Tensor, calls: list[_Call], *, retain_graph: bool = True, check_finite: bool = True
    ) -> _Pass:
        """Norms and factors of the recorded (untapped) calls: one ``autograd.grad`` to all output edges.
        ``check_finite=False``: the caller runs ``_finite`` on the norms itself, before anything built
        from them reaches a gradient."""
        b = loss.shape[0]
        dtype = self._narrowest_dtype(calls, loss, self._computed_dtypes(loss))
        squared = torch.zeros(b, dtype=torch.float64, device=loss.device)
        # d(sum_i loss_i)/d(output) of each call; row i is example i's own output gradient.
        # All at once, so the graph is traversed once; the parameter gradients are not computed.
        # Taken at the outputs' gradient edges, so the outputs themselves (the logits among them)
        # are freed as in plain training. Memory: every hooked layer's output gradient stays alive
        # (as a factor) until the clipped sum is built, the logits' gradient included (for a masked
        # LM only its nonzero steps, see ``drop_zero_steps``).
        # (and at the edges inside the calls the engine ran itself: ``_inner_captures``)
        captures = _inner_captures(calls)
        edges = [c.edge for c in calls] + [capture.edge for capture in captures]
        out_grads = list(torch.autograd.grad(loss.sum(), edges, retain_graph=retain_graph, allow_unused=True))
        for capture, inner in zip(captures, out_grads[len(calls) :], strict=True):
            capture.dh = inner
        del out_grads[len(calls) :], captures
        recorded: list[tuple[_HookedLayer, Tensor | RecordedCall, Tensor, tuple[Tensor, ...]] | None]
        recorded = [(c.layer, c.x, c.x_source, c.params) for c in calls]
        del calls
        if self._calls or self._forwards:
            self.reset()
            raise RuntimeError(_UNRECOGNISED_CHECKPOINT)
        uses: dict[str, list[PerExampleGrad]] = {}
        held = HeldCalls()
        used: dict[str, list[Tensor]] = {}

        def add(done: list[tuple[_HookedLayer, Any]]) -> None:  # evaluated calls' per-example gradients
            for layer, grads in done:
                for name in layer.param_names:
                    uses.setdefault(self._names[(id(layer.module), name)], []).append(grads[name])

        for k in range(len(recorded)):
            layer, x, source, params = recorded[k]  # type: ignore[misc]
            recorded[k] = None  # the factors hold what is still needed of the input
            module = layer.module
            for name, tensor in zip(layer.param_names, params, strict=True):
                seen = used.setdefault(self._names[(id(module), name)], [])
                if all(t is not tensor for t in seen):
                    seen.append(tensor)
            g, out_grads[k] = out_grads[k], None
            if g is None:
                continue  # output not used by the loss: zero gradient (its batch does not matter)
            x, g = _unfold(layer, x, source, g, b)
            add(held.run(layer, x, g))  # this call's, or held norm layers' (rule_batches)
        add(held.flush())
        x = g = source = held = None  # type: ignore[assignment]  # the last call's tensors live on in the factors
        # Zero steps dropped (exact; a masked-LM head keeps ~15% of its logits gradient), all uses at once:
        # a device-to-host read or two for the whole step, not one per use (none when every use is
        # materialised anyway).
        names = [name for name, found in uses.items() for _ in found]
        dropped = iter(drop_zero_steps_all([u for found in uses.values() for u in found], self._vocab))
        uses = {name: [] for name in uses}
        for name in names:
            uses[name].append(next(dropped))
        recorded_names = frozenset(uses)
        terms: list[Tensor] = []
        for name in uses:
            # Materialised where that holds about the factors' bytes (freed here), else ghost form.
            uses[name] = combine_uses(uses[name], self._vocab)
        packed = pack_small(uses)  # biases and norm scales: one norm, one clipped-sum product for all
        if packed is not None:
            terms.append(packed.squared_norms())
        # Small Gram matrices in batches (a few launches for all), shared factors' Gram matrices once.
        terms += gram_batches.squared_norms(list(uses.values()), self._vocab)
        if terms:
            # Each parameter's exact squared norm is >= 0: a tiny negative is rounding (clamped per term).
            # (stacked first, widened once: one cast, not one per parameter)
            squared = squared + torch.stack(terms).to(torch.float64).clamp_min_(0.0).sum(dim=0)
        norms = squared.sqrt()
        if check_finite:
            self._finite(norms)
        return _Pass(norms, uses, dtype, used, recorded_names, packed, loss.device.type)

    @staticmethod
    def _finite(norms: Tensor) -> Tensor:
        bad = torch.nonzero(~torch.isfinite(norms)).flatten()
        if bad.numel():
            raise FloatingPointError(f"per-example gradient norm is not finite for example(s) {bad.tolist()}")
        return norms

    def _computed_dtypes(self, loss: Tensor) -> set[torch.dtype]:
        """The floating dtypes the graph behind ``loss`` computes in (``graph_dtypes``), walked at
        the first step and kept: which dtypes a model's ops run in does not change between steps."""
        if self._graph_dtypes is None:
            self._graph_dtypes = graph_dtypes(loss)
        return self._graph_dtypes

    def _narrowest_dtype(
        self, calls: list[_Call], loss: Tensor, extra: set[torch.dtype] | None = None
    ) -> torch.dtype:
        """The least precise floating dtype among the recorded activations and outputs, the trainable
        parameters and the loss (bf16 under bf16 autocast): it sets the clip margin."""
        tensors = [t for c in calls for t in (c.x, c.x_source) if isinstance(t, Tensor)]
        tensors += [p for _, p in self._params] + [loss]
        dtypes = {d for d in {t.dtype for t in tensors} if d.is_floating_point} | (extra or set())
        dtypes |= {c.out_dtype for c in calls if c.out_dtype.is_floating_point}
        unknown = dtypes - set(CLIP_MARGINS)
        if unknown:
            raise ValueError(f"floating dtype(s) {sorted(map(str, unknown))} are not supported for clipping")
        return max(dtypes, key=lambda d: torch.finfo(d).eps)

    def per_example_norms(self, per_example_loss: Tensor) -> Tensor:
        """||g_i||_2 over all trainable parameters, shape (b,), float64, detached.

        Leaves ``p.grad`` untouched; keeps the autograd graph (a later backward may reuse it). While some
        trainable parameter is not yet verified, also runs the self-check (one extra backward of
        sum_i loss_i towards those parameters).
        """
        if self._tapping:
            return self._two_pass(per_example_loss, apply=False)
        calls, loss, check = self._start(per_example_loss)
        if loss.shape[0] == 0:
            return torch.zeros(0, dtype=torch.float64, device=loss.device)
        result = self._first_pass(loss, calls)
        if check:
            ones = torch.ones_like(result.norms, dtype=loss.dtype)
            rebuilt = self._rebuild(result, ones)
            got = self._autograd_grads(loss.sum(), result, check, retain_graph=True)
            self._self_check(result, ones, rebuilt, got, check)
        return result.norms

    def _start(self, per_example_loss: Tensor) -> tuple[list[_Call], Tensor, set[str]]:
        """The recorded calls, the checked loss, and the parameters this call's self-check covers."""
        calls, forwards, _ = self._take_calls()
        loss = self._check_loss(per_example_loss)
        self._check_calls(calls, forwards, loss.shape[0])
        check = self._names_to_check(loss) if loss.shape[0] else set()
        return calls, loss, check

    def _names_to_check(self, loss: Tensor) -> set[str]:
        """The not-yet-verified parameters this call's self-check compares: those the loss reaches.

        A walk of the autograd graph (no computation; a few ms for a 30-layer model) finds the parameters
        the backward pass will reach. A parameter it does not reach has no gradient in this call and
        nothing to compare; it stays unverified and costs this walk on later calls, never the check's
        backward. Under FSDP2 every rank must run the check's collectives at the same call, so there the
        check covers all parameters at once, once (the trainer runs it on the same row on every rank).
        """
        if not self._unverified:
            return set()
        if self._fsdp_managed():
            return {name for name, _ in self._params}
        reached, reentrant = _walk_graph(loss)
        if reentrant:  # untapped: the layers it re-runs recorded nothing
            raise RuntimeError(_UNRECOGNISED_CHECKPOINT)
        return {name for name, p in self._params if name in self._unverified and id(p) in reached}

    def clip_coefficients(self, norms: Tensor, dtype: torch.dtype, *, margin: float = 0.0) -> Tensor:
        """c_i = min(1, C'/||g_i||) with C' = C * (1 - margin), rounded towards 0 in ``dtype`` so that
        ||c_i g_i|| never exceeds C' because of the cast (rounding up would add to the sensitivity the
        noise is calibrated to). ``clipped_backward`` passes the step's ``CLIP_MARGINS`` entry."""
        target = self._max_norm * (1.0 - margin)
        norms = norms.to(torch.float64)
        exact = torch.where(norms > target, target / norms, torch.ones_like(norms))
        cast = exact.to(dtype)
        rounded_up = cast.to(torch.float64) > exact
        return torch.where(rounded_up, torch.nextafter(cast, torch.zeros_like(cast)), cast)

    def clipped_backward(self, per_example_loss: Tensor) -> Tensor:
        """Adds ``sum_i min(1, C/||g_i||) g_i`` to ``p.grad`` (accumulating); returns the norms (float64).
        A bf16/fp16 parameter's sum accumulates in float32 beside it instead (``clipped_sums``): the
        noise is added to that, and ``clipped_sums.round_into_grads_`` (or ``privatize_gradients_``)
        writes ``p.grad``.

        One backward pass over the graph of one forward (the output gradients of the hooked layers, not
        the parameter gradients; the graph is freed like ``backward()`` frees it), the norms, then the
        clipped sum built from the recorded factors with c_i folded in (book-keeping; one
        weight-gradient-sized product per use, ``factors.weighted_sum``). Examples are clipped to
        C * (1 - margin) with the rounding margin of ``CLIP_MARGINS`` (2^-20 in float32, 2^-6 under
        bf16/fp16), so the applied c_i g_i stays within C. While some parameter is not yet verified the
        self-check runs too (one more backward, towards those parameters); nothing of a refused call
        reaches ``p.grad``. Under gradient checkpointing: two backward passes (``recompute``).
        """
        if self._tapping:
            return self._two_pass(per_example_loss, apply=True)
        calls, loss, check = self._start(per_example_loss)
        if loss.shape[0] == 0:
            return torch.zeros(0, dtype=torch.float64, device=loss.device)
        # A first micro-batch's norms are checked once all its sums are queued: the check reads them back,
        # which on a GPU would hold the host there until the backward pass had run, and leave the device
        # idle while the host then queued the sums. Nothing reaches p.grad before it either way. Where
        # sums are already held (accumulating) or sharded (a collective per parameter), it checks first:
        # holding every sum until the end would take one more gradient's memory.
        defer = not check and not self._holds_sums()
        result = self._first_pass(loss, calls, retain_graph=bool(check), check_finite=not defer)
        norms = result.norms
        coef = result.applied(self.clip_coefficients(norms, loss.dtype, margin=result.margin))
        if not check:
            # Summed already: the packed biases and norm scales, and weights of one shape (groupwise).
            ready = result.packed.weighted_sums(coef) if result.packed is not None else {}
            ready.update(sum_batches.weighted_sums(result.uses, coef))  # their uses leave result.uses
            memo = FactorMemo(sum_requests([u for found in result.uses.values() for u in found]))
            held: list[tuple[nn.Parameter, Tensor | None]] = []
            for name, p in self._params:
                uses = result.uses.pop(name, [])
                clipped = self._clipped_sum(p, uses, coef, memo) if uses else ready.pop(name, None)
                if clipped is not None and not uses:
                    clipped = as_shape(clipped, p.shape)
                if defer:
                    held.append((p, clipped))
                else:
                    self._accumulate(p, clipped)
            if defer:
                self._finite(norms)
                for p, clipped in held:
                    self._accumulate(p, clipped)
            return norms
        rebuilt = self._rebuild(result, coef)
        got = self._autograd_grads((loss * coef).sum(), result, check, retain_graph=False)
        self._self_check(result, coef, rebuilt, got, check)
        del got
        for name, p in self._params:
            self._accumulate(p, rebuilt.pop(name, None))
        return norms

    def _holds_sums(self) -> bool:
        """Whether some parameter already holds a clipped sum (a later micro-batch of a step), or is
        sharded (a DTensor, as under FSDP2: each parameter's sum is reduce-scattered as it is made)."""
        if self._fsdp_managed():
            return True
        return any(isinstance(p, DTensor) or clipped_sums.clipped_sum(p) is not None for _, p in self._params)

    @staticmethod
    def _clipped_sum(
        p: nn.Parameter, uses: list[PerExampleGrad], coef: Tensor, memo: FactorMemo | None = None
    ) -> Tensor:
        """``sum_u sum_i coef_i G_{u,i}`` for one parameter, in at least float32, shaped like ``p``."""
        total: Tensor | None = None
        for use in uses:
            part = weighted_sum(use, coef, memo).reshape(p.shape)
            total = part if total is None else total.add_(part.to(total.dtype))
        assert total is not None
        return total

    @staticmethod
    def _accumulate(p: nn.Parameter, grad: Tensor | None) -> None:
        """``p.grad += grad``, or for a bf16/fp16 parameter its float32 clipped sum (``clipped_sums``:
        rounded into ``p.grad`` only after the noise). A sharded (FSDP2, DTensor) parameter gets the sum
        over ranks of each rank's full-size ``grad``, reduce-scattered to its own shard: a collective, so
        every rank makes the same calls (a parameter with no recorded use contributes zeros). The
        reduce-scatter runs in float32 at least (the dtype ``grad`` is built in), whatever FSDP's
        ``reduce_dtype``."""
        if isinstance(p, DTensor):
            zeros = grad is None
            dtype = torch.promote_types(p.dtype, torch.float32)
            local = torch.zeros(p.shape, dtype=dtype, device=p.device) if zeros else grad.to(dtype)
            mesh = p.device_mesh
            grad = DTensor.from_local(local, mesh, [Partial()] * mesh.ndim, run_check=False).redistribute(
                mesh, p.placements
            )
        elif grad is None:
            return
        # A bf16/fp16 parameter's sum stays in float32 until the noise; ``grad`` was built here for p alone.
        clipped_sums.accumulate_(p, grad, owned=True)

    # ----------------------------------------------------------------------------- self-check
    def remove(self) -> None:
        """Take every hook off; the model is exactly as before. Idempotent."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.reset()
        if not self._removed:
            _ATTACHED.discard(self._model)
        self._removed = True

    def __enter__(self) -> GhostClipper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
