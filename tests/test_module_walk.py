"""The engine's one walk per micro-batch reads what four walks read before: ``list(model.modules())``
(same modules, same order, each once), whether a layer re-runs its forward in the backward pass, and
whether FSDP2 manages a module; the trainable parameters, in ``named_parameters`` order, are read from
its modules at the backward."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import FSDPModule

from hush_hf.clipping.module_walk import trainable_ids, walk_model
from hush_hf.clipping.recompute import checkpointed_segments
from tests.model_families import FAMILIES


def _reference_trainable_ids(model: nn.Module) -> list[int]:
    return [id(p) for _, p in model.named_parameters() if p.requires_grad]


def _reference_recomputes(model: nn.Module) -> bool:
    return any(
        getattr(m, "gradient_checkpointing", False) is True or type(m).__name__ == "CheckpointWrapper"
        for m in model.modules()
    )


def _reference_segments(model: nn.Module) -> list[nn.Module]:
    """The flagged modules (by name) with no flagged module inside them: the names' prefixes."""
    flagged = {
        name: m
        for name, m in model.named_modules()
        if getattr(m, "gradient_checkpointing", False) is True or type(m).__name__ == "CheckpointWrapper"
    }
    outer = {n for n in flagged for other in flagged if other != n and (not n or other.startswith(f"{n}."))}
    return [m for name, m in flagged.items() if name not in outer]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_walks_like_modules_and_named_parameters(family) -> None:
    model = family.build(family.ties[0])
    walk = walk_model(model)
    assert walk.modules == list(model.modules())
    assert trainable_ids(walk.modules) == _reference_trainable_ids(model)
    assert walk.recomputes is False and walk.fsdp is False
    if hasattr(model, "gradient_checkpointing_enable") and model.supports_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        assert walk_model(model).recomputes is True is _reference_recomputes(model)
        segments, within = checkpointed_segments(model)
        assert segments == _reference_segments(model) and len(segments) >= 2
        # Every module inside a segment maps to it; one shared by several (VeRA's projections) to the first
        # (its bytes only size the kept calls' budget).
        reference: dict[int, list[int]] = {}
        for k, segment in enumerate(segments):
            for m in segment.modules():
                reference.setdefault(id(m), []).append(k)
        assert within == {key: ks[0] for key, ks in reference.items()}


def test_shared_and_missing_children_walk_like_modules() -> None:
    shared = nn.Linear(2, 2)
    inner = nn.Sequential(nn.Linear(2, 2), shared)
    model = nn.Sequential(shared, inner, nn.ModuleList([inner, nn.ReLU()]))
    model.register_module("absent", None)
    model.add_module("again", shared)
    walked = walk_model(model).modules
    assert walked == list(model.modules())
    assert len({id(m) for m in walked}) == len(walked) == 6  # root, shared, inner, its Linear, list, ReLU


def test_shared_frozen_and_missing_parameters_in_named_parameters_order() -> None:
    shared = nn.Parameter(torch.ones(2))
    first, second = nn.Linear(2, 3), nn.Linear(3, 2)
    second.register_parameter("tied", shared)
    first.register_parameter("tied", shared)  # met first here: counted here, once
    second.bias.requires_grad_(False)
    second.register_parameter("absent", None)
    model = nn.Sequential(first, nn.ReLU(), second)
    walk = walk_model(model)
    before = trainable_ids(walk.modules)
    assert before == _reference_trainable_ids(model)
    assert len(before) == 4  # first's weight, bias and tied; second's weight (bias frozen)
    first.weight.requires_grad_(False)  # toggled after the walk: read at the check, from the same walk
    assert trainable_ids(walk.modules) == _reference_trainable_ids(model) != before


def test_checkpointing_read_from_flags_and_wrappers_at_every_walk() -> None:
    class Layer(nn.Linear):
        gradient_checkpointing = False  # a class default, as transformers' checkpointable layers

    class Flagged(nn.Linear):
        @property
        def gradient_checkpointing(self) -> bool:  # a descriptor is read on the instance
            return self.in_features == 5

    layer = Layer(2, 2)
    model = nn.Sequential(layer, nn.Sequential(Flagged(2, 2)))
    assert walk_model(model).recomputes is False  # the per-class answers are cached from here on
    layer.gradient_checkpointing = True
    assert walk_model(model).recomputes is True
    layer.gradient_checkpointing = False
    model[1].add_module("five", Flagged(5, 2))
    assert walk_model(model).recomputes is True
    plain = nn.Sequential(nn.Linear(2, 2))
    plain[0].gradient_checkpointing = True  # an instance flag on a class without one
    assert walk_model(plain).recomputes is True
    assert walk_model(nn.Sequential(checkpoint_wrapper(nn.Linear(2, 2)))).recomputes is True

    class Later(nn.Linear):
        pass

    later = nn.Sequential(Later(2, 2))
    assert walk_model(later).recomputes is False
    Later.gradient_checkpointing = True  # a class flag set after a walk (a user's patch): seen at the next
    assert walk_model(later).recomputes is True


def test_a_module_whose_class_fsdp2_swapped_is_seen() -> None:
    # fully_shard swaps a managed module's class for a subclass of FSDPModule and of its own class.
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    assert walk_model(model).fsdp is False
    model[1].__class__ = type("FSDPLinear", (FSDPModule, nn.Linear), {})
    assert walk_model(model).fsdp is True


def test_a_checkpoint_wrapper_that_fsdp2_swapped_still_recomputes() -> None:
    """After ``fully_shard`` a ``checkpoint_wrapper``'s class is ``FSDPCheckpointWrapper``: still seen as
    re-running its forward, so that FSDP2 with checkpointing is refused as it should be."""
    wrapped = checkpoint_wrapper(nn.Linear(2, 2))
    wrapped.__class__ = type("FSDPCheckpointWrapper", (FSDPModule, type(wrapped)), {})
    walk = walk_model(nn.Sequential(wrapped))
    assert walk.recomputes is True and walk.fsdp is True
    assert checkpointed_segments(nn.Sequential(wrapped))[0] == [wrapped]
