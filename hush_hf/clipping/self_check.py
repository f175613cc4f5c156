"""The ghost-clipping engine's first-call self-check: autograd's own gradient of the loss, for every
trainable parameter, must equal the clipped sum rebuilt from the recorded factors (with all clip
coefficients 1), within a tolerance that follows the precision in force (:mod:`hush_hf.clipping.precision`).
A parameter read outside the call its rule saw (so that part of its gradient is missing from the rebuilt
one, and would be missing from the update) is refused.

A mixin of :class:`hush_hf.clipping.ghost.GhostClipper`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hush_hf.clipping import precision
from hush_hf.clipping.layer_calls import _Pass
from hush_hf.clipping.registry import (
    UnsupportedLayerError,
)


class SelfCheck:
    """Self-check side of :class:`~hush_hf.clipping.ghost.GhostClipper` (see the module docstring)."""

    def _autograd_grads(
        self, loss: Tensor, result: _Pass, names: set[str], *, retain_graph: bool
    ) -> dict[str, Tensor | None]:
        """Autograd's gradient of ``loss`` for the parameters ``names``: w.r.t. the tensors the forward
        used (FSDP2: the unsharded parameters), or the registered one for a layer that never ran."""
        keys, tensors = [], []
        for name, p in self._params:
            if name in names:
                for t in result.used.get(name, [p]):
                    keys.append(name)
                    tensors.append(t)
        got = torch.autograd.grad(loss, tensors, retain_graph=retain_graph, allow_unused=True)
        out: dict[str, Tensor | None] = {}
        for name, g in zip(keys, got, strict=True):
            if g is not None:
                out[name] = g if out.get(name) is None else out[name] + g
            else:
                out.setdefault(name, None)
        return out

    def _rebuild(self, result: _Pass, coef: Tensor) -> dict[str, Tensor]:
        """``sum_i coef_i G_{i,p}`` from the recorded factors, for every parameter with a recorded use.

        Built before the check's backward and the factors freed at once, so the check holds one extra
        gradient-sized copy rather than every layer's output gradient (the logits' included).
        """
        rebuilt: dict[str, Tensor] = result.packed.weighted_sums(coef) if result.packed is not None else {}
        for name, p in self._params:
            uses = result.uses.pop(name, [])
            if uses:
                rebuilt[name] = self._clipped_sum(p, uses, coef)
        result.uses.clear()
        return rebuilt

    def _self_check(
        self,
        result: _Pass,
        coef: Tensor,
        rebuilt: dict[str, Tensor],
        added: dict[str, Tensor | None],
        names: set[str],
    ) -> None:
        """Refuse when the gradient autograd computes differs from the one the norms were taken of.

        ``added[name]`` is the gradient of ``sum_i coef_i loss_i`` that autograd gives the parameter;
        ``rebuilt[name] = sum_i coef_i G_{i,p}`` comes from the recorded factors (``_rebuild``, with
        ``factors.weighted_sum``: a parameter-sized product, no per-example gradient is formed). They
        agree (to rounding) exactly when every use of every trainable parameter went through a hooked
        call whose rule is right.
        A parameter read directly -- ``h @ self.wte.weight.T``, ``F.linear(x, mod.weight)``,
        an embedding's ``weight`` read as a whole table -- gets gradient that no norm counted, so its example
        would be under-clipped: that is refused, naming the parameter. The tolerance is relative to
        ``sum_i ||c_i g_i||`` (the scale of the whole clipped gradient, so that parameters whose
        gradient is zero in exact arithmetic, e.g. attention key biases, do not trip it on rounding
        noise), per parameter and over the checked parameters together: 1e-4 in float32 and wider,
        2^-4 under bf16/fp16 (where autograd and the rebuilt sum round apart by ~1%), so with bf16 only a
        direct use carrying more than ~6% of the gradient is seen; 2^-6 for float32 with TF32 (or bf16)
        matrix products in force (``precision.check_rtol``); run the first step in float32 with
        ``torch.set_float32_matmul_precision("highest")`` for the sharpest check.
        A parameter that the loss reaches although no hooked call of it recorded a use
        (its layer never ran, or a ``ParameterDict`` read by a module with no rule) is refused whatever
        its gradient, zero included: the structural half of the check.

        Which calls check which parameters (``names``): every not-yet-verified parameter the loss reaches.
        A parameter is verified by the first check that finds its autograd gradient nonzero and matching;
        one whose gradient is zero in that call (the batch does not touch it: a token that does not
        occur, an expert no token is routed to) stays unverified and is checked again at the next call
        that reaches it. So no parameter goes unverified because of what the first micro-batch holds.
        What this cannot see: a direct use whose gradient is zero or below the tolerance in every call
        that reaches the parameter after it was verified (a branch taken only later). That use would be
        missing from the update, never applied unclipped (the update is built from the factors).

        Why a gradient comparison and not a check of how the forward reads parameters (e.g. a
        ``TorchFunctionMode`` that flags parameters used outside their module's call): it sees every
        use, including ones outside the model's forward (a loss computed from ``model.lm_head.weight``)
        and rule bugs, and has no false alarms on harmless reads (``weight.dtype``, ``.shape``).
        """
        total = float((coef.to(torch.float64) * result.norms).sum())
        reduced = precision.low_precision_step(result.dtype, result.device_type)
        rtol = precision.check_rtol(result.dtype, result.device_type)
        gaps: list[tuple[str, float, bool, bool]] = []  # (name, gap, recorded, reached)
        for name, p in self._params:
            if name not in names:
                continue
            mine, got = rebuilt.get(name), added.get(name)
            recorded = name in result.recorded
            if got is None:
                gap = float(mine.norm()) if mine is not None else 0.0
            else:
                got = got.to(torch.promote_types(p.dtype, torch.float32))
                gap = float((got - mine).norm() if mine is not None else got.norm())
            gaps.append((name, gap, recorded, got is not None))
        overall = math.sqrt(sum(gap**2 for _, gap, _, _ in gaps))
        # A parameter with no recorded use has, by the record, no gradient: reaching it is a direct use.
        bad = [(n, rec) for n, gap, rec, reached in gaps if (not gap <= rtol * total if rec else reached)]
        if not bad and not overall <= rtol * total:
            worst = max(gaps, key=lambda item: item[1])
            bad = [(worst[0], worst[2])]
        if bad:
            self._refuse(bad, reduced)
        if self._fsdp_managed():
            if total > 0:
                self._unverified.clear()  # all at once (see _names_to_check)
            return
        for name, _, recorded, reached in gaps:
            got = added.get(name)
            if recorded and reached and got is not None and bool(got.ne(0).any()):
                self._unverified.discard(name)

    @staticmethod
    def _refuse(bad: list[tuple[str, bool]], reduced: bool) -> None:
        """The self-check's error: parameter names only (the size of a gap is a statistic of the batch)."""
        unrecorded = [n for n, rec in bad if not rec]
        listed = ", ".join(f"'{n}'" for n, _ in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        hint = (
            f" ({', '.join(repr(n) for n in unrecorded[:5])} reached by the loss although no call of the "
            "layer owning it ran)"
            if unrecorded
            else ""
        )
        raise UnsupportedLayerError(
            f"self-check failed: the gradient autograd adds to trainable parameter(s) {listed}{more} "
            f"differs from the per-example gradients the clip norms were computed from{hint}. Most "
            "likely the parameter is used outside its module's forward (read directly, e.g. "
            "`h @ module.weight.T`, `F.linear(x, module.weight)` or a relative-position table "
            "`module.weight`), so that use is missing from the per-example norm and clipping would "
            "not bound it by C; call the owning module instead, freeze the parameter, or register a "
            "rule for the layer that uses it"
            + (
                "; under bf16/fp16 or TF32 matrix products it can also mean unusually large rounding: "
                "check the same model in float32 with torch.set_float32_matmul_precision('highest')"
                if reduced
                else "; less likely, low-precision arithmetic inside the model (rounding beyond 1e-4)"
            )
        )

    # ----------------------------------------------------------------------------- lifecycle
