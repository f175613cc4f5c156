"""Registry of per-layer gradient rules, keyed by exact layer type (Opacus ``grad_sample`` style).

A rule turns what one call of a layer saw (its input ``x`` and the gradient ``g`` of the summed
per-example loss w.r.t. its output) into the per-example gradient of each of its own parameters,
in factored form where that is cheap (see ``factors``). The engine combines the uses of each
parameter, so a rule never needs to know whether its weight is tied.

Types are matched exactly, never by ``isinstance``: a subclass that overrides ``forward`` (e.g.
Gemma-2's scaled word embedding, a ``nn.Embedding``) has a different gradient and must have its own
rule. Two verified exceptions (``rule_for``): a subclass that does not override ``forward`` (it runs
the parent's very function) uses the parent's rule, and a class whose ``forward`` is the same code
over the same base classes as a registered class's (transformers copies modules between models, e.g.
Gemma-3's scaled word embedding is Gemma-2's) uses that class's rule. Classes of optional libraries
(transformers) are registered by qualified name, so that registering them imports nothing; a lookup
by name still checks the class object itself. Layers with no rule fall back to the generic
torch.func path (``rules_generic``) when their own parameters are small.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from hush_hf.clipping.factors import PerExampleGrad

GradRule = Callable[[nn.Module, Tensor, Tensor], Mapping[str, PerExampleGrad]]
BatchedGradRule = Callable[[list[tuple[nn.Module, Tensor, Tensor]]], list[Mapping[str, PerExampleGrad]]]
ConfigCheck = Callable[[nn.Module], "str | None"]


class UnsupportedLayerError(ValueError):
    """A trainable parameter sits in a layer whose per-example gradient norm hush_hf cannot compute."""


@dataclass(frozen=True)
class LayerRule:
    """How to get per-example gradients of one layer type's parameters.

    ``grads(module, x, g)``: x is the layer's (single) input, g the gradient w.r.t. its output, both
    batch-first; returns ``{param_name: PerExampleGrad}`` for every parameter it owns.
    ``check(module)``: a reason string if this instance's configuration is unsupported, else None.
    ``casts_input_under_autocast``: the layer's op runs in the autocast dtype (matmul-like), so the
    recorded input is cast the same way to reproduce the gradient autograd actually computes.
    ``records_call``: the rule gets a :class:`RecordedCall` (every argument of the call) instead of
    the single input ``x`` (layers called with several inputs, the generic path).
    ``protects_output``: the model modifies this layer's output in place, so the model continues
    with a copy and the recorded output stays intact.
    ``output_index``: the layer returns a tuple, and element ``output_index`` is the output its
    parameters act through (a router's logits; the other elements are computed from it inside the
    call): that element is the output whose gradient the rule gets (and a copy the engine makes of it,
    ``protects_output``, goes back in its place; under gradient checkpointing the element's own gradient
    hook takes that gradient, see ``GhostClipper._tap``). The self-check refuses the layer if its
    parameters reach the loss another way.
    ``owns``: which trainable parameters the rule covers when not just the module's own: dotted names
    of submodule parameters (e.g. ``trainable_tokens_delta.default``) are then not hooked again on
    their own; for layers that read their submodules' parameters directly (PEFT adapters kept in a
    ``ParameterDict``).
    ``injects``: the layer computes, from its own parameters, a tensor that the whole batch shares and
    that the model passes back in as a keyword argument (T5's relative position bias): see
    :class:`Injection`. The rule then gets the injection's ``x`` and the gradient of its batch-wide copy.
    ``saved_input(module, x, output)``: called in the forward hook (not under gradient checkpointing);
    what the rule gets instead of the input x, typically a value the forward computed and autograd
    keeps anyway (so the rule need not compute it again), or None to give the rule x. The rule must
    accept both.
    ``batched(calls)``: ``grads`` of several (module, x, g) calls at once, in order (``rule_batches``:
    the engine holds a few calls of such layers and evaluates them together, fewer and larger operations).
    ``own_forward(module, clipper, layer)``: installs the engine's own forward of the layer while the
    clipper is attached (an object with ``take()``, what the last call left for the rule: the
    ``RecordedCall``'s ``capture``, and ``remove()``); see :mod:`hush_hf.clipping.experts_capture`.
    """

    grads: GradRule
    check: ConfigCheck | None = None
    casts_input_under_autocast: bool = False
    records_call: bool = False
    protects_output: bool = False
    output_index: int | None = None
    owns: Callable[[nn.Module], list[tuple[str, nn.Parameter]]] | None = None
    injects: Injector | None = None
    saved_input: Callable[[nn.Module, Tensor, Tensor], Any] | None = None
    batched: BatchedGradRule | None = None
    own_forward: Callable[[nn.Module, Any, Any], Any] | None = None


@dataclass(frozen=True)
class Injection:
    """What an :data:`Injector` computed before a layer call: ``value`` (batch-first, one copy per
    example, e.g. an ``expand`` of a tensor the batch shares) goes into the call as keyword ``key``;
    the rule gets ``x`` and the gradient of ``sum_i loss_i`` w.r.t. ``value`` (row i: example i's own).

    ``method``: ``key`` names a method of the layer that its forward calls once to compute the shared
    tensor itself (UMT5's ``compute_bias``, MPNet's ``compute_position_bias``); during the call that
    method returns ``value`` instead, and nothing is added to the call's arguments."""

    key: str
    x: Tensor
    value: Tensor
    method: bool = False


@dataclass(frozen=True)
class Injector:
    """``params(module)``: the dotted names of the parameters the shared tensor is computed from (the
    layer's rule covers them, and their own submodule is not hooked); ``inject(module, args, kwargs)``,
    called before each call of the layer: the :class:`Injection`, or None when the call already
    receives the shared tensor (an earlier layer computed it) or does not need it."""

    params: Callable[[nn.Module], list[str]]
    inject: Callable[[nn.Module, tuple, dict], Injection | None]


@dataclass(frozen=True)
class RecordedCall:
    """Every argument of one layer call (tensors detached), and the autocast state it ran under.

    ``primary`` is the first batch-first tensor argument: the engine checks its batch size and
    in-place changes like the single input of an ordinary rule.
    """

    args: tuple
    kwargs: Mapping[str, object]
    autocast: tuple[str, object] | None  # (device_type, dtype) when autocast was on
    capture: Any = None  # what the layer's ``own_forward`` kept of this call, if it ran it

    @property
    def primary(self) -> Tensor | None:
        for value in (*self.args, *self.kwargs.values()):
            if isinstance(value, Tensor) and value.dim() > 0:
                return value
        return None


@dataclass(frozen=True)
class ParamAliases:
    """A container whose own parameters are only used through a submodule (same Parameter object).

    ``aliases`` maps the container's parameter name to the dotted path of the submodule parameter
    it is identical to (e.g. BERT's ``cls.predictions.bias`` is ``cls.predictions.decoder.bias``).
    Identity is verified per instance; the gradient is counted once, through the submodule.
    """

    aliases: Mapping[str, str] = field(default_factory=dict)
    unused_otherwise: bool = False
    """When the parameter is not identical to the submodule's (untied), the container's forward never
    reads it (verified by reading that forward): it gets no gradient and needs no rule."""


_RULES: dict[type | str, LayerRule] = {}
_ALIASES: dict[type | str, ParamAliases] = {}


def _keys(targets: tuple[type | str, ...]) -> list[type | str]:
    if not targets:
        raise ValueError("register a rule for at least one layer type")
    for t in targets:
        if not (isinstance(t, str) or (isinstance(t, type) and issubclass(t, nn.Module))):
            raise ValueError(f"register target must be an nn.Module subclass or 'module.Class', got {t!r}")
    return list(targets)


def register_norm_rule(
    *targets: type | str,
    check: ConfigCheck | None = None,
    casts_input_under_autocast: bool = False,
    protects_output: bool = False,
    records_call: bool = False,
    output_index: int | None = None,
    owns: Callable[[nn.Module], list[tuple[str, nn.Parameter]]] | None = None,
    injects: Injector | None = None,
    saved_input: Callable[[nn.Module, Tensor, Tensor], Any] | None = None,
    batched: BatchedGradRule | None = None,
    own_forward: Callable[[nn.Module, Any, Any], Any] | None = None,
) -> Callable[[GradRule], GradRule]:
    """Decorator: register ``grads`` as the rule for each layer type (or ``'module.Class'`` name)."""

    keys = _keys(targets)

    def decorator(grads: GradRule) -> GradRule:
        rule = LayerRule(
            grads,
            check,
            casts_input_under_autocast,
            records_call=records_call,
            protects_output=protects_output,
            output_index=output_index,
            owns=owns,
            injects=injects,
            saved_input=saved_input,
            batched=batched,
            own_forward=own_forward,
        )
        for key in keys:
            _RULES[key] = rule
        return grads

    return decorator


def register_param_aliases(
    target: type | str, aliases: Mapping[str, str], *, unused_otherwise: bool = False
) -> None:
    """Declare that ``target``'s own parameters are the named submodule parameters (see ParamAliases)."""
    for key in _keys((target,)):
        _ALIASES[key] = ParamAliases(dict(aliases), unused_otherwise)


def _lookup(table: Mapping[type | str, object], layer_type: type) -> object | None:
    if layer_type in table:
        return table[layer_type]
    name = f"{layer_type.__module__}.{layer_type.__qualname__}"
    if name not in table:
        return None
    # The name matched; make sure it is that very class (not a same-named look-alike).
    owner = sys.modules.get(layer_type.__module__)
    return table[name] if getattr(owner, layer_type.__qualname__, None) is layer_type else None


def _exact_rule(layer_type: type) -> LayerRule | None:
    found = _lookup(_RULES, layer_type)
    return found if isinstance(found, LayerRule) else None


def _registered_classes() -> list[type]:
    """Registered layer classes that exist (name-registered ones only once their module is imported)."""
    classes = []
    for key in _RULES:
        if isinstance(key, type):
            classes.append(key)
            continue
        module_name, _, qualname = key.rpartition(".")
        owner = sys.modules.get(module_name)
        found = getattr(owner, qualname, None) if owner is not None else None
        if isinstance(found, type):
            classes.append(found)
    return classes


def _same_code(f: object, h: object) -> bool:
    """Same bytecode, constants and names: the two functions compute the same thing on the same object."""
    a, b = getattr(f, "__code__", None), getattr(h, "__code__", None)
    if a is None or b is None:
        return False
    fields = ("co_code", "co_consts", "co_names", "co_varnames", "co_argcount", "co_kwonlyargcount")
    return all(getattr(a, n) == getattr(b, n) for n in fields)


def _model_prefix_free(module_name: str, qualname: str) -> str | None:
    """A transformers model class's name without its model's prefix (``MixtralRMSNorm`` in
    ``transformers.models.mixtral.modeling_mixtral`` -> ``RMSNorm``), or None when it has none."""
    parts = module_name.split(".")
    if len(parts) != 4 or parts[:2] != ["transformers", "models"]:
        return None
    model = parts[2].replace("_", "")
    if qualname[: len(model)].lower() != model or len(qualname) == len(model):
        return None
    return qualname[len(model) :]


def _import_namesakes(layer_type: type) -> None:
    """Import the modules of the name-registered transformers classes that differ from ``layer_type``'s
    name only by the model's prefix (Llama's ``LlamaRMSNorm`` for ``MixtralRMSNorm``), so that the
    same-code match of ``rule_for`` can compare them: transformers copies modules between models, and a
    model's copy should not take the generic path only because the original's model was not imported.
    Which modules to import is all the names decide; the match itself is still by code and bases."""
    suffix = _model_prefix_free(layer_type.__module__, layer_type.__qualname__)
    if suffix is None:
        return
    for key in _RULES:
        if isinstance(key, str):
            module_name, _, qualname = key.rpartition(".")
            if module_name not in sys.modules and _model_prefix_free(module_name, qualname) == suffix:
                try:
                    importlib.import_module(module_name)
                except ImportError:  # a model this transformers version does not ship
                    continue


def rule_for(layer_type: type) -> LayerRule | None:
    """The rule for this type, or None: its own registered rule; else the rule of the nearest
    registered ancestor whose ``forward`` it inherits unchanged (the same function object); else the
    rule of a registered class whose ``forward`` has the same code and the same base classes (so
    ``super()`` resolves alike; its module imported first if only the model prefix tells the names
    apart, ``_import_namesakes``). Anything else (an overridden forward) gets no inherited rule."""
    found = _exact_rule(layer_type)
    if found is not None:
        return found
    forward = getattr(layer_type, "forward", None)
    for ancestor in layer_type.__mro__[1:]:
        rule = _exact_rule(ancestor)
        if rule is not None:
            if getattr(ancestor, "forward", None) is forward:
                return rule
            break
    _import_namesakes(layer_type)
    for registered in _registered_classes():
        if registered.__mro__[1:] == layer_type.__mro__[1:] and _same_code(
            registered.__dict__.get("forward"), layer_type.__dict__.get("forward")
        ):
            return _exact_rule(registered)
    return None


def aliases_for(layer_type: type) -> ParamAliases | None:
    """The parameter aliases declared for exactly this container type, or None."""
    found = _lookup(_ALIASES, layer_type)
    return found if isinstance(found, ParamAliases) else None


_FOLDS: set[type | str] = set()


def register_batch_fold(target: type | str) -> None:
    """Declare that layers inside ``target`` may see the batch folded into rows, batch-major.

    Some models reshape a (batch, seq, d) tensor to (batch * seq, d) before their feed-forward
    layers (OPT's decoder layer: ``hidden_states.reshape(-1, d)``). Row r then belongs to example
    r // seq, and the engine unfolds such calls to (batch, seq, d) before applying a rule. Input and
    output are unfolded separately (a mixture-of-experts router may take (batch, seq, d) and return
    (batch * seq, E)). A rule that records the whole call (``records_call``) gets the output gradient
    unfolded the same way, as a (batch, rows / batch, ...) view of the rows, and reads the layout of
    its arguments itself. Declared per container type after reading its forward, never guessed: a
    (seq * batch) layout would mix examples.
    """
    for key in _keys((target,)):
        _FOLDS.add(key)


def folds_batch(layer_type: type) -> bool:
    """Whether ``register_batch_fold`` declared exactly this container type."""
    return _lookup({k: True for k in _FOLDS}, layer_type) is True


_REFUSALS: dict[type | str, ConfigCheck] = {}


def register_refusal(target: type | str, check: ConfigCheck) -> None:
    """``check(module)`` returns why per-example gradients of this container's (trainable) parameters
    cannot be exact (and what to do instead), or None; the engine refuses at construction."""
    for key in _keys((target,)):
        _REFUSALS[key] = check


def refusal_for(layer_type: type) -> ConfigCheck | None:
    """The refusal check registered for exactly this type, or None."""
    found = _lookup(_REFUSALS, layer_type)
    return found if callable(found) else None
