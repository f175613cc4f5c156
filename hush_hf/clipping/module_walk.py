"""One walk of a model's modules per micro-batch, and what the engine reads from it.

The engine needs, at every forward (a layer checkpointed between micro-batches is seen): the modules
in ``model.modules()`` order, whether some layer re-runs its forward in the backward pass and whether
FSDP2 manages some part of the model; and, at the backward, the trainable parameters of the modules
it walked, in ``named_parameters`` order (``trainable_ids``: a parameter toggled or replaced after the
forward is seen). ``nn.Module.modules()`` goes through ``named_modules``, which builds every
module's dotted name and resumes one generator per level per module, and reading each answer with a
walk of its own took four walks: 4.8 ms per micro-batch for a 16-layer Llama with LoRA (1,337 modules)
on a 2-core CPU. On a GPU a small micro-batch's step is bound by such host work. ``walk_model`` takes
one pass with a plain stack, reading what a class says once per class.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import nn
from torch.distributed.fsdp import FSDPModule

_CHECKPOINT_FLAG = "gradient_checkpointing"
_ABSENT = object()


class ModelWalk(NamedTuple):
    """What one walk of a model read (see the module docstring)."""

    modules: list[nn.Module]
    """Every module once, in ``model.modules()`` order."""
    recomputes: bool
    """Some module may re-run its forward inside the backward pass: transformers'
    ``gradient_checkpointing`` flag (set on its layers by ``gradient_checkpointing_enable()``) or torch's
    ``checkpoint_wrapper``."""
    fsdp: bool
    """FSDP2 (``fully_shard``) manages some module."""


def trainable_ids(modules: list[nn.Module]) -> list[int]:
    """``[id(p) for _, p in model.named_parameters() if p.requires_grad]`` from ``ModelWalk.modules``, read
    now (a parameter toggled or replaced since the walk is seen): each parameter once, in
    ``named_parameters`` order (modules in order, then their own parameters), without building names."""
    seen: set[int] = set()
    ids = []
    for module in modules:
        params = module._parameters
        if params:
            for p in params.values():
                if p is not None and (key := id(p)) not in seen:
                    seen.add(key)
                    if p.requires_grad:
                        ids.append(key)
    return ids


def checkpointing_flag(module: nn.Module) -> bool:
    """``module.gradient_checkpointing is True``, read from the instance, else its class: a flag is never a
    parameter, buffer or submodule, so ``nn.Module.__getattr__`` (slow when the name is missing, as on
    most modules) has nothing to add."""
    value = module.__dict__.get(_CHECKPOINT_FLAG, _ABSENT)
    if value is _ABSENT:
        value = getattr(type(module), _CHECKPOINT_FLAG, False)
        if value is not False and value is not True and hasattr(value, "__get__"):  # a property or other
            # descriptor (a bool is neither, and most modules' default is False): read it as an attribute
            value = getattr(module, _CHECKPOINT_FLAG, False)
    return value is True


def _is_checkpoint_wrapper(cls: type) -> bool:
    """torch's ``CheckpointWrapper``, by name (torch's distributed module is not imported for it), or a
    subclass: FSDP2's ``fully_shard`` swaps a wrapped module's class for ``FSDPCheckpointWrapper``."""
    return any(base.__name__ == "CheckpointWrapper" for base in cls.__mro__)


class ClassKind(NamedTuple):
    wrapper: bool  # torch's CheckpointWrapper (always re-runs its module)
    flagged: bool  # the class (or a base) has a ``gradient_checkpointing`` attribute to read
    fsdp: bool


def class_kind(cls: type) -> ClassKind:
    """What a module's class says, read once per class and walk (not kept across walks: a class attribute
    set later, as by a user's patch, is seen at the next walk). FSDP2 swaps a managed module's class for
    a subclass of ``FSDPModule`` made for it, so a managed module is told by its class."""
    return ClassKind(_is_checkpoint_wrapper(cls), hasattr(cls, _CHECKPOINT_FLAG), issubclass(cls, FSDPModule))


def reruns_forward(module: nn.Module, kind: ClassKind) -> bool:
    """Whether ``module`` (of a class that says ``kind``) may re-run its forward in the backward pass (see
    ``ModelWalk.recomputes``); the flag is read only where the class or the instance has one."""
    flagged = kind.flagged or _CHECKPOINT_FLAG in module.__dict__
    return kind.wrapper or (flagged and checkpointing_flag(module))


def walk_model(model: nn.Module) -> ModelWalk:
    """``model``'s modules with what the engine reads from them, in one pass (see ``ModelWalk``)."""
    modules: list[nn.Module] = []
    seen_modules: set[int] = set()
    kinds: dict[type, ClassKind] = {}
    recomputes = fsdp = False
    stack = [model]
    while stack:
        module = stack.pop()
        key = id(module)
        if module is None or key in seen_modules:
            continue
        seen_modules.add(key)
        modules.append(module)
        cls = module.__class__
        kind = kinds[cls] if cls in kinds else kinds.setdefault(cls, class_kind(cls))
        fsdp = fsdp or kind.fsdp
        if not recomputes:  # ``reruns_forward``, inline: this runs for every module of every micro-batch
            flagged = kind.flagged or _CHECKPOINT_FLAG in module.__dict__
            recomputes = kind.wrapper or (flagged and checkpointing_flag(module))
        children = module._modules
        if children:  # depth first: the first child on top (a child met again is skipped when popped)
            stack.extend(reversed(children.values()))
    return ModelWalk(modules, recomputes, fsdp)
