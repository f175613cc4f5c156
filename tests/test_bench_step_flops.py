"""``bench/step_flops.py``: a step's matrix-product FLOPs at a full model's depth from two shallow builds.

The script counts a 1-layer and a 2-layer build of each GPU-table model and extrapolates to the full
depth, ``F(1) + (L - 1) (F(2) - F(1))``: exact when every layer adds the same FLOPs. Checked here
against a direct count of a 3-layer build, on the smoke-size models, for both steps. (The split
between ``mm`` and ``bmm`` may move: small layers' products are batched together, as many as fit.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import step_flops  # noqa: E402


@pytest.mark.parametrize("name", ["gpt2", "llama-1b", "llama-1b-lora"])
def test_flops_of_a_deeper_model_are_extrapolated_exactly(name: str) -> None:
    for contender in ("plain", "hush"):
        one, two, three = (step_flops.step_flops(name, contender, n, batch=2, smoke=True) for n in (1, 2, 3))
        assert sum(two.values()) > sum(one.values()) > 0
        extrapolated = step_flops.full_model(one, two, 3)
        assert sum(extrapolated.values()) == sum(three.values()), (name, contender)
