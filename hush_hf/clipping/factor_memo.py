"""Values derived from a factor that several uses share, computed once per step (``FactorMemo``).

One input read by several layers (Llama's q/k/v and gate/up projections) or one output gradient handed
to several (GPT-2's two embeddings: autograd gives both branches of an addition the same tensor) is a
factor of several per-example gradients. Its Gram matrix (for the norms) and its clip-weighted or
widened copy (for the clipped sums) are then the same for every use: computed for the first request,
kept until the last one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from hush_hf.clipping.factors import DenseFactor, Factor, OuterSum, PerExampleGrad, _dense_pair_route, gram


def _factor_key(values: Tensor) -> tuple:
    """Identifies a dense factor's values by memory, layout and version: two detached views of one
    tensor (one input recorded by several layers) have the same key, and so the same values."""
    return (
        values.device,
        values.data_ptr(),
        tuple(values.shape),
        values.stride(),
        values.dtype,
        values._version,
    )


class FactorMemo:
    """Values derived from dense factors that several requests share, each computed once and dropped
    after its last request (see the module docstring). Factors are matched by ``_factor_key``; an entry
    holds its factor, so no other tensor can take that memory while it lives. ``requests``: (kind,
    values) of every request to come (``gram_requests``, ``sum_requests``); one asked for once is not
    kept."""

    def __init__(self, requests: Sequence[tuple[str, Tensor]]) -> None:
        counts: dict[tuple, int] = {}
        for kind, values in requests:
            key = (kind, _factor_key(values))
            counts[key] = counts.get(key, 0) + 1
        self._left = {key: n for key, n in counts.items() if n > 1}
        self._kept: dict[tuple, tuple[Tensor, Tensor]] = {}

    def get(self, kind: str, values: Tensor, compute: Callable[[], Tensor]) -> Tensor:
        """``compute()``, or what it gave for the same kind and factor before."""
        key = (kind, _factor_key(values))
        left = self._left.get(key)
        if left is None:
            return compute()
        if key not in self._kept:
            self._kept[key] = (compute(), values)
        found = self._kept[key][0]
        if left == 1:
            del self._left[key], self._kept[key]
        else:
            self._left[key] = left - 1
        return found

    def gram(self, f: Factor) -> Tensor:
        """``gram(f, f)``, once per shared dense factor."""
        if not isinstance(f, DenseFactor):
            return gram(f, f)
        return self.get("gram", f.values, lambda: gram(f, f))


def gram_requests(uses: Sequence[PerExampleGrad]) -> list[tuple[str, Tensor]]:
    """What the squared norms of ``uses`` (combined; ``squared_norm_of_sum(..., grams=memo)``) ask for:
    each factored use's own Gram matrices."""
    dense = [f for g in uses if isinstance(g, OuterSum) for f in (g.row, g.col) if isinstance(f, DenseFactor)]
    return [("gram", f.values) for f in dense]


def sum_requests(uses: Sequence[PerExampleGrad]) -> list[tuple[str, Tensor]]:
    """What the clipped sums of ``uses`` (``weighted_sum(..., memo=memo)``) ask for: the narrower factor
    clip-weighted in the form its route multiplies (``"pieces"`` or ``"scaled"``; nothing on the
    ``"examples"`` route), and on the ``"scaled"`` route the wider one widened, when it needs widening."""
    requests = []
    for g in uses:
        found = _dense_pair_route(g)
        if found is not None:
            route, narrow, wide, dtype = found
            if route == "examples":  # nothing derived: each example's product reads the factors as they are
                continue
            requests.append((route, narrow))
            if route == "scaled" and wide.dtype != dtype:
                requests.append(("widened", wide))
    return requests
