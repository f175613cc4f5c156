"""The engine's module walk is ``list(model.modules())``: same modules, same order, each once."""

from __future__ import annotations

import pytest
from torch import nn

from hush_hf.clipping.module_walk import modules_in_order
from tests.model_families import FAMILIES


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_walks_like_modules(family) -> None:
    model = family.build(family.ties[0])
    assert modules_in_order(model) == list(model.modules())


def test_shared_and_missing_children_walk_like_modules() -> None:
    shared = nn.Linear(2, 2)
    inner = nn.Sequential(nn.Linear(2, 2), shared)
    model = nn.Sequential(shared, inner, nn.ModuleList([inner, nn.ReLU()]))
    model.register_module("absent", None)
    model.add_module("again", shared)
    walked = modules_in_order(model)
    assert walked == list(model.modules())
    assert len({id(m) for m in walked}) == len(walked) == 6  # root, shared, inner, its Linear, list, ReLU
