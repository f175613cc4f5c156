"""Registry of per-layer gradient rules, keyed by exact layer type (Opacus ``grad_sample`` style).

A rule turns what one call of a layer saw (its input ``x`` and the gradient ``g`` of the summed
per-example loss w.r.t. its output) into the per-example gradient of each of its own parameters,
in factored form where that is cheap (see ``factors``). The engine combines the uses of each
parameter, so a rule never needs to know whether its weight is tied.

Types are matched exactly, never by ``isinstance``: a subclass that overrides ``forward`` (e.g.
Gemma-2's scaled word embedding, a ``nn.Embedding``) has a different gradient and must have its own
rule. Classes of optional libraries (transformers) are registered by qualified name, so that
registering them imports nothing; a lookup by name still checks the class object itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from torch import Tensor, nn

from hush_hf.clipping.factors import PerExampleGrad

GradRule = Callable[[nn.Module, Tensor, Tensor], Mapping[str, PerExampleGrad]]
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
    """

    grads: GradRule
    check: ConfigCheck | None = None
    casts_input_under_autocast: bool = False


@dataclass(frozen=True)
class ParamAliases:
    """A container whose own parameters are only used through a submodule (same Parameter object).

    ``aliases`` maps the container's parameter name to the dotted path of the submodule parameter
    it is identical to (e.g. BERT's ``cls.predictions.bias`` is ``cls.predictions.decoder.bias``).
    Identity is verified per instance; the gradient is counted once, through the submodule.
    """

    aliases: Mapping[str, str] = field(default_factory=dict)


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
) -> Callable[[GradRule], GradRule]:
    """Decorator: register ``grads`` as the rule for each layer type (or ``'module.Class'`` name)."""

    keys = _keys(targets)

    def decorator(grads: GradRule) -> GradRule:
        rule = LayerRule(grads, check, casts_input_under_autocast)
        for key in keys:
            _RULES[key] = rule
        return grads

    return decorator


def register_param_aliases(target: type | str, aliases: Mapping[str, str]) -> None:
    """Declare that ``target``'s own parameters are the named submodule parameters (see ParamAliases)."""
    for key in _keys((target,)):
        _ALIASES[key] = ParamAliases(dict(aliases))


def _lookup(table: Mapping[type | str, object], layer_type: type) -> object | None:
    if layer_type in table:
        return table[layer_type]
    name = f"{layer_type.__module__}.{layer_type.__qualname__}"
    if name not in table:
        return None
    # The name matched; make sure it is that very class (not a same-named look-alike).
    owner = sys.modules.get(layer_type.__module__)
    return table[name] if getattr(owner, layer_type.__qualname__, None) is layer_type else None


def rule_for(layer_type: type) -> LayerRule | None:
    """The rule registered for exactly this type, or None."""
    found = _lookup(_RULES, layer_type)
    return found if isinstance(found, LayerRule) else None


def aliases_for(layer_type: type) -> ParamAliases | None:
    """The parameter aliases declared for exactly this container type, or None."""
    found = _lookup(_ALIASES, layer_type)
    return found if isinstance(found, ParamAliases) else None
