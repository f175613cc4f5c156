"""The weights a DP run left, remembered so that weights changed after it are never published as trained.

The card and the plan's training record state the sigma and DP steps of the run, and the SHA-256 of the
files the save writes. Those digests bind the card to the files, not the files to the run: weights changed
between the last DP step and ``save_model``/``push_to_hub`` (other weights loaded with ``load_state_dict``, a
few plain optimizer steps on the private data, a callback's ``on_train_end`` editing them, an adapter merged
into its base, new embedding rows) would be hashed and certified as if DP training had produced them.

So when a run ends (its ``on_train_end``, before any other callback's; or where it raised) every tensor of the
model's ``state_dict`` is remembered by identity, version counter (every in-place write moves it) and a
fingerprint of its bytes (writes through ``.data`` leave the version counter alone): read as 8-, 16- or 32-bit
integer words b_i, the exact integer sums of b_i and of b_i * (i mod 251 + 1) (:func:`bit_sums`). Integer sums
are exact and independent of the order they are added in, so the same values on another device give the same
fingerprint, while any changed word changes the first sum and most moves of values change the second. A final
save compares. Under FSDP2 each rank compares its own shard.

Within a run, the trainable parameters' version counters are read right after each optimizer step (the
callback's ``on_optimizer_step``, first in line) and compared at the next DP step and when the run ends: a
write between steps (a callback's plain update) stops the run, and its weights are never published.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

POSITION_PERIOD = 251  # the word weights i mod 251 + 1 (a prime: a row or column move rarely keeps them)
_CHUNK = 1 << 22  # words summed at once: each sum of b_i * weight stays below 2^31 * 2^8 * 2^22 < 2^63
_WORDS = {1: torch.int8, 2: torch.int16}  # other element sizes are read as 32-bit words


@dataclass(frozen=True)
class TensorMark:
    """What is remembered of one tensor (never the values themselves)."""

    ref: weakref.ref
    version: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    sums: tuple[int, int]


def _local(tensor: Tensor) -> Tensor:
    """This rank's shard of a DTensor (FSDP2), the tensor itself otherwise."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


@torch.no_grad()
def bit_sums(tensor: Tensor) -> tuple[int, int]:
    """(sum b_i, sum b_i * (i mod 251 + 1)) over the tensor's bytes read as signed integer words b_i, exact
    (int64 per chunk of ``_CHUNK`` words, chunks added as Python integers); (0, 0) for a meta tensor."""
    local = _local(tensor).detach()
    if local.device.type == "meta" or local.numel() == 0:
        return 0, 0
    words = local.contiguous().reshape(-1).view(_WORDS.get(local.element_size(), torch.int32))
    plain = positional = 0
    for start in range(0, words.numel(), _CHUNK):
        chunk = words[start:start + _CHUNK].to(torch.int64)
        weight = (torch.arange(start, start + chunk.numel(), device=chunk.device) % POSITION_PERIOD) + 1
        plain += int(chunk.sum())
        positional += int((chunk * weight).sum())
    return plain, positional


def _mark(tensor: Tensor) -> TensorMark:
    shape = tuple(tensor.shape)
    return TensorMark(weakref.ref(tensor), tensor._version, shape, tensor.dtype, bit_sums(tensor))


@dataclass(frozen=True)
class TrainedWeights:
    """The model's state_dict tensors as a DP run left them (:meth:`of`), and :meth:`check` against them;
    ``refusal``: why the run's weights cannot be published at all (:func:`written_between_steps`)."""

    marks: dict[str, TensorMark]
    refusal: str | None = None

    @classmethod
    def of(cls, model: nn.Module) -> TrainedWeights:
        return cls({name: _mark(t) for name, t in model.state_dict(keep_vars=True).items()})

    def first_change(self, model: nn.Module) -> str | None:
        """The first state_dict entry of ``model`` not as the run left it, and how (None: all are)."""
        now = model.state_dict(keep_vars=True)
        for name in sorted(set(self.marks) - set(now)):
            return f"'{name}' was removed"
        for name in sorted(set(now) - set(self.marks)):
            return f"'{name}' was added"
        for name, tensor in now.items():
            mark = self.marks[name]
            if mark.ref() is not tensor:
                return f"'{name}' was replaced by another tensor"
            if (tuple(tensor.shape), tensor.dtype) != (mark.shape, mark.dtype):
                return f"'{name}' changed shape or dtype"
            if tensor._version != mark.version:
                return f"'{name}' was written in place"
            if bit_sums(tensor) != mark.sums:
                return f"'{name}' holds other values"
        return None

    def check(self, model: nn.Module, what: str) -> None:
        """ValueError (one line) if ``model`` is not as the run left it; ``what``: the publishing call."""
        if self.refusal is not None:
            raise ValueError(f"{what}: {self.refusal}")
        change = self.first_change(model)
        if change is not None:
            raise ValueError(
                f"{what}: the model's weights changed after DP training ended (state_dict entry {change}), "
                "so the card and the plan's training record would certify weights the DP run did not "
                "produce; save or push the weights exactly as training left them (before merging adapters, "
                "resizing embeddings, loading other weights or training further), or train them in a DP run"
            )


def remember(model: Any) -> TrainedWeights | None:
    """:meth:`TrainedWeights.of` ``model`` (None for no model)."""
    return TrainedWeights.of(model) if isinstance(model, nn.Module) else None


# ----------------------------------------------------------------------------- writes between DP steps
def versions(params: list[Tensor]) -> list[int]:
    """The version counters of ``params`` (each in-place write, the optimizer's included, moves one)."""
    return [p._version for p in params]


def written_between_steps(model: nn.Module, params: list[Tensor], recorded: list[int] | None,
                          step: int) -> str | None:
    """Why ``model`` cannot be published if a trainable parameter was written in place since ``recorded``
    (:func:`versions` right after DP step ``step``'s optimizer step, before any other callback ran): by a
    callback's ``on_optimizer_step``/``on_step_end``/``on_step_begin``, outside the DP step, so the training
    record (sigma, DP steps) would not describe the weights. None when nothing was written (or nothing
    recorded yet)."""
    if recorded is None:
        return None
    moved = [p for p, version in zip(params, recorded, strict=True) if p._version != version]
    if not moved:
        return None
    names = {id(p): name for name, p in model.named_parameters()}
    name = names.get(id(moved[0]), "(unnamed)")
    return (f"trainable parameter '{name}' was written in place after DP step {step} and before the next "
            "(by a callback, outside the DP step), so the training record would not describe the weights; "
            "only the DP step may change them: remove that write, or run it after saving")
