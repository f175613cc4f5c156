"""The forward hooks of the ghost-clipping engine: each call of a hooked layer is recorded (its inputs,
and the gradient edge of its output, never the output itself), or tapped under gradient checkpointing,
where the rules run inside the backward (:mod:`hush_hf.clipping.recompute`).

A mixin of :class:`hush_hf.clipping.ghost.GhostClipper`, which owns the state these methods fill.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from hush_hf.clipping.experts_capture import TAPPED, ExpertsCapture
from hush_hf.clipping.layer_calls import (
    _SAVED,
    _autocast_state,
    _Call,
    _HookedLayer,
    _output_record,
    _TapTag,
    _unfold,
)
from hush_hf.clipping.module_walk import walk_model
from hush_hf.clipping.recompute import (
    Hold,
    NormPass,
    SumPass,
    Tap,
    checkpoint_configuration,
    checkpointed_segments,
)
from hush_hf.clipping.registry import (
    RecordedCall,
)
from hush_hf.clipping.rules_generic import (
    replay,
    replaying,
)
from hush_hf.clipping.rules_moe import captured_grads


def _answer_once(module: nn.Module, method: str, value: Tensor) -> None:
    """During the call about to run, ``module.<method>(...)`` returns ``value`` (its first use; later
    uses run the class's method): an instance attribute shadows the method until it is used or the call
    ends (a forward hook that also runs when the call raises removes it, and itself)."""

    def once(*args: Any, **kwargs: Any) -> Tensor:
        if module.__dict__.get(method) is once:
            del module.__dict__[method]
        return value

    def clear(*_: Any) -> None:
        if module.__dict__.get(method) is once:
            del module.__dict__[method]
        handle.remove()

    module.__dict__[method] = once
    handle = module.register_forward_hook(clear, always_call=True)


def _parameters_of(module: nn.Module, names: tuple[str, ...]) -> tuple[Tensor, ...]:
    """``module.get_parameter(n)`` for each name, as the call used them (FSDP2 swaps parameter objects),
    read straight from ``module._parameters`` for a direct name that no class attribute shadows (what
    ``get_parameter`` returns then; it walks the path and checks the type, once per hooked call)."""
    own = module._parameters
    found = []
    for n in names:
        param = own.get(n)
        # (``type(...) is`` first: ``isinstance`` of ``nn.Parameter`` runs its metaclass's Python check)
        if not (type(param) is nn.Parameter or isinstance(param, nn.Parameter)) or _shadowed(type(module), n):
            param = module.get_parameter(n)
        found.append(param)
    return tuple(found)


_SHADOWED: dict[tuple[type, str], bool] = {}


def _shadowed(kind: type, name: str) -> bool:
    """Whether the class defines ``name`` itself (a property would win over ``_parameters``)."""
    key = (kind, name)
    if key not in _SHADOWED:
        _SHADOWED[key] = "." in name or hasattr(kind, name)
    return _SHADOWED[key]


def _factor_bytes(saved: list[Tensor], output: Tensor) -> int:
    """A tapped call's factors, estimated: its saved inputs and an output-sized gradient."""
    return sum(t.nbytes for t in saved) + output.nbytes


def _is_model_output(output: Any) -> bool:
    """Whether ``output`` is a transformers ``ModelOutput`` (a mapping of its set fields that also
    indexes like the tuple of them), told apart without importing transformers."""
    return isinstance(output, Mapping) and callable(getattr(output, "to_tuple", None))


class CallRecorder:
    """Forward-hook side of :class:`~hush_hf.clipping.ghost.GhostClipper` (see the module docstring)."""

    def _on_forward(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and not replaying():
            self._forwards += 1
            self._forward_walk = walk_model(self._model)  # also read by ``_check_usable``
            self._tapping = self._forward_walk.recomputes
            segments, self._in_segment = checkpointed_segments(self._model) if self._tapping else ([], {})
            self._segment_bytes, self._bottom_bytes = [0] * len(segments), 0
            self._checkpointing = checkpoint_configuration(segments)
            self._in_forward = True
            self._anchors, self._call_bytes = [], []

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._in_forward = False

    def _record(self, layer: _HookedLayer, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if replaying():
            return None
        index = layer.rule.output_index
        if index is not None and isinstance(output, tuple):
            # The element the parameters act through (a router's logits) is the layer's output.
            return self._record_element(layer, module, args, kwargs, output, index)
        if index is not None and _is_model_output(output):
            # transformers' ``ModelOutput`` (an encoder's): element ``index`` of its tuple view.
            fields = list(output.keys())  # the fields that are set, in the order ``to_tuple`` gives them
            recorded = self._record_element(layer, module, args, kwargs, output.to_tuple(), index)
            return None if recorded is None else type(output)(**{**output, fields[index]: recorded[index]})
        if self._tapping:
            return self._tap(layer, args, kwargs, output)
        if not torch.is_grad_enabled():
            return None
        if layer.rule.records_call:
            return self._record_call(layer, args, kwargs, output)
        inputs = args if not kwargs else (*args, *kwargs.values())
        if len(inputs) != 1 or not isinstance(inputs[0], Tensor) or not isinstance(output, Tensor):
            raise ValueError(f"{layer.label} must be called with one tensor and return one tensor")
        if not output.requires_grad:
            return None  # no gradient reaches this call's parameters
        source = inputs[0].detach()
        x: Any = source
        cast = self._autocast_dtype(layer, source)
        if cast is not None:
            # The op multiplies the autocast-dtype copy; the weight gradient is built from it.
            x = x.to(cast)
        if layer.rule.saved_input is not None:  # a value the forward computed, in place of the input
            saved = layer.rule.saved_input(module, source, output)
            x = x if saved is None else saved
        params = _parameters_of(module, layer.param_names)
        self._calls.append(_Call(layer, x, source, source._version, *_output_record(output), params))
        if layer.rule.protects_output:
            # The model modifies this output in place (Falcon: ``mlp_output += attention_output``); it
            # continues with a copy, so the recorded output keeps the value autograd differentiates.
            return output.clone()
        return None

    @staticmethod
    def _autocast_dtype(layer: _HookedLayer, x: Tensor) -> torch.dtype | None:
        """The dtype the layer's op casts its input to under autocast (matmul-like rules), or None."""
        if not layer.rule.casts_input_under_autocast or not x.is_floating_point():
            return None
        device_type = "cuda" if x.is_cuda else x.device.type  # (``x.device`` builds a device object)
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None

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

        own = self._own_forwards.get(id(layer.module))
        capture = own.take() if own is not None else None
        call = RecordedCall(
            tuple(detach(a) for a in args),
            {k: detach(v) for k, v in kwargs.items()},
            _autocast_state(output),
            capture,
        )
        primary = call.primary
        if primary is None or not isinstance(output, Tensor):
            raise ValueError(f"{layer.label} must be called with a batch-first tensor and return one tensor")
        if not output.requires_grad:
            return None
        shared = self._shared_output(output, primary)
        output = shared if shared is not None else output
        params = _parameters_of(layer.module, layer.param_names)
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
            params = _parameters_of(module, layer.param_names)
            self._calls.append(_Call(layer, x, x, x._version, *_output_record(value), params))
        if injection.method:
            _answer_once(module, injection.key, value)
            return None
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
        own = self._own_forwards.get(id(layer.module))
        if own is not None and own.take() is TAPPED:
            return None  # the call reports its per-example gradients itself (``_report_captured``)
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
            anchor, call = self._tap_anchor(output.device, _factor_bytes(saved, output), layer.module)
            tag = _TapTag(layer, template, spec, autocast, None, call)
        else:
            inputs = [*args, *kwargs.values()]
            if len(inputs) != 1 or not isinstance(inputs[0], Tensor):
                raise ValueError(f"{layer.label} must be called with one tensor and return one tensor")
            saved = [inputs[0].detach()]
            anchor, call = self._tap_anchor(output.device, _factor_bytes(saved, output), layer.module)
            tag = _TapTag(layer, None, None, None, self._autocast_dtype(layer, inputs[0]), call)
        if within:
            # The hook keeps the Hold node (not the output's storage); the node does not lead back to the
            # output's node, so no reference cycle holds the graph.
            node = Hold.apply(anchor, *saved).grad_fn
            output.register_hook(partial(self._receive_whole, tag, node))
            return None
        tapped = Tap.apply(output, anchor, self, tag, *saved)
        return tapped.clone() if layer.rule.protects_output else tapped

    def _tap_anchor(self, device: torch.device, nbytes: int, module: nn.Module) -> tuple[Tensor, int]:
        """A tapped call's own leaf (``recompute.Tap``) and its index; ``nbytes``: its factors' estimated
        size (what the norm pass may keep, see ``recompute.keep_budget``), counted in the bytes of the
        checkpointed segment ``module`` lies in, or of the calls below the segments. A call outside the
        root forward (a
        recomputation's, whose node autograd drops, or reentrant checkpointing's) gets the spare leaf.

        The leaves are made once and reused at every step: scalars made afresh in each forward and
        recomputation, alive until the next forward, scatter the heap (measured: 60-100 MB more peak
        resident memory on the Mixtral bench)."""
        call = len(self._call_bytes)
        self._call_bytes.append(nbytes)
        if not self._in_forward:
            return self._leaf(device, -1), call
        segment = self._in_segment.get(id(module))
        if segment is not None:
            self._segment_bytes[segment] += nbytes
        elif not any(self._segment_bytes):  # below the first segment
            self._bottom_bytes += nbytes
        self._anchors.append(self._leaf(device, len(self._anchors)))
        return self._anchors[-1], call

    def _leaf(self, device: torch.device, index: int) -> Tensor:
        """The reused scalar leaf number ``index`` on ``device`` (-1: the spare)."""
        pool = self._leaves.setdefault(device, [])
        while len(pool) <= index + 1:
            pool.append(torch.zeros((), device=device, requires_grad=True))
        return pool[index + 1]

    def _anchors_by_call(self, device: torch.device) -> list[Tensor]:
        """Each call's leaf by call index (the spare for calls outside the root forward)."""
        return self._anchors + [self._leaf(device, -1)] * (len(self._call_bytes) - len(self._anchors))

    def _report_captured(
        self, layer: _HookedLayer, capture: ExpertsCapture, dy: Tensor, dtype: torch.dtype, call: int
    ) -> None:
        """A tapped experts call that the engine ran itself (``experts_capture``), in a two-pass backward:
        its per-example gradients, from what the call's own nodes received, go to the current pass."""
        state = self._pass
        if state is None:
            return
        batch = state.coef.shape[0] if isinstance(state, SumPass) else state.batch
        if isinstance(state, NormPass):
            state.dtypes |= {dtype, capture.x.dtype, capture.a.dtype, dy.dtype}
        module = layer.module
        tokens = capture.pair.shape[0] // capture.top_k
        with replay():
            grads = captured_grads(module, capture, dy, batch, tokens)
        for n in layer.param_names:
            name, shape = self._names[(id(module), n)], module.get_parameter(n).shape
            state.add(name, state.pruned(grads[n], self._vocab, call, name), shape, call)

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
            name, shape = self._names[(id(module), n)], module.get_parameter(n).shape
            state.add(name, state.pruned(grads[n], self._vocab, tag.call, name), shape, tag.call)

    # ----------------------------------------------------------------------------- checks
