"""Views taken only when they change something.

A view launches no kernel, but it is still a dispatched operation (a Python call, a trip through the
dispatcher, a new tensor's metadata), and the engine takes one per parameter or per use in several
places where the tensor mostly has the wanted shape already (a bias split out of a flat buffer is
1-D as it is). Like ``float32_products.as_dtype`` for casts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def as_shape(t: Tensor, shape: Sequence[int] | torch.Size) -> Tensor:
    """``t.view(shape)``, or ``t`` itself when it has that shape already."""
    return t if t.shape == tuple(shape) else t.view(shape)


def as_rows(values: Tensor) -> Tensor:
    """(b, *shape) -> (b, prod(shape)): one row per example; a (b, n) tensor (a bias's) as it is."""
    return values if values.dim() == 2 else values.reshape(values.shape[0], -1)
