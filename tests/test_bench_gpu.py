"""The GPU harnesses (``bench/gpu_step.py``, ``bench/gpu_trainer.py``) run their steps on a CPU smoke size.

A GPU is lent to a session only now and then, for minutes: the prepared scripts must run the first
time. These run each contender's step code, as the scripts do on CUDA, on shrunk models.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import gpu_step  # noqa: E402
import gpu_trainer  # noqa: E402


@pytest.fixture(autouse=True)
def process_state_kept():
    """The scripts set process-wide state for their fresh processes (the float32 matmul precision, the
    random seed): put it back for the tests that share this worker."""
    import torch

    precision, rng = torch.get_float32_matmul_precision(), torch.random.get_rng_state()
    yield
    torch.set_float32_matmul_precision(precision)
    torch.random.set_rng_state(rng)


@pytest.mark.parametrize(
    ("name", "precision", "contender"),
    [
        ("gpt2", "fp32", "plain"),
        ("gpt2", "tf32", "hush"),
        ("gpt2-tied", "bf16", "hush"),
        ("llama-1b", "bf16", "hush"),
        ("llama-1b-lora", "bf16", "hush"),
        ("llama-1b-lora-ckpt", "bf16", "hush"),
        ("llama-1b-lora-ckpt", "bf16", "plain"),
    ],
)
def test_gpu_step_runs_each_contender_on_cpu(name: str, precision: str, contender: str) -> None:
    found = gpu_step.measure(name, precision, contender, steps=2, warmup=1, device="cpu", smoke=True)
    assert len(found["seconds"]) == 2 and all(s > 0 for s in found["seconds"])
    assert math.isnan(found["peak_gib"])  # no CUDA memory figure on a CPU


@pytest.mark.parametrize("contender", gpu_trainer.CONTENDERS)
def test_gpu_trainer_times_each_trainer_on_cpu(contender: str) -> None:
    found = gpu_trainer.measure(contender, "fp32", steps=2, warmup=1, smoke=True)
    assert len(found["seconds"]) == 2 and all(s > 0 for s in found["seconds"])


def test_gpu_trainer_runs_the_bf16_hush_step_on_cpu() -> None:
    found = gpu_trainer.measure("hush", "bf16", steps=1, warmup=1, smoke=True)
    assert len(found["seconds"]) == 1


@pytest.mark.parametrize("script", [gpu_step.__file__, gpu_trainer.__file__])
def test_a_failed_process_becomes_a_cell_naming_why(script: str) -> None:
    """Without CUDA each script stops at once; ``isolated`` reports the last line of its error as an
    ``error`` cell instead of failing the table."""
    spec = {"model": "gpt2", "precision": "fp32", "contender": "plain", "steps": 1, "warmup": 0}
    found = gpu_step.isolated(script, spec, timeout=120)
    assert found["failed"] == "error"
    assert f"bench/{Path(script).name} needs a CUDA GPU" in found["message"]
    assert gpu_step.cell(found, None).startswith("error: bench/")
