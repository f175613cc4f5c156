"""Calls of one layer type taken together: a norm layer's per-example gradients in batches.

A LayerNorm's per-example gradients (``rules_torch.layer_norm_grads``: the input normalised again, its
product with the output gradient summed over the steps, the bias a sum) are four or five small operations
per layer, each a kernel launch on a GPU with little work behind it; GPT-2 has 2L + 1 such layers, Llama
2L + 1 RMSNorms (``rules_rms_norm``: a widening, a product and a sum each). A rule
with a batched form (``LayerRule.batched``) has its calls held (``HeldCalls``) until ``BATCH_BYTES`` of
them are held or the last call is seen, then evaluated at once: the batched form stacks the calls of one
shape, dtype and configuration and takes each operation once for all of them. The same numbers as one
call at a time: the same elementwise values, summed over the same steps in the same dtype.

Memory: the held calls' inputs and output gradients stay alive until their batch is evaluated, at most
``BATCH_BYTES`` of them with their stacked copies (``footprint``); a larger call is evaluated alone, at
once, as are calls of rules without a batched form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from hush_hf.clipping import gram_batches
from hush_hf.clipping.factors import PerExampleGrad, compute_dtype
from hush_hf.clipping.rules_generic import replay

Done = list[tuple[Any, Mapping[str, PerExampleGrad]]]
"""(hooked layer, its per-example gradients by parameter name) of evaluated calls."""


def footprint(x: Tensor, g: Tensor) -> int:
    """Bytes a held call can take, at most: its input and output gradient, their stacked copies (the input
    in the compute dtype) and two compute-dtype results of the input's size (normalised input, product)."""
    wide = compute_dtype(x, g).itemsize
    return x.numel() * (x.element_size() + 3 * wide) + 2 * g.numel() * g.element_size()


class HeldCalls:
    """The calls of layers whose rule has a batched form, held for one batch (see the module docstring).
    ``run`` each call in order, then ``flush`` once: every call's gradients come back exactly once."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = gram_batches.BATCH_BYTES if budget is None else budget  # as it is now, not at import
        self._held: list[tuple[Any, Any, Tensor]] = []
        self._bytes = 0

    def run(self, layer: Any, x: Any, g: Tensor) -> Done:
        """This call's gradients now (no batched form, an input that neither is nor holds (``values``) one
        tensor, or a call over the budget), else none yet: the call is held, and the held ones are
        evaluated first if it would not fit with them."""
        values = x if isinstance(x, Tensor) else getattr(x, "values", None)  # a saved normalised input's
        batched = layer.rule.batched is not None and isinstance(values, Tensor)
        size = footprint(values, g) if batched else 0  # type: ignore[arg-type]
        if not batched or size > self.budget:
            with replay():
                return [(layer, layer.rule.grads(layer.module, x, g))]
        done = self.flush() if self._bytes + size > self.budget else []
        self._held.append((layer, x, g))
        self._bytes += size
        return done

    def flush(self) -> Done:
        """The gradients of every held call (none held: nothing), the calls of one rule in one batch."""
        held, self._held, self._bytes = self._held, [], 0
        by_rule: dict[int, list[tuple[Any, Any, Tensor]]] = {}
        for call in held:
            by_rule.setdefault(id(call[0].rule.batched), []).append(call)
        done: Done = []
        with replay():
            for calls in by_rule.values():
                found = calls[0][0].rule.batched([(layer.module, x, g) for layer, x, g in calls])
                done += [(layer, grads) for (layer, _, _), grads in zip(calls, found, strict=True)]
        return done
