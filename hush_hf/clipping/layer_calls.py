"""What the ghost-clipping engine hooks and records: the layers with trainable parameters, each call of
one, the tags of a two-pass backward, the result of the norm pass, and the clip margins.

Split from :mod:`hush_hf.clipping.ghost` (the engine itself): the planning of hooked layers (which
module's rule owns which parameter, folded batches, canonical parameter names under FSDP2) and the
checks of a recorded call's batch layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from hush_hf.clipping import precision
from hush_hf.clipping.factors import (
    Packed,
    PerExampleGrad,
)
from hush_hf.clipping.float32_products import bf16_toward_zero
from hush_hf.clipping.graph_dtypes import graph_nodes
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
)

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


class _Call(NamedTuple):
    """What one call of a hooked layer saw in the forward pass. (A named tuple: one is built per hooked
    call, and a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``.)"""

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
    call: int  # the call's index among the forward's taps (its anchor's)


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

    def applied(self, coef: Tensor) -> Tensor:
        """The clip coefficients the sums apply: on CUDA in a bf16 step, cut to bf16's bits toward zero
        (``float32_products.bf16_toward_zero``, never above c_i), the weights the bf16 products' route
        takes, for every parameter alike; so the self-check compares the sums with autograd's gradient
        at the weights they were built with, its whole tolerance left for what it looks for."""
        if self.dtype == torch.bfloat16 and self.device_type == "cuda":
            return bf16_toward_zero(coef).to(coef.dtype)
        return coef

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
    refuses ``autograd.grad``."""
    found: set[int] = set()
    reentrant = False
    for node in graph_nodes(loss):
        reentrant = reentrant or type(node).__name__ == "CheckpointFunctionBackward"
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf
        if variable is not None:
            found.add(id(variable))
    return found, reentrant


def _own_forwards(layers: list[_HookedLayer], clipper: Any) -> dict[int, Any]:
    """id(module) -> the engine's own forward installed on it, for the layers whose rule has one
    (``LayerRule.own_forward``: the engine runs the call itself and keeps what its rule needs)."""
    return {
        id(layer.module): layer.rule.own_forward(layer.module, clipper, layer)
        for layer in layers
        if layer.rule.own_forward is not None
    }


def _inner_captures(calls: list[_Call]) -> list[Any]:
    """The captures of recorded calls that the engine ran itself and that name a gradient edge inside the
    call (an MoE experts call: its up projection's output); the first pass sets their ``dh``, the gradient
    of sum_i loss_i there, from the same ``autograd.grad`` as the calls' output gradients."""
    return [
        c.x.capture
        for c in calls
        if isinstance(c.x, RecordedCall) and getattr(c.x.capture, "edge", None) is not None
    ]
