"""A gradient written outside the DP step is refused before the optimizer applies it.

The optimizer may apply only ``(S + N(0, sigma^2 C^2 I)) / B`` with ``S = sum_i clip(g_i, C)`` (Hush
Alg. 2, lines 8-10). Anything else added to ``p.grad`` (or to the float32 clipped sum kept beside a bf16
parameter, :mod:`hush_hf.clipping.clipped_sums`) is neither clipped nor noised, and the card would still
certify the run. It happens without an error in two windows of an optimizer step:

1. after the DP step's clipped backward passes and before the noise: a ``training_step`` override that
   calls ``super()`` and then back-propagates an auxiliary loss, a callback's ``on_pre_optimizer_step``
   ordered before the DP callback's, a backward run by a hook;
2. after the noise and before the optimizer step: a callback's ``on_pre_optimizer_step`` ordered after it
   (even a data-free rescaling of the noisy gradient is refused: it cannot be told apart).

At the end of each window's writer (:class:`GradientStamps`): every trainable parameter's gradient
tensors (``p.grad`` and the float32 sum) are recorded by object and version counter (no copy; in-place
writes bump the counter, autograd's accumulation included, and a new tensor changes the object), and
compared at the next reader: the noise (:meth:`hush_hf.trainer.engine.DPStep.privatize`) and an
optimizer step pre-hook. A write through ``.data`` moves no version counter and is not seen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.utils.hooks import RemovableHandle

from hush_hf.clipping.clipped_sums import CLIPPED_SUM_ATTRIBUTE

_Stamp = tuple[Tensor | None, int, Tensor | None, int]
_SUM = CLIPPED_SUM_ATTRIBUTE


def _version(tensor: Tensor | None) -> int:
    """The version counter of ``tensor``; -1 for None. A DTensor's in-place ops bump its own counter and
    writes to its local shard the shard's, so both count."""
    if tensor is None:
        return -1
    if isinstance(tensor, DTensor):
        return int(tensor._version) + int(tensor.to_local()._version)
    return int(tensor._version)


def _stamps(params: Sequence[nn.Parameter]) -> list[_Stamp]:
    # Run twice per optimizer step over every trainable parameter: plain tensors read their counters
    # inline (no Python call each), anything else goes through _version.
    out = []
    for p in params:
        grad, total = p.grad, getattr(p, _SUM, None)
        out.append((
            grad,
            -1 if grad is None else grad._version if grad.__class__ is Tensor else _version(grad),
            total,
            -1 if total is None else total._version if total.__class__ is Tensor else _version(total),
        ))
    return out


class GradientStamps:
    """The gradient tensors of ``params`` now, by object and version counter; ``when`` names the moment
    for the error."""

    def __init__(self, params: Sequence[nn.Parameter], when: str) -> None:
        self.params, self.when = params, when
        self.stamps = _stamps(params)

    def first_written(self) -> int | None:
        """Index of the first parameter whose gradient tensors changed since the stamps; None if none."""
        for k, (now, then) in enumerate(zip(_stamps(self.params), self.stamps, strict=True)):
            if now[0] is not then[0] or now[2] is not then[2] or now[1] != then[1] or now[3] != then[3]:
                return k
        return None

    def check(self, model: nn.Module | None, before: str) -> None:
        """RuntimeError naming the parameter if a gradient was written since the stamps, ``before`` (what
        was about to use it)."""
        k = self.first_written()
        if k is None:
            return
        names = {id(p): name for name, p in model.named_parameters()} if model is not None else {}
        name = names.get(id(self.params[k]), f"#{k}")
        raise RuntimeError(
            f"the gradient of parameter {name!r} was written {self.when} and before {before}: an "
            "overridden training_step that back-propagates more than super() does, a callback's "
            "on_pre_optimizer_step, or a backward outside the DP step adds a gradient that is not clipped "
            "and noised; refusing it (compute an extra loss term inside compute_per_example_loss)"
        )


def optimizer_step_guard(optimizer: Any, check: Callable[[], None]) -> RemovableHandle | None:
    """Run ``check()`` before every step of ``optimizer``: on the torch optimizer that applies the
    gradients (accelerate's wrapper unwrapped); None when there is none."""
    while getattr(optimizer, "optimizer", None) not in (None, optimizer):
        optimizer = optimizer.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    return optimizer.register_step_pre_hook(lambda *_: check())
