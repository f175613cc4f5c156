"""The clipping step under gradient checkpointing: two backward passes, norms then the clipped sum
(:mod:`hush_hf.clipping.recompute`). A mixin of :class:`hush_hf.clipping.ghost.GhostClipper`, which owns
the state and the checks these methods use."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor

from hush_hf.clipping.layer_calls import _Pass, _walk_graph
from hush_hf.clipping.recompute import NormPass, SumPass, keep_budget, run_pass
from hush_hf.clipping.registry import UnsupportedLayerError


class CheckpointedStep:
    """``GhostClipper.clipped_backward`` and ``per_example_norms`` when the forward was tapped."""

    _checkpointing: tuple
    _walked: tuple[tuple, bool] | None

    _anchors: list[Tensor]
    _anchors_by_call: Any
    _call_bytes: list[int]
    _segment_bytes: list[int]
    _bottom_bytes: int
    _pass: Any
    _fsdp_managed: Callable[[], bool]

    def _reentrant(self, loss: Tensor) -> bool:
        """Whether the graph behind ``loss`` holds a reentrant ``torch.utils.checkpoint`` node, which refuses
        ``autograd.grad`` (``layer_calls._walk_graph``). The walk visits every node of the graph, about a
        tenth of a checkpointed LoRA step's Python calls, so it is taken again only when the checkpoint
        configuration changes (``recompute.checkpoint_configuration``). A reentrant checkpoint that slipped
        past it would make ``autograd.grad`` raise, before any gradient is written."""
        if self._walked is None or self._walked[0] != self._checkpointing:
            self._walked = (self._checkpointing, _walk_graph(loss)[1])
        return self._walked[1]

    def _two_pass(self, per_example_loss: Tensor, *, apply: bool) -> Tensor:
        """The step under gradient checkpointing (see ``recompute``): pass 1 takes the norms call by call
        while autograd's own gradient of sum_i loss_i is kept for the self-check; pass 2 (``apply``)
        adds sum_i c_i G_i of every call to the parameter's clipped sum."""
        _, forwards, expected = self._take_calls()
        if self._fsdp_managed():
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
        anchors, reentrant = self._anchors_by_call(loss.device), self._reentrant(loss)
        keyed = not reentrant and bool(self._anchors)  # ``autograd.grad`` passes, which can stop early
        keep = keep_budget(self._bottom_bytes, self._segment_bytes) if keyed and apply else 0.0
        rebuild, device = set(self._unverified), loss.device
        norm_pass = NormPass(b, expected, self._vocab, rebuild, device, loss.dtype, keep, self._call_bytes)
        if not keyed:
            got = run_pass(self._params, partial(self._backward, norm_pass, loss, retain_graph=True))
        else:
            unverified = [(name, p) for name, p in self._params if name in self._unverified]
            within = [p for name, p in self._within if name not in self._unverified]
            asked = list({id(a): a for a in anchors}.values())
            grads = self._grad_pass(norm_pass, loss, [*asked, *(p for _, p in unverified), *within], True)
            found = grads[len(asked) : len(asked) + len(unverified)]
            got = {name: g for (name, _), g in zip(unverified, found, strict=True)}
        norm_pass.close(shapes)
        if not norm_pass.seen:
            raise RuntimeError("no layer with trainable parameters ran in the forward pass")
        dtype = self._narrowest_dtype([], loss, norm_pass.dtypes | self._computed_dtypes(loss))
        check = {name for name in self._unverified if got.get(name) is not None}
        # The norms' finiteness check reads them back: when the sums follow and no self-check needs the
        # norms first, only once every sum is queued (see ``clipped_backward``); the sums are held until
        # the end here anyway, so nothing reaches p.grad before it.
        late = apply and not check
        norms = norm_pass.squared.sqrt()
        if not late:
            self._finite(norms)
        result = _Pass(norms, {}, dtype, {}, frozenset(norm_pass.seen), None, loss.device.type)
        if check:
            ones = torch.ones_like(norms, dtype=loss.dtype)
            self._self_check(result, ones, norm_pass.rebuilt, got, check)
        del got
        if not apply:
            return norms
        coef = result.applied(self.clip_coefficients(norms, loss.dtype, margin=result.margin))
        if not keyed:
            sum_pass = SumPass(coef)
            run_pass(self._params, partial(self._backward, sum_pass, loss, retain_graph=False))
        else:  # the kept calls' sums first; autograd runs only down to the others (``recompute``)
            sum_pass, inputs = norm_pass.sum_pass(coef), norm_pass.second_pass_inputs(anchors, self._within)
            del norm_pass
            if inputs:
                self._grad_pass(sum_pass, loss, inputs, retain_graph=False)
        sums = sum_pass.finish()
        if late:
            self._finite(norms)
        for name, p in self._params:
            self._accumulate(p, sums.pop(name, None))
        return norms

    def _backward(self, state: NormPass | SumPass, loss: Tensor, *, retain_graph: bool) -> None:
        """One pass as ``Tensor.backward`` (reentrant checkpointing): see ``recompute.run_pass``."""
        self._pass = state
        try:
            loss.sum().backward(retain_graph=retain_graph)
        finally:
            self._pass = None

    def _grad_pass(
        self, state: NormPass | SumPass, loss: Tensor, inputs: list[Tensor], retain_graph: bool
    ) -> tuple[Tensor | None, ...]:
        """One pass as ``autograd.grad`` towards ``inputs`` (the calls' anchors first): the taps report, and
        only the gradients of ``inputs`` are computed."""
        self._pass = state
        try:
            return torch.autograd.grad(loss.sum(), inputs, retain_graph=retain_graph, allow_unused=True)
        finally:
            self._pass = None
