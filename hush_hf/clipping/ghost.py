"""GhostClipper: exact per-example gradient norms and clipped gradients for a plain HF model.

DP-SGD needs ``sum_i clip(g_i, C) = sum_i min(1, C/||g_i||) g_i`` with g_i the gradient of loss_i
w.r.t. ALL trainable parameters (Hush, Algorithm 2, lines 6 and 9; Abadi et al. 2016). Ghost
clipping (Li et al. 2022) gets ||g_i|| from each layer's input x and output gradient dL/dy without
forming g_i, then runs a second backward pass on ``sum_i c_i loss_i`` with the clip coefficients
c_i held constant; its gradient is exactly the clipped sum.

Why not Opacus's ``GradSampleHooksFastGradientClipping`` itself: it computes each layer's norm in
isolation inside a per-layer backward hook and raises on tied parameters ("Parameter tying is not
supported with Ghost Clipping"), while GPT-2, Gemma-2 and BERT-MLM all tie the output projection
to the word embedding. The exact norm of a tied weight needs all of its uses together (the cross
term, see ``factors.squared_norm_of_sum``); summing per-use norms can under-estimate it, which
would void the guarantee. Its embedding norm also ignores ``padding_idx`` (over-estimates). So this
engine keeps Opacus's design (forward hooks that record activations, a registry of per-layer rules
keyed by exact type, two backward passes, hooks only, no wrapping) but records each layer call,
gets all output gradients at once with one ``torch.autograd.grad`` (which skips the parameter
gradients), and combines the uses of each parameter before taking the norm.
"""

from __future__ import annotations

import logging
import numbers
import weakref
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from hush_hf.clipping.factors import PerExampleGrad, squared_norm_of_sum
from hush_hf.clipping.registry import LayerRule, UnsupportedLayerError, aliases_for, rule_for

logger = logging.getLogger(__name__)

# Models that currently carry a GhostClipper's hooks (a second one would double-record every call).
_ATTACHED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


@dataclass(frozen=True)
class _HookedLayer:
    path: str
    module: nn.Module
    rule: LayerRule
    param_names: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"layer '{self.path or '<root>'}' ({type(self.module).__name__})"


@dataclass(frozen=True)
class _Call:
    """What one call of a hooked layer saw in the forward pass."""

    layer: _HookedLayer
    x: Tensor  # input as the layer's op used it (detached)
    x_source: Tensor  # the input as passed (detached; shares the version counter)
    x_version: int
    output: Tensor  # kept attached: the first pass differentiates w.r.t. it
    output_version: int


def _type_name(module: nn.Module) -> str:
    return type(module).__name__


def _plan_layers(model: nn.Module) -> list[_HookedLayer]:
    """Every module that directly holds a trainable parameter must have a rule (or alias it)."""
    layers: dict[int, _HookedLayer] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        own = [(n, p) for n, p in module._parameters.items() if p is not None and p.requires_grad]
        if not own:
            continue
        where = f"'{path or '<root>'}' ({_type_name(module)})"
        rule = rule_for(type(module))
        if rule is not None:
            reason = rule.check(module) if rule.check is not None else None
            if reason is not None:
                raise UnsupportedLayerError(f"layer {where} is not supported: {reason}")
            if id(module) not in layers:
                layers[id(module)] = _HookedLayer(path, module, rule, tuple(n for n, _ in own))
            continue
        aliases = aliases_for(type(module))
        aliased = aliases.aliases if aliases is not None else {}
        uncovered = [n for n, p in own if n not in aliased or module.get_parameter(aliased[n]) is not p]
        if uncovered:
            raise UnsupportedLayerError(
                f"layer {where} holds trainable parameter(s) {uncovered} but hush_hf.clipping has no "
                f"per-example gradient rule for {_type_name(module)}; freeze them (requires_grad=False) "
                "or register a rule with hush_hf.clipping.register_norm_rule"
            )
    return list(layers.values())


def _trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


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
    loss_i must depend on example i only (true of transformers' LMs; BatchNorm-like layers have no
    rule and are refused).
    Norms are exact up to floating-point rounding (computed in at least float32, summed over
    parameters in float64). Not supported: gradient checkpointing, layers recomputed in backward.
    The norms are per-example statistics of private data: do not log them.
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
        self._trainable_ids = [id(p) for _, p in _trainable(model)]
        self._calls: list[_Call] = []
        self._forwards = 0
        self._handles: list[RemovableHandle] = [model.register_forward_pre_hook(self._count_forward)]
        for layer in self._layers:
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

    # ----------------------------------------------------------------------------- hooks
    def _count_forward(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():
            self._forwards += 1

    def _record(
        self, layer: _HookedLayer, module: nn.Module, args: tuple, kwargs: dict, output: Any
    ) -> None:
        if not torch.is_grad_enabled():
            return
        inputs = [*args, *kwargs.values()]
        if len(inputs) != 1 or not isinstance(inputs[0], Tensor) or not isinstance(output, Tensor):
            raise ValueError(f"{layer.label} must be called with one tensor and return one tensor")
        if not output.requires_grad:
            return  # no gradient reaches this call's parameters
        source = inputs[0].detach()
        x = source
        device_type = x.device.type
        if (
            layer.rule.casts_input_under_autocast
            and x.is_floating_point()
            and torch.is_autocast_enabled(device_type)
        ):
            # The op multiplies the autocast-dtype copy; the weight gradient is built from it.
            x = x.to(torch.get_autocast_dtype(device_type))
        self._calls.append(_Call(layer, x, source, source._version, output, output._version))

    # ----------------------------------------------------------------------------- checks
    def _check_usable(self) -> None:
        if self._removed:
            raise RuntimeError("this GhostClipper was removed; build a new one")
        current = _trainable(self._model)
        if [id(p) for _, p in current] != self._trainable_ids:
            raise RuntimeError(
                "the trainable parameters of the model changed since the GhostClipper was built "
                "(requires_grad toggled or parameters replaced); remove() it and build a new one"
            )
        # transformers layers carry a ``gradient_checkpointing`` flag, True once it is enabled.
        if any(getattr(m, "gradient_checkpointing", False) is True for m in self._model.modules()):
            raise RuntimeError("gradient checkpointing is not supported: it re-runs layers in backward")

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

    def _take_calls(self) -> tuple[list[_Call], int]:
        """The calls and root forwards recorded since the last use; the record is reset at once, so a
        failed call never leaks into the next one."""
        calls, forwards = self._calls, self._forwards
        self.reset()
        return calls, forwards

    @staticmethod
    def _check_calls(calls: list[_Call], forwards: int, batch: int) -> None:
        if forwards != 1:
            raise RuntimeError(
                f"exactly one forward pass of the model must precede each call; saw {forwards} "
                "(call reset() to discard a forward you will not back-propagate)"
            )
        if batch and not calls:
            raise RuntimeError("no layer with trainable parameters ran in the forward pass")
        for c in calls:
            if c.x_source._version != c.x_version or c.output._version != c.output_version:
                raise RuntimeError(
                    f"the input or output of {c.layer.label} was modified in place after it ran; "
                    "its per-example gradient cannot be recovered"
                )
            if c.x.dim() == 0 or c.x.shape[0] != batch or c.output.dim() == 0 or c.output.shape[0] != batch:
                seen = c.x.shape[0] if c.x.dim() else "a scalar"
                raise ValueError(
                    f"{c.layer.label} ran on a batch of {seen} but per_example_loss has {batch} "
                    "entries; every layer with trainable parameters must see the batch in dimension 0 "
                    "(pass position_ids/token_type_ids of shape (batch, seq), not (1, seq))"
                )

    def reset(self) -> None:
        """Discard what the hooks recorded since the last call (e.g. after an aborted step)."""
        self._calls = []
        self._forwards = 0

    # ----------------------------------------------------------------------------- norms
    def per_example_norms(self, per_example_loss: Tensor) -> Tensor:
        """||g_i||_2 over all trainable parameters, shape (b,), float64, detached.

        Leaves ``p.grad`` untouched; keeps the autograd graph (a later backward may reuse it).
        """
        calls, forwards = self._take_calls()
        self._check_usable()
        loss = self._check_loss(per_example_loss)
        b = loss.shape[0]
        self._check_calls(calls, forwards, b)
        if b == 0:
            return torch.zeros(0, dtype=torch.float64, device=loss.device)
        # d(sum_i loss_i)/d(output) of each call; row i is example i's own output gradient.
        # All at once, so the graph is traversed once; the parameter gradients are not computed.
        # Memory: every hooked layer's output gradient is alive until processed (about one more
        # copy of the activations, the logits' gradient included).
        out_grads = list(
            torch.autograd.grad(loss.sum(), [c.output for c in calls], retain_graph=True, allow_unused=True)
        )
        if self._calls or self._forwards:
            self.reset()
            raise RuntimeError("layers ran during the backward pass (gradient checkpointing?): not supported")
        uses: dict[int, list[PerExampleGrad]] = {}
        for k, call in enumerate(calls):
            g, out_grads[k] = out_grads[k], None  # free each output gradient once used
            if g is None:
                continue  # output not used by the loss: zero gradient
            grads = call.layer.rule.grads(call.layer.module, call.x, g)
            for name in call.layer.param_names:
                uses.setdefault(id(call.layer.module._parameters[name]), []).append(grads[name])
        squared = torch.zeros(b, dtype=torch.float64, device=loss.device)
        for per_use in uses.values():
            squared += squared_norm_of_sum(per_use).to(torch.float64)
        norms = squared.sqrt()
        bad = torch.nonzero(~torch.isfinite(norms)).flatten()
        if bad.numel():
            raise FloatingPointError(f"per-example gradient norm is not finite for example(s) {bad.tolist()}")
        return norms

    def clip_coefficients(self, norms: Tensor, dtype: torch.dtype) -> Tensor:
        """c_i = min(1, C/||g_i||), rounded towards 0 in ``dtype`` so that ||c_i g_i|| never exceeds C
        because of the cast (rounding up would add to the sensitivity the noise is calibrated to)."""
        norms = norms.to(torch.float64)
        exact = torch.where(norms > self._max_norm, self._max_norm / norms, torch.ones_like(norms))
        cast = exact.to(dtype)
        rounded_up = cast.to(torch.float64) > exact
        return torch.where(rounded_up, torch.nextafter(cast, torch.zeros_like(cast)), cast)

    def clipped_backward(self, per_example_loss: Tensor) -> Tensor:
        """Adds ``sum_i min(1, C/||g_i||) g_i`` to ``p.grad`` (accumulating); returns the norms (float64).

        Two passes over the graph of one forward: norms (``per_example_norms``), then the backward of
        ``sum_i c_i loss_i`` with c_i constant, whose gradient is exactly the clipped sum.
        """
        norms = self.per_example_norms(per_example_loss)
        if norms.numel() == 0:
            return norms
        coef = self.clip_coefficients(norms, per_example_loss.dtype)
        (per_example_loss * coef).sum().backward()
        return norms

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
