"""GhostClipper: exact per-example gradient norms and clipped gradients for a plain HF model.

DP-SGD needs ``sum_i clip(g_i, C) = sum_i min(1, C/||g_i||) g_i`` with g_i the gradient of loss_i
w.r.t. ALL trainable parameters (Hush, Algorithm 2, lines 6 and 9; Abadi et al. 2016). Ghost
clipping (Li et al. 2022) gets ||g_i|| from each layer's input x and output gradient dL/dy without
forming g_i. Book-keeping (Bu et al. 2023, "Differentially private optimization on large model at
small cost") then gets the clipped sum from the same x and dy, with no second backward pass: for a
Linear weight, ``sum_i c_i sum_t dy_{i,t} x_{i,t}^T`` is one matmul with c_i folded into dy
(``factors.weighted_sum``). One backward pass (without the parameter gradients) plus the norms and
one weight-gradient-sized product per layer: about the cost of a plain step. A weight whose
per-example gradient is no larger than its factors is materialised once and kept, and both its norm
and its clipped sum are read off it; the others take the norm from Gram matrices (mixed ghost
clipping, ``factors.norm_strategy``); never with a vocabulary-sized dimension.

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
import math
import numbers
import weakref
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.distributed.tensor import DTensor, Partial
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.hooks import RemovableHandle

from hush_hf.clipping import clipped_sums, precision
from hush_hf.clipping.factors import (
    Packed,
    PerExampleGrad,
    combine_uses,
    drop_zero_steps,
    drop_zero_steps_all,
    pack_small,
    squared_norm_of_sum,
    weighted_sum,
)
from hush_hf.clipping.graph_dtypes import graph_dtypes
from hush_hf.clipping.recompute import Hold, NormPass, SumPass, Tap, recomputes, run_pass
from hush_hf.clipping.registry import (
    LayerRule,
    RecordedCall,
    UnsupportedLayerError,
    aliases_for,
    folds_batch,
    refusal_for,
    rule_for,
)
from hush_hf.clipping.rules_generic import (
    GENERIC_CONTAINER_RULE,
    GENERIC_RULE,
    holds_parameter_container,
    own_trainable,
    replay,
    replaying,
)

logger = logging.getLogger(__name__)

# Models that currently carry a GhostClipper's hooks (a second one would double-record every call).
_ATTACHED: weakref.WeakSet[nn.Module] = weakref.WeakSet()

CLIP_MARGINS: dict[torch.dtype, float] = {
    torch.bfloat16: 2.0**-6,
    torch.float16: 2.0**-6,
    torch.float32: 2.0**-20,
    torch.float64: 2.0**-49,
}
"""Relative clip-norm margin by the narrowest floating dtype of the step: examples are clipped to
C' = C * (1 - margin), so that the gradient actually applied, c_i g_i, stays within C.

"Narrowest" counts every node of the backward's autograd graph (``graph_dtypes.graph_dtypes``): a float64
model that runs part of its attention in float32 (MPT, GPT-J) gets float32's margin; with float64's its
applied gradient exceeded C by 1.9e-10 C (MPT) and 9.2e-13 C (GPT-J).

Why a margin: the norm of g_i and the applied c_i g_i are computed along different routes (Gram
matrices vs one matmul, in at least float32, then cast to the parameter dtype) and round differently.
The margins were measured when the applied gradient still came from a second backward pass, which
rounds every intermediate gradient in the activation dtype (up to 2^-9 relative in bf16): tiny GPT-2,
BERT, Gemma-2, 2 to 12 layers, bf16 autocast, one example per batch, no margin: ||c_i g_i|| exceeded
C by up to 0.37% (about 2^-8); 2^-6 = 1.6% leaves 4x headroom. In float32 the excess was at most 6e-8
(2^-24); 2^-20 leaves 16x. Book-keeping builds c_i g_i from the same (bf16) factors the norm was taken
of, in float32, so its rounding gap is smaller; the margins are kept, measured, not proven. The cost
of the margin is clipping at most ``margin`` more than asked (a smaller signal, never a weaker guarantee).
"""

_CHECK_RTOL = precision.CHECK_RTOL
_CHECK_RTOL_REDUCED = precision.CHECK_RTOL_REDUCED
# (The self-check's tolerances and how they follow the float32 matmul precision: ``precision``.)


@dataclass(frozen=True)
class _HookedLayer:
    path: str
    module: nn.Module
    rule: LayerRule
    param_names: tuple[str, ...]  # dotted, relative to ``module``
    folded: bool = False  # may see the batch folded into rows, batch-major (see registry.register_batch_fold)

    @property
    def label(self) -> str:
        return f"layer '{self.path or '<root>'}' ({type(self.module).__name__})"


@dataclass(frozen=True)
class _Call:
    """What one call of a hooked layer saw in the forward pass."""

    layer: _HookedLayer
    x: Tensor | RecordedCall  # input as the layer's op used it (detached), or the whole call
    x_source: Tensor  # the input as passed (detached; shares the version counter)
    x_version: int
    edge: GradientEdge  # where autograd delivers d(loss)/d(output): the output itself is not kept
    out_shape: torch.Size
    out_dtype: torch.dtype
    params: tuple[Tensor, ...]  # the layer's parameters as the call used them (FSDP2: unsharded)


_SAVED = object()  # a tensor argument's place in a tapped call's template (None is an argument value)


@dataclass(frozen=True)
class _TapTag:
    """What a tap (``recompute.Tap``) keeps besides the saved tensors: how to rebuild the call's input."""

    layer: _HookedLayer
    template: tuple | None  # records_call: the flattened call, ``_SAVED`` where a saved tensor goes
    spec: Any  # its tree spec
    autocast: tuple[str, object] | None
    cast: torch.dtype | None  # single input: the autocast dtype the layer's op cast it to


@dataclass(frozen=True)
class _Pass:
    """What the backward pass found: norms and the factors the clipped sum is built from."""

    norms: Tensor  # (b,) float64
    uses: dict[str, list[PerExampleGrad]]  # parameter name -> its recorded uses
    dtype: torch.dtype  # narrowest floating dtype of the step (activations, outputs, parameters, loss)
    used: dict[str, list[Tensor]]  # parameter name -> the tensor(s) the forward used for it
    recorded: frozenset[str] = frozenset()  # parameters with a use that got a gradient
    packed: Packed | None = None  # small whole-stored per-example gradients, out of ``uses`` (``pack_small``)
    device_type: str = "cpu"  # where the step's products run (their float32 precision: ``precision``)

    @property
    def margin(self) -> float:
        """``CLIP_MARGINS`` of the step's dtype; a float32 step whose matrix products may run in TF32/bf16
        takes the bf16 margin (``precision``: both routes round their products' inputs like bf16's)."""
        if self.dtype == torch.float32 and precision.low_precision_step(self.dtype, self.device_type):
            return CLIP_MARGINS[torch.bfloat16]
        return CLIP_MARGINS[self.dtype]


def _type_name(module: nn.Module) -> str:
    return type(module).__name__


def _batch_coupling(module: nn.Module) -> str | None:
    """Why ``module`` makes one example's output (or the model's state) depend on the others, or None.

    Per-example clipping bounds each example's influence only if loss_i depends on example i alone
    and the forward leaves nothing else behind. Batch norm normalises with statistics of the whole
    batch in train mode (and SyncBatchNorm of every process's batch) and, like instance norm with
    ``track_running_stats``, writes batch statistics into buffers that are saved with the model
    without noise. Neither needs a trainable parameter, so the rule check alone does not see them.
    GroupNorm, LayerNorm and InstanceNorm without running statistics are per example and fine.
    """
    if isinstance(module, _BatchNorm):
        return (
            "batch normalisation mixes the examples of a batch (batch statistics in train mode) and "
            "stores batch statistics in its running-stat buffers"
        )
    if isinstance(module, _InstanceNorm) and module.track_running_stats:
        return "track_running_stats=True stores statistics of the batch in buffers (saved without noise)"
    return None


def _inside(path: str, root: str) -> bool:
    return root == "" or path.startswith(root + ".")


def _layer_params(module: nn.Module, rule: LayerRule | None) -> list[tuple[str, nn.Parameter]]:
    """The trainable parameters a layer's rule covers: its own, those the rule ``owns`` (submodules'
    included), or those its injection declares (``registry.Injector``)."""
    if rule is not None and rule.injects is not None:
        names = rule.injects.params(module)
        return [(n, module.get_parameter(n)) for n in names if module.get_parameter(n).requires_grad]
    if rule is not None and rule.owns is not None:
        return rule.owns(module)
    return own_trainable(module)


def _plan_layers(model: nn.Module) -> list[_HookedLayer]:
    """Every module that directly holds a trainable parameter must have a rule (or alias it); no module
    may couple the examples of a batch (see ``_batch_coupling``). A layer whose rule covers parameters of
    its submodules (PEFT adapters read from a ``ParameterDict``, T5's relative position bias) takes them
    over: they are not planned again below it; its other submodules are planned as usual."""
    layers: dict[int, _HookedLayer] = {}
    covered: list[tuple[str, set[int]]] = []  # (a planned layer's path, ids of its submodules' params)
    folding = [path for path, module in model.named_modules() if folds_batch(type(module))]
    for path, module in model.named_modules(remove_duplicate=False):
        refusal = refusal_for(type(module))
        reason = refusal(module) if refusal is not None else None
        if reason is not None:
            raise UnsupportedLayerError(f"layer '{path or '<root>'}' ({_type_name(module)}): {reason}")
        coupling = _batch_coupling(module)
        if coupling is not None:
            raise UnsupportedLayerError(
                f"layer '{path or '<root>'}' ({_type_name(module)}) is not supported by per-example "
                f"clipping: {coupling}; replace it (e.g. GroupNorm or LayerNorm) before training"
            )
        taken = {i for root, ids in covered if root != path and _inside(path, root) for i in ids}
        rule = rule_for(type(module))
        if rule is None and holds_parameter_container(module):
            rule = GENERIC_CONTAINER_RULE
        own = [(n, p) for n, p in _layer_params(module, rule) if id(p) not in taken]
        if not own:
            continue
        where = f"'{path or '<root>'}' ({_type_name(module)})"
        if rule is None:
            aliases = aliases_for(type(module))
            aliased = aliases.aliases if aliases is not None else {}
            unused = aliases is not None and aliases.unused_otherwise
            if all(n in aliased and (unused or module.get_parameter(aliased[n]) is p) for n, p in own):
                # Counted through the submodule that uses them, or (untied) never read by the forward:
                # no gradient, which the self-check confirms.
                continue
            # No registered rule: torch.func on the layer's own forward.
            rule = GENERIC_RULE
        reason = rule.check(module) if rule.check is not None else None
        if reason is not None:
            raise UnsupportedLayerError(f"layer {where} is not supported: {reason}")
        if id(module) not in layers:
            folded = any(path.startswith(f + ".") for f in folding)
            layers[id(module)] = _HookedLayer(path, module, rule, tuple(n for n, _ in own), folded)
            below = {id(p) for n, p in own if "." in n}
            if below:
                covered.append((path, below))
    return list(layers.values())


def _fold_factor(source: Tensor, out_rows: int, batch: int) -> int | None:
    """n when a call of a batch-folding layer returned (batch * n, ...) rows and its input (the primary
    one, for a rule that records the whole call) has a multiple of batch rows (a mixture-of-experts
    router may take (batch, seq, d) and return (batch * seq, E)), else None."""
    if batch == 0 or source.dim() < 2:
        return None
    n = out_rows // batch
    if n < 1 or out_rows != batch * n or source.shape[0] < batch or source.shape[0] % batch:
        return None
    return n


def _batch_error(layer: _HookedLayer, seen: Any, batch: int) -> ValueError:
    return ValueError(
        f"{layer.label} ran on a batch of {seen} but per_example_loss has {batch} entries; every layer "
        "with trainable parameters must see the batch in dimension 0 (pass position_ids/token_type_ids "
        "of shape (batch, seq), not (1, seq))"
    )


def _unfold(
    layer: _HookedLayer, x: Tensor | RecordedCall, source: Tensor, g: Tensor, batch: int
) -> tuple[Tensor | RecordedCall, Tensor]:
    """A call's input and output gradient with the batch in dimension 0. A batch-folding layer's
    (batch * n, ...) rows, batch-major, are viewed as (batch, n, ...), input and output separately (a
    router may take (batch, seq, d) and return (batch * seq, E)); a rule that records the whole call gets
    the output gradient unfolded and reads its arguments' layout itself. Any other call must see the
    batch in dimension 0 (``_batch_error``)."""
    if source.dim() > 0 and source.shape[0] == batch and g.dim() > 0 and g.shape[0] == batch:
        return x, g
    n = _fold_factor(source, g.shape[0] if g.dim() else 0, batch) if layer.folded else None
    if n is None:
        raise _batch_error(layer, source.shape[0] if source.dim() else "a scalar", batch)
    if isinstance(x, Tensor) and x.shape[0] != batch:
        x = x.reshape(batch, -1, *x.shape[1:])
    if g.shape[0] != batch:
        g = g.reshape(batch, -1, *g.shape[1:])
    return x, g


def _output_record(output: Tensor) -> tuple[GradientEdge, torch.Size, torch.dtype]:
    """What the engine keeps of a layer output: its gradient edge (the autograd node and slot that
    produced it), shape and dtype. Not the tensor: holding it would keep every layer's output (the
    vocabulary-wide logits among them) alive through the backward pass, which plain training frees.
    The edge also stays the layer's own if the model later changes the output in place."""
    return get_gradient_edge(output), output.shape, output.dtype


def _autocast_state(output: Any) -> tuple[str, torch.dtype] | None:
    """(device type, dtype) of the autocast the call ran under, or None."""
    device = output.device.type if isinstance(output, Tensor) else "cpu"
    return (device, torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else None


def _vocabulary_size(layers: list[_HookedLayer]) -> int | None:
    """The largest embedding table's row count: no per-example gradient with a dimension this large is
    ever materialised (see ``factors.norm_strategy``). None when the model has no embedding."""
    sizes = [layer.module.num_embeddings for layer in layers if isinstance(layer.module, nn.Embedding)]
    return max(sizes) if sizes else None


def _canonical_names(model: nn.Module, layers: list[_HookedLayer]) -> dict[tuple[int, str], str]:
    """(id(layer module), its parameter name) -> the parameter's name in ``model.named_parameters()``.

    Uses are keyed by name, not by tensor identity: FSDP2 swaps a module's registered parameters
    between sharded DTensors and unsharded tensors around each forward and backward. A tied weight
    has one name (the first, as ``named_parameters`` reports it) for all of its uses.
    """
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), name)
    return {
        (id(layer.module), n): first[id(layer.module.get_parameter(n))]
        for layer in layers
        for n in layer.param_names
    }


def _is_fsdp(model: nn.Module) -> bool:
    """Whether FSDP2 (``fully_shard``) manages some part of ``model``."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def _trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


_UNRECOGNISED_CHECKPOINT = (
    "a gradient checkpointing that hush_hf does not recognise re-runs layers in the backward pass; enable "
    "it with transformers' model.gradient_checkpointing_enable() (or TrainingArguments("
    "gradient_checkpointing=True)) or torch's checkpoint_wrapper, which per-example clipping follows"
)


def _walk_graph(loss: Tensor) -> tuple[set[int], bool]:
    """ids of the leaf tensors that a backward pass from ``loss`` would give a gradient, and whether the
    graph holds a reentrant ``torch.utils.checkpoint`` node (a walk of the autograd graph: no
    computation). Such a node hides the layers it re-runs (their parameters are not its inputs) and
    refuses ``autograd.grad``. Nodes are kept in ``seen`` so their Python wrappers stay the same objects
    while the walk compares them."""
    found: set[int] = set()
    seen: set[Any] = set()
    reentrant = False
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        reentrant = reentrant or type(node).__name__ == "CheckpointFunctionBackward"
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf
        if variable is not None:
            found.add(id(variable))
            continue
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found, reentrant


class GhostClipper:
    """Per-example gradient norms and clipped gradient sums via hooks on ``model`` (in place).

    Usage, once per micro-batch::

        outputs = model(**batch)                      # exactly one forward, hooks record
        loss = per_example_lm_loss(outputs.logits, batch["labels"], causal=True)
        norms = clipper.clipped_backward(loss)        # p.grad += sum_i min(1, C/||g_i||) g_i

    The model stays a plain module (class, forward and state_dict unchanged); ``remove()`` takes
    the hooks off. Parameters with ``requires_grad=False`` at construction are ignored; changing the
    set of trainable parameters later is an error (build a new clipper). Every layer holding a
    trainable parameter must see the batch in dimension 0: pass (batch, seq) ``position_ids``.
    loss_i must depend on example i only (true of transformers' LMs); modules that couple the
    examples of a batch or store batch statistics (BatchNorm, SyncBatchNorm, InstanceNorm with
    running stats) are refused at construction, with or without trainable parameters.
    Norms are exact up to floating-point rounding (computed in at least float32, summed over
    parameters in float64); examples are clipped to C * (1 - margin), with a rounding margin
    (``CLIP_MARGINS``: 2^-20 in float32, 2^-6 under bf16/fp16) so the gradient actually applied stays
    within C.

    Gradient checkpointing (transformers' flag on the model's layers, reentrant or not, or torch's
    ``checkpoint_wrapper``): decided at each forward; the calls are then tapped and the step takes two
    backward passes, norms then clipped sum, each recomputing the checkpointed segments
    (``recompute``), so the memory checkpointing saves stays saved; a router, which also reads its logits
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
        self._anchor: Tensor | None = None  # tapped forward: the taps' shared leaf (``recompute.Tap``)
        self._graph_dtypes: set[torch.dtype] | None = None  # what the backward computes in (first step)
        self._pass: NormPass | SumPass | None = None  # the two-pass step's current backward
        self._handles: list[RemovableHandle] = [
            model.register_forward_pre_hook(self._on_forward),
            model.register_forward_hook(self._after_forward, always_call=True),
        ]
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
    def _on_forward(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and not replaying():
            self._forwards += 1
            self._tapping = recomputes(self._model)
            self._in_forward = True
            self._anchor = None

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._in_forward = False

    def _record(self, layer: _HookedLayer, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if replaying():
            return None
        index = layer.rule.output_index
        if index is not None and isinstance(output, tuple):
            # The element the parameters act through (a router's logits) is the layer's output.
            return self._record_element(layer, module, args, kwargs, output, index)
        if self._tapping:
            return self._tap(layer, args, kwargs, output)
        if not torch.is_grad_enabled():
            return None
        if layer.rule.records_call:
            return self._record_call(layer, args, kwargs, output)
        inputs = [*args, *kwargs.values()]
        if len(inputs) != 1 or not isinstance(inputs[0], Tensor) or not isinstance(output, Tensor):
            raise ValueError(f"{layer.label} must be called with one tensor and return one tensor")
        if not output.requires_grad:
            return None  # no gradient reaches this call's parameters
        source = inputs[0].detach()
        x = source
        cast = self._autocast_dtype(layer, source)
        if cast is not None:
            # The op multiplies the autocast-dtype copy; the weight gradient is built from it.
            x = x.to(cast)
        params = tuple(module.get_parameter(n) for n in layer.param_names)
        self._calls.append(_Call(layer, x, source, source._version, *_output_record(output), params))
        if layer.rule.protects_output:
            # The model modifies this output in place (Falcon: ``mlp_output += attention_output``); it
            # continues with a copy, so the recorded output keeps the value autograd differentiates.
            return output.clone()
        return None

    @staticmethod
    def _autocast_dtype(layer: _HookedLayer, x: Tensor) -> torch.dtype | None:
        """The dtype the layer's op casts its input to under autocast (matmul-like rules), or None."""
        device_type = x.device.type
        if (
            layer.rule.casts_input_under_autocast
            and x.is_floating_point()
            and torch.is_autocast_enabled(device_type)
        ):
            return torch.get_autocast_dtype(device_type)
        return None

    @staticmethod
    def _shared_output(output: Tensor, primary: Tensor) -> Tensor | None:
        """One output for the whole batch (BART's decoder positions: (1, seq, d) from arange), expanded to
        the batch: the model's broadcasting add reads it identically, and row i of its gradient is then
        example i's own. None when the output is batch-first already."""
        if output.dim() > 0 and output.shape[0] == 1 and primary.shape[0] > 1:
            return output.expand(primary.shape[0], *output.shape[1:])
        return None

    def _record_call(self, layer: _HookedLayer, args: tuple, kwargs: dict, output: Any) -> Tensor | None:
        """Record every argument of a call (rules with ``records_call``, e.g. the generic path)."""

        def detach(value: Any) -> Any:
            return value.detach() if isinstance(value, Tensor) else value

        call = RecordedCall(
            tuple(detach(a) for a in args), {k: detach(v) for k, v in kwargs.items()}, _autocast_state(output)
        )
        primary = call.primary
        if primary is None or not isinstance(output, Tensor):
            raise ValueError(f"{layer.label} must be called with a batch-first tensor and return one tensor")
        if not output.requires_grad:
            return None
        shared = self._shared_output(output, primary)
        output = shared if shared is not None else output
        params = tuple(layer.module.get_parameter(n) for n in layer.param_names)
        self._calls.append(_Call(layer, call, primary, primary._version, *_output_record(output), params))
        return shared

    def _inject(self, layer: _HookedLayer, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        """Forward pre-hook of a layer whose rule ``injects`` (T5's relative position bias): the shared
        tensor is computed here, one batch-first copy per example, recorded (or tapped) like a layer
        output, and passed to the call as a keyword argument."""
        if replaying() or not (torch.is_grad_enabled() or self._tapping):
            return None
        assert layer.rule.injects is not None
        injection = layer.rule.injects.inject(module, args, kwargs)
        if injection is None:
            return None
        value = injection.value
        if self._tapping:
            tapped = self._tap(layer, (injection.x,), {}, value)
            value = tapped if tapped is not None else value
        elif value.requires_grad:
            x = injection.x.detach()
            params = tuple(module.get_parameter(n) for n in layer.param_names)
            self._calls.append(_Call(layer, x, x, x._version, *_output_record(value), params))
        return args, {**kwargs, injection.key: value}

    def _record_element(
        self, layer: _HookedLayer, module: nn.Module, args: tuple, kwargs: dict, output: tuple, index: int
    ) -> tuple | None:
        """A layer whose rule names ``output_index``: element ``index`` of its tuple output is recorded (or
        tapped) as the call's output; the others are computed from it inside the call (a router's scores
        from its logits), so the gradient the rule needs is all the gradient that element gets."""
        plain = replace(layer, rule=replace(layer.rule, output_index=None))
        if self._tapping:
            self._tap(plain, args, kwargs, output[index], within=True)
            return None
        element = self._record(plain, module, args, kwargs, output[index])
        return None if element is None else (*output[:index], element, *output[index + 1 :])

    def _tap(
        self, layer: _HookedLayer, args: tuple, kwargs: dict, output: Any, *, within: bool = False
    ) -> Tensor | None:
        """Tapped forward (gradient checkpointing): count the call's use of each parameter, and route its
        output through ``recompute.Tap`` with its input saved for the backward pass. The same in the
        forward and in a recomputation (non-reentrant checkpointing checks that both save alike).

        ``within``: the output is also read inside the call (a router's logits, see ``_record_element``),
        where a tap after the call would miss that gradient. The input is then saved by a
        ``recompute.Hold`` and the output's own gradient hook hands the whole gradient to ``receive``;
        the layer's parameters are among each pass's ``autograd.grad`` inputs (``_within``), so the
        pass reaches the output whatever precedes the layer."""
        if self._in_forward:
            for n in layer.param_names:
                self._expected[self._names[(id(layer.module), n)]] += 1
        if not torch.is_grad_enabled() or not isinstance(output, Tensor) or not output.requires_grad:
            return None
        if layer.rule.records_call:
            flat, spec = tree_flatten((tuple(args), dict(kwargs)))
            saved = [v.detach() for v in flat if isinstance(v, Tensor)]
            template = tuple(_SAVED if isinstance(v, Tensor) else v for v in flat)
            autocast = _autocast_state(output)
            primary = RecordedCall(tuple(args), dict(kwargs), None).primary
            if primary is None:
                raise ValueError(f"{layer.label} must be called with a batch-first tensor")
            shared = None if within else self._shared_output(output, primary)
            output = shared if shared is not None else output
            tag = _TapTag(layer, template, spec, autocast, None)
        else:
            inputs = [*args, *kwargs.values()]
            if len(inputs) != 1 or not isinstance(inputs[0], Tensor):
                raise ValueError(f"{layer.label} must be called with one tensor and return one tensor")
            saved = [inputs[0].detach()]
            tag = _TapTag(layer, None, None, None, self._autocast_dtype(layer, inputs[0]))
        if self._anchor is None:
            self._anchor = torch.zeros((), device=output.device, requires_grad=True)
        if within:
            # The hook keeps the Hold node (not the output's storage); the node does not lead back to the
            # output's node, so no reference cycle holds the graph.
            node = Hold.apply(self._anchor, *saved).grad_fn
            output.register_hook(partial(self._receive_whole, tag, node))
            return None
        tapped = Tap.apply(output, self._anchor, self, tag, *saved)
        return tapped.clone() if layer.rule.protects_output else tapped

    def _receive_whole(self, tag: _TapTag, node: Any, grad: Tensor) -> None:
        """Gradient hook of a ``within`` tap's output: the gradient it gets from everything that read it."""
        if self.active:
            self.receive(tag, node.saved_tensors, grad)  # unpacking recomputes under checkpointing

    def receive(self, tag: _TapTag, saved: tuple[Tensor, ...], grad: Tensor) -> None:
        """A tapped call's input and output gradient, during a two-pass backward (``recompute``): its
        per-example gradients go to the current pass."""
        state, layer = self._pass, tag.layer
        assert state is not None
        batch = state.coef.shape[0] if isinstance(state, SumPass) else state.batch
        x: Tensor | RecordedCall
        if tag.template is not None:
            it = iter(saved)
            flat = [next(it) if v is _SAVED else v for v in tag.template]
            args, kwargs = tree_unflatten(flat, tag.spec)
            x = RecordedCall(tuple(args), dict(kwargs), tag.autocast)
            source = x.primary
            assert source is not None
        else:
            source = saved[0]
            x = source.to(tag.cast) if tag.cast is not None else source
        if isinstance(state, NormPass):
            state.dtypes |= {t.dtype for t in (source, grad) if t.is_floating_point()}
            if isinstance(x, Tensor) and x.is_floating_point():
                state.dtypes.add(x.dtype)
        x, g = _unfold(layer, x, source, grad, batch)
        module = layer.module
        with replay():
            grads = layer.rule.grads(module, x, g)
        for n in layer.param_names:
            state.add(self._names[(id(module), n)], drop_zero_steps(grads[n]), module.get_parameter(n).shape)

    # ----------------------------------------------------------------------------- checks
    def _check_usable(self) -> None:
        if self._removed:
            raise RuntimeError("this GhostClipper was removed; build a new one")
        current = _trainable(self._model)
        # FSDP2 swaps parameter objects (sharded / unsharded) by design: compare names there.
        same = (
            [n for n, _ in current] == [n for n, _ in self._params]
            if _is_fsdp(self._model)
            else [id(p) for _, p in current] == self._trainable_ids
        )
        if not same:
            raise RuntimeError(
                "the trainable parameters of the model changed since the GhostClipper was built "
                "(requires_grad toggled or parameters replaced); remove() it and build a new one"
            )

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
        """The calls, root forwards and (tapped) expected uses recorded since the last use; the record is
        reset at once, so a failed call never leaks into the next one."""
        taken = self._calls, self._forwards, self._expected
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

    # ----------------------------------------------------------------------------- norms
    def _first_pass(self, loss: Tensor, calls: list[_Call], *, retain_graph: bool = True) -> _Pass:
        """Norms and factors of the recorded (untapped) calls: one ``autograd.grad`` to all output edges."""
        b = loss.shape[0]
        dtype = self._narrowest_dtype(calls, loss, self._computed_dtypes(loss))
        squared = torch.zeros(b, dtype=torch.float64, device=loss.device)
        # d(sum_i loss_i)/d(output) of each call; row i is example i's own output gradient.
        # All at once, so the graph is traversed once; the parameter gradients are not computed.
        # Taken at the outputs' gradient edges, so the outputs themselves (the logits among them)
        # are freed as in plain training. Memory: every hooked layer's output gradient stays alive
        # (as a factor) until the clipped sum is built, the logits' gradient included (for a masked
        # LM only its nonzero steps, see ``drop_zero_steps``).
        out_grads = list(
            torch.autograd.grad(
                loss.sum(), [c.edge for c in calls], retain_graph=retain_graph, allow_unused=True
            )
        )
        recorded: list[tuple[_HookedLayer, Tensor | RecordedCall, Tensor, tuple[Tensor, ...]] | None]
        recorded = [(c.layer, c.x, c.x_source, c.params) for c in calls]
        del calls
        if self._calls or self._forwards:
            self.reset()
            raise RuntimeError(_UNRECOGNISED_CHECKPOINT)
        uses: dict[str, list[PerExampleGrad]] = {}
        used: dict[str, list[Tensor]] = {}
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
            with replay():
                grads = layer.rule.grads(module, x, g)
            for name in layer.param_names:
                uses.setdefault(self._names[(id(module), name)], []).append(grads[name])
        x = g = grads = source = None  # type: ignore[assignment]  # the last call's tensors live on in the factors
        # Zero steps dropped (exact; a masked-LM head keeps ~15% of its logits gradient), all uses at once:
        # one device-to-host read for the whole step, not one per use.
        names = [name for name, found in uses.items() for _ in found]
        dropped = iter(drop_zero_steps_all([u for found in uses.values() for u in found]))
        uses = {name: [] for name in uses}
        for name in names:
            uses[name].append(next(dropped))
        recorded_names = frozenset(uses)
        terms: list[Tensor] = []
        for name in uses:
            # Materialised where that is no larger than the factors (freed here), else ghost form.
            uses[name] = combine_uses(uses[name], self._vocab)
        packed = pack_small(uses)  # biases and norm scales: one norm, one clipped-sum product for all
        if packed is not None:
            terms.append(packed.squared_norms())
        terms += [squared_norm_of_sum(found, self._vocab, clamp=False) for found in uses.values()]
        if terms:
            # Each parameter's exact squared norm is >= 0: a tiny negative is rounding (clamped per term).
            # (stacked first, widened once: one cast, not one per parameter)
            squared = squared + torch.stack(terms).to(torch.float64).clamp_min_(0.0).sum(dim=0)
        norms = self._finite(squared.sqrt())
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
        dtypes = {t.dtype for t in tensors if t.is_floating_point()} | (extra or set())
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
        self._check_usable()
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
        if _is_fsdp(self._model):
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
        result = self._first_pass(loss, calls, retain_graph=bool(check))
        norms = result.norms
        coef = self.clip_coefficients(norms, loss.dtype, margin=result.margin)
        if not check:
            packed = result.packed.weighted_sums(coef) if result.packed is not None else {}
            for name, p in self._params:
                uses = result.uses.pop(name, [])
                self._accumulate(p, self._clipped_sum(p, uses, coef) if uses else packed.pop(name, None))
            return norms
        rebuilt = self._rebuild(result, coef)
        got = self._autograd_grads((loss * coef).sum(), result, check, retain_graph=False)
        self._self_check(result, coef, rebuilt, got, check)
        del got
        for name, p in self._params:
            self._accumulate(p, rebuilt.pop(name, None))
        return norms

    def _two_pass(self, per_example_loss: Tensor, *, apply: bool) -> Tensor:
        """The step under gradient checkpointing (see ``recompute``): pass 1 takes the norms call by call
        while autograd's own gradient of sum_i loss_i is kept for the self-check; pass 2 (``apply``)
        adds sum_i c_i G_i of every call to the parameter's clipped sum."""
        _, forwards, expected = self._take_calls()
        self._check_usable()
        if _is_fsdp(self._model):
            raise UnsupportedLayerError(
                "gradient checkpointing is not supported under FSDP: its two backward passes per micro-batch "
                "would each run FSDP's gradient reduce-scatter (not verified); turn checkpointing off or "
                "train with DDP"
            )
        loss = self._check_loss(per_example_loss)
        self._check_forwards(forwards)
        b = loss.shape[0]
        if b == 0:
            return torch.zeros(0, dtype=torch.float64, device=loss.device)
        shapes = {name: p.shape for name, p in self._params}
        anchor, (_, reentrant) = self._anchor, _walk_graph(loss)
        norm_pass = NormPass(b, expected, self._vocab, set(self._unverified), loss.device, loss.dtype)
        if reentrant or anchor is None:
            got = run_pass(self._params, partial(self._backward, norm_pass, loss, retain_graph=True))
        else:
            unverified = [(name, p) for name, p in self._params if name in self._unverified]
            within = [p for name, p in self._within if name not in self._unverified]
            inputs = [anchor, *(p for _, p in unverified), *within]
            grads = self._grad_pass(norm_pass, loss, inputs, retain_graph=True)
            got = {name: g for (name, _), g in zip(unverified, grads[1 : 1 + len(unverified)], strict=True)}
        norm_pass.close(shapes)
        if not norm_pass.seen:
            raise RuntimeError("no layer with trainable parameters ran in the forward pass")
        dtype = self._narrowest_dtype([], loss, norm_pass.dtypes | self._computed_dtypes(loss))
        norms = self._finite(norm_pass.squared.sqrt())
        result = _Pass(norms, {}, dtype, {}, frozenset(norm_pass.seen), None, loss.device.type)
        check = {name for name in self._unverified if got.get(name) is not None}
        if check:
            ones = torch.ones_like(norms, dtype=loss.dtype)
            self._self_check(result, ones, norm_pass.rebuilt, got, check)
        del got, norm_pass
        if not apply:
            return norms
        coef = self.clip_coefficients(norms, loss.dtype, margin=result.margin)
        sum_pass = SumPass(coef)
        if reentrant or anchor is None:
            run_pass(self._params, partial(self._backward, sum_pass, loss, retain_graph=False))
        else:
            self._grad_pass(sum_pass, loss, [anchor, *(p for _, p in self._within)], retain_graph=False)
        for name, p in self._params:
            self._accumulate(p, sum_pass.sums.pop(name, None))
        return norms

    def _backward(self, state: NormPass | SumPass, loss: Tensor, *, retain_graph: bool) -> None:
        """One pass as ``Tensor.backward`` (reentrant checkpointing): see ``recompute.run_pass``."""
        self._pass = state
        try:
            loss.sum().backward(retain_graph=retain_graph)
        finally:
            self._pass = None

    def _grad_pass(
        self, state: NormPass | SumPass, loss: Tensor, inputs: list[Tensor], *, retain_graph: bool
    ) -> tuple[Tensor | None, ...]:
        """One pass as ``autograd.grad`` towards ``inputs`` (the taps' anchor first): the taps report, and
        only the gradients of ``inputs`` are computed."""
        self._pass = state
        try:
            return torch.autograd.grad(loss.sum(), inputs, retain_graph=retain_graph, allow_unused=True)
        finally:
            self._pass = None

    def _autograd_grads(
        self, loss: Tensor, result: _Pass, names: set[str], *, retain_graph: bool
    ) -> dict[str, Tensor | None]:
        """Autograd's gradient of ``loss`` for the parameters ``names``: w.r.t. the tensors the forward
        used (FSDP2: the unsharded parameters), or the registered one for a layer that never ran."""
        keys, tensors = [], []
        for name, p in self._params:
            if name in names:
                for t in result.used.get(name, [p]):
                    keys.append(name)
                    tensors.append(t)
        got = torch.autograd.grad(loss, tensors, retain_graph=retain_graph, allow_unused=True)
        out: dict[str, Tensor | None] = {}
        for name, g in zip(keys, got, strict=True):
            if g is not None:
                out[name] = g if out.get(name) is None else out[name] + g
            else:
                out.setdefault(name, None)
        return out

    @staticmethod
    def _clipped_sum(p: nn.Parameter, uses: list[PerExampleGrad], coef: Tensor) -> Tensor:
        """``sum_u sum_i coef_i G_{u,i}`` for one parameter, in at least float32, shaped like ``p``."""
        total: Tensor | None = None
        for use in uses:
            part = weighted_sum(use, coef).reshape(p.shape)
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
    def _rebuild(self, result: _Pass, coef: Tensor) -> dict[str, Tensor]:
        """``sum_i coef_i G_{i,p}`` from the recorded factors, for every parameter with a recorded use.

        Built before the check's backward and the factors freed at once, so the check holds one extra
        gradient-sized copy rather than every layer's output gradient (the logits' included).
        """
        rebuilt: dict[str, Tensor] = result.packed.weighted_sums(coef) if result.packed is not None else {}
        for name, p in self._params:
            uses = result.uses.pop(name, [])
            if uses:
                rebuilt[name] = self._clipped_sum(p, uses, coef)
        result.uses.clear()
        return rebuilt

    def _self_check(
        self,
        result: _Pass,
        coef: Tensor,
        rebuilt: dict[str, Tensor],
        added: dict[str, Tensor | None],
        names: set[str],
    ) -> None:
        """Refuse when the gradient autograd computes differs from the one the norms were taken of.

        ``added[name]`` is the gradient of ``sum_i coef_i loss_i`` that autograd gives the parameter;
        ``rebuilt[name] = sum_i coef_i G_{i,p}`` comes from the recorded factors (``_rebuild``, with
        ``factors.weighted_sum``: a parameter-sized product, no per-example gradient is formed). They
        agree (to rounding) exactly when every use of every trainable parameter went through a hooked
        call whose rule is right.
        A parameter read directly -- ``h @ self.wte.weight.T``, ``F.linear(x, mod.weight)``,
        DeBERTa's ``rel_embeddings.weight`` -- gets gradient that no norm counted, so its example
        would be under-clipped: that is refused, naming the parameter. The tolerance is relative to
        ``sum_i ||c_i g_i||`` (the scale of the whole clipped gradient, so that parameters whose
        gradient is zero in exact arithmetic, e.g. attention key biases, do not trip it on rounding
        noise), per parameter and over the checked parameters together: 1e-4 in float32 and wider,
        2^-4 under bf16/fp16 (where autograd and the rebuilt sum round apart by ~1%), so with bf16 only a
        direct use carrying more than ~6% of the gradient is seen; 2^-6 for float32 with TF32 (or bf16)
        matrix products in force (``precision.check_rtol``); run the first step in float32 with
        ``torch.set_float32_matmul_precision("highest")`` for the sharpest check.
        A parameter that the loss reaches although no hooked call of it recorded a use
        (its layer never ran, or a ``ParameterDict`` read by a module with no rule) is refused whatever
        its gradient, zero included: the structural half of the check.

        Which calls check which parameters (``names``): every not-yet-verified parameter the loss reaches.
        A parameter is verified by the first check that finds its autograd gradient nonzero and matching;
        one whose gradient is zero in that call (the batch does not touch it: a token that does not
        occur, an expert no token is routed to) stays unverified and is checked again at the next call
        that reaches it. So no parameter goes unverified because of what the first micro-batch holds.
        What this cannot see: a direct use whose gradient is zero or below the tolerance in every call
        that reaches the parameter after it was verified (a branch taken only later). That use would be
        missing from the update, never applied unclipped (the update is built from the factors).

        Why a gradient comparison and not a check of how the forward reads parameters (e.g. a
        ``TorchFunctionMode`` that flags parameters used outside their module's call): it sees every
        use, including ones outside the model's forward (a loss computed from ``model.lm_head.weight``)
        and rule bugs, and has no false alarms on harmless reads (``weight.dtype``, ``.shape``).
        """
        total = float((coef.to(torch.float64) * result.norms).sum())
        reduced = precision.low_precision_step(result.dtype, result.device_type)
        rtol = precision.check_rtol(result.dtype, result.device_type)
        gaps: list[tuple[str, float, bool, bool]] = []  # (name, gap, recorded, reached)
        for name, p in self._params:
            if name not in names:
                continue
            mine, got = rebuilt.get(name), added.get(name)
            recorded = name in result.recorded
            if got is None:
                gap = float(mine.norm()) if mine is not None else 0.0
            else:
                got = got.to(torch.promote_types(p.dtype, torch.float32))
                gap = float((got - mine).norm() if mine is not None else got.norm())
            gaps.append((name, gap, recorded, got is not None))
        overall = math.sqrt(sum(gap**2 for _, gap, _, _ in gaps))
        # A parameter with no recorded use has, by the record, no gradient: reaching it is a direct use.
        bad = [(n, rec) for n, gap, rec, reached in gaps if (not gap <= rtol * total if rec else reached)]
        if not bad and not overall <= rtol * total:
            worst = max(gaps, key=lambda item: item[1])
            bad = [(worst[0], worst[2])]
        if bad:
            self._refuse(bad, reduced)
        if _is_fsdp(self._model):
            if total > 0:
                self._unverified.clear()  # all at once (see _names_to_check)
            return
        for name, _, recorded, reached in gaps:
            got = added.get(name)
            if recorded and reached and got is not None and bool(got.ne(0).any()):
                self._unverified.discard(name)

    @staticmethod
    def _refuse(bad: list[tuple[str, bool]], reduced: bool) -> None:
        """The self-check's error: parameter names only (the size of a gap is a statistic of the batch)."""
        unrecorded = [n for n, rec in bad if not rec]
        listed = ", ".join(f"'{n}'" for n, _ in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        hint = (
            f" ({', '.join(repr(n) for n in unrecorded[:5])} reached by the loss although no call of the "
            "layer owning it ran)"
            if unrecorded
            else ""
        )
        raise UnsupportedLayerError(
            f"self-check failed: the gradient autograd adds to trainable parameter(s) {listed}{more} "
            f"differs from the per-example gradients the clip norms were computed from{hint}. Most "
            "likely the parameter is used outside its module's forward (read directly, e.g. "
            "`h @ module.weight.T`, `F.linear(x, module.weight)` or a relative-position table "
            "`module.weight`), so that use is missing from the per-example norm and clipping would "
            "not bound it by C; call the owning module instead, freeze the parameter, or register a "
            "rule for the layer that uses it"
            + (
                "; under bf16/fp16 or TF32 matrix products it can also mean unusually large rounding: "
                "check the same model in float32 with torch.set_float32_matmul_precision('highest')"
                if reduced
                else "; less likely, low-precision arithmetic inside the model (rounding beyond 1e-4)"
            )
        )

    # ----------------------------------------------------------------------------- lifecycle
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
