"""What a checkpointed LoRA step dispatches, counted as a GPU would run it (``bench/op_census.py``).

Under gradient checkpointing the DP step ran two recomputing backward passes (norms, then clipped sums)
where the plain step runs one; an H200 ran Llama-1B with LoRA and checkpointing at 3.6x the plain step.
The adapters' per-example gradients are held materialised by the norm pass and fit its budget, so the
sum pass is not run at all: the step dispatches about what the plain step does plus the per-example
work. Counts are deterministic (no timing).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import op_census  # noqa: E402


def test_a_checkpointed_lora_step_dispatches_at_most_one_and_a_half_plain_steps() -> None:
    shape = dict(batch=2, seq=128, warmup=2, checkpointing=True)  # 4 layers, rank 16: 2 L r <= T
    plain = op_census.census("llama-lora", torch.bfloat16, "plain", **shape).summary()
    hush = op_census.census("llama-lora", torch.bfloat16, "hush", cuda=True, **shape).summary()
    assert hush["kernels (CUDA)"] <= 1.5 * plain["kernels"]  # was 2.14x: a second backward pass
    assert hush["casts (CUDA)"] <= 2 * plain["casts"]  # the bound for a bf16 model (was 3.34x)
    assert hush["syncs"] <= plain["syncs"] + 3  # the labels' check, the losses' and the norms' finiteness


def test_a_step_under_bf16_autocast_dispatches_at_most_one_and_a_half_plain_steps() -> None:
    """``Trainer(bf16=True)``: float32 weights, the forward under autocast. The engine gets bf16 factors
    of float32 weights (autocast's copies) and takes the CUDA routes with them; the step was never timed
    on a GPU after its fix (``tests/test_gradient_layout.py``), so its dispatches are held here."""
    shape = dict(batch=2, seq=32, warmup=2, autocast=True)
    for family in ("gpt2", "llama"):
        plain = op_census.census(family, torch.float32, "plain", **shape).summary()
        hush = op_census.census(family, torch.float32, "hush", cuda=True, **shape).summary()
        assert plain["casts"] > 0  # autocast ran: its bf16 copies of the weights are casts
        assert hush["kernels (CUDA)"] <= 1.5 * plain["kernels"], family
        assert hush["casts (CUDA)"] <= 2 * plain["casts"], family
