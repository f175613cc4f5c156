"""The floating dtypes a backward pass computes in, read from the autograd graph.

A model may compute part of its forward in a narrower dtype than its parameters and activations (MPT and
GPT-J in float64 run parts of their attention in float32; DeepSeek-style routers upcast to float32, which
is wider only under bf16). Gradients flowing back through such a part carry that part's rounding, so the
per-example norms and the clipped sum built from them agree only to that precision: the clip margin
(``ghost.CLIP_MARGINS``) must follow the narrowest dtype any node of the graph computed in, not only the
dtypes of the recorded layer inputs and outputs. Every autograd node records the dtype of the gradient it
receives (``Node._input_metadata``, one entry per output of the forward op); a walk from the loss collects
them (no computation, one Python visit per node). Leaves are skipped: trainable parameters are counted
with the parameters, and the engine's own float32 anchor leaf (``recompute.Tap``) is no computation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor


def graph_nodes(loss: Tensor) -> Iterator[Any]:
    """Every autograd node behind ``loss``, each once, without computing anything; a leaf
    (``AccumulateGrad``, with a ``variable``) is yielded but not walked past. The nodes are kept until the
    walk ends, so their Python wrappers stay the same objects while it compares them."""
    seen: set[Any] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        if getattr(node, "variable", None) is None:
            stack.extend(next_node for next_node, _ in node.next_functions)


def graph_dtypes(loss: Tensor) -> set[torch.dtype]:
    """Floating dtypes of every tensor on the autograd graph behind ``loss`` (their gradients' dtypes)."""
    found: set[torch.dtype] = set()
    for node in graph_nodes(loss):
        if getattr(node, "variable", None) is not None:
            continue  # a leaf (AccumulateGrad): its dtype is the parameter's, counted with the parameters
        for meta in getattr(node, "_input_metadata", ()):
            dtype = getattr(meta, "dtype", None)
            if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
                found.add(dtype)
    return found
