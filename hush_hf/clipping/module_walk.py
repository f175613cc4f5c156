"""``list(model.modules())`` without ``named_modules``' names.

The engine walks the model's modules at every micro-batch (is any layer checkpointed? did the trainable
parameters change?). ``nn.Module.modules()`` goes through ``named_modules``, which builds every
module's dotted name and resumes one generator per level per module: about 2.5x the work of the walk
below on a 12-layer GPT-2. On a GPU a small micro-batch's step is bound by such host work.
"""

from __future__ import annotations

from torch import nn


def modules_in_order(model: nn.Module) -> list[nn.Module]:
    """Every module of ``model`` once, in ``model.modules()`` order (depth first, parent before its
    children, children in registration order; a module registered twice at its first place only)."""
    seen = {id(model)}
    out = [model]
    stack = [iter(model._modules.values())]
    while stack:
        child = next(stack[-1], _END)
        if child is _END:
            stack.pop()
        elif child is not None and id(child) not in seen:
            seen.add(id(child))
            out.append(child)
            stack.append(iter(child._modules.values()))
    return out


_END = object()
