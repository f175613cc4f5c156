"""A buffer the training forward writes is refused: it would be published without noise.

DP-SGD covers what is computed from the clipped, noised gradients (Hush Alg. 2). A buffer that a
layer's forward writes in training (BatchNorm's running mean and variance, a running statistic or a
counter kept by a custom layer) is a function of the examples drawn, neither clipped nor noised; it
is saved with the weights (``state_dict``) and read by the later steps' forwards, so it carries the
examples past the noise. Known stat-tracking layers (batch norm, instance norm with
``track_running_stats``) are refused when the trainer is built (:mod:`hush_hf.clipping.layer_calls`);
every other layer is caught here, by what its forward does:

- at the first step of a run, before any gradient, one training-mode forward of the independence
  check's rows (:mod:`hush_hf.trainer.independence`; the same rows on every rank) is compared with
  the buffers before it (:func:`written_buffers`: a buffer replaced, written in place, changed in
  value, added or removed), and the buffers are then restored, so those rows leave no trace;
- every step's forwards are compared the same way, by tensor object and version counter (no copy),
  before the optimizer step.

Buffers no forward writes (GPT-2's causal mask, rotary ``inv_freq``, BERT's ``position_ids``) pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class BufferState:
    """Every buffer of a module: its tensor object, version counter and (``values``) a copy."""

    tensors: dict[str, Tensor]
    versions: dict[str, int | None]  # None: an inference tensor (no version counter)
    values: dict[str, Tensor] | None


def _version(tensor: Tensor) -> int | None:
    try:
        return int(tensor._version)
    except RuntimeError:  # an inference tensor tracks no version
        return None


def buffer_state(module: nn.Module, *, values: bool) -> BufferState:
    """The buffers of ``module`` now; ``values``: with a copy of each (for a value comparison)."""
    tensors = dict(module.named_buffers())
    return BufferState(
        tensors=tensors,
        versions={name: _version(t) for name, t in tensors.items()},
        values={name: t.detach().clone() for name, t in tensors.items()} if values else None,
    )


def _same_values(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def written_buffers(module: nn.Module, before: BufferState) -> list[str]:
    """Names of the buffers of ``module`` written since ``before``: replaced by another tensor, written in
    place (version counter moved), changed in value (when ``before`` holds values), added or removed."""
    now = dict(module.named_buffers())
    written = []
    for name in sorted(set(now) | set(before.tensors)):
        tensor, old = now.get(name), before.tensors.get(name)
        if tensor is None or old is None or tensor is not old or _version(tensor) != before.versions[name]:
            written.append(name)
        elif before.values is not None and not _same_values(tensor, before.values[name]):
            written.append(name)  # e.g. through ``.data``, which the version counter does not see
    return written


def restore_buffers_(module: nn.Module, before: BufferState) -> None:
    """Put every buffer of ``before`` back (object and, when ``before`` holds them, values); buffers
    added since are removed."""
    for name in set(dict(module.named_buffers())) - set(before.tensors):
        owner, _, leaf = name.rpartition(".")
        del module.get_submodule(owner)._buffers[leaf]
    with torch.no_grad():
        for name, tensor in before.tensors.items():
            owner, _, leaf = name.rpartition(".")
            module.get_submodule(owner)._buffers[leaf] = tensor
            if before.values is not None and not _same_values(tensor, before.values[name]):
                tensor.copy_(before.values[name])


def buffer_write_error(module: nn.Module, written: list[str]) -> str:
    """The one-line refusal naming the first written buffer's layer (path and class) and buffer."""
    if not written:
        return "a layer writes a buffer in the training forward on another rank (see that rank's error)"
    owner, _, leaf = written[0].rpartition(".")
    layer = f"'{owner or '<root>'}' ({type(module.get_submodule(owner)).__name__})"
    others = f" (and {len(written) - 1} more: {', '.join(written[1:4])})" if len(written) > 1 else ""
    return (
        f"layer {layer} writes its buffer '{leaf}' in the training forward{others}: buffers are saved with "
        "the weights and read by later steps without clipping or noise, so it would publish a statistic of "
        "the drawn examples. Not supported with DP training: make the layer keep no state in its training "
        "forward (e.g. GroupNorm or LayerNorm instead of batch norm, track_running_stats=False for instance "
        "norm)"
    )
