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


def test_gpu_step_profiles_one_more_step() -> None:
    found = gpu_step.measure(
        "gpt2", "bf16", "hush", steps=1, warmup=1, device="cpu", smoke=True, profile=True
    )
    lines = found["profile"].splitlines()
    assert lines[0].startswith("kernels launched: 0;")  # no CUDA on this machine
    counts = dict(item.rsplit(" ", 1) for item in lines[1].removeprefix("calls: ").split(", "))
    assert set(counts) == set(gpu_step.PROFILED_OPS) and int(counts["aten::mm"]) > 0
    assert "Self CPU" in found["profile"]


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


def test_gpu_exactness_rows_run_on_cpu() -> None:
    """The GPU exactness script's row on the CPU: float64 norms and sums at rounding level against its
    torch.func reference, every example within C, and no CUDA-route call off CUDA."""
    import gpu_exactness

    (case,) = [c for c in gpu_exactness.cases() if c[0] == "GPT-2, tiny"]
    row = gpu_exactness.one_case(*case, "float64", device="cpu")
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:2] == ["GPT-2, tiny", "float64"]
    assert float(cells[2]) < 1e-12 and float(cells[3]) < 1e-12
    assert float(cells[4]) <= 1.0 and cells[5] == "0 calls"


def test_gpu_exactness_times_the_grouped_norm_on_cpu() -> None:
    """The kept gradient's norm line runs on the CPU at a small size: the grouped route within its bound."""
    import re

    import gpu_exactness

    line = gpu_exactness.grouped_norm_line("cpu", batch=4, width=8 * 1000 + 3)
    error, bound = (float(x) for x in re.search(r"relative error (\S+) \(bound (\S+)\)", line).groups())
    assert bound == pytest.approx(11.1 * 2.0**-24, rel=1e-2) and error <= bound
    assert "single route" in line


def test_gpu_exactness_compares_the_two_bf16_sum_routes_on_cpu(monkeypatch) -> None:
    """The bf16 clipped-sum line runs on the CPU at a small size (CUDA's ``addmm`` emulated by widening its
    bf16 operands): both routes, and the per-example one without its aligned copy, within float32
    rounding of float64."""
    import re

    import gpu_exactness
    import torch

    import hush_hf.clipping.float32_products as products

    def widened(out, a, b, alpha, beta):
        return torch.addmm(out, a.float(), b.float(), beta=beta, alpha=alpha, out=out)

    monkeypatch.setattr(products, "_addmm_out_float32", widened)
    line = gpu_exactness.per_example_line("cpu", batch=3, steps=8, n=5, m=7)
    errors = [float(e) for e in re.findall(r"relative error (\S+?)[;.]\s", line + " ")]
    assert "one GEMM per example" in line and "two pieces" in line and "rows as they are" in line  # 5 % 8
    assert len(errors) == 3 and max(errors) < 1e-6


def test_gpu_exactness_plants_a_misuse_that_tf32_still_catches_on_cpu() -> None:
    import gpu_exactness

    line = gpu_exactness.planted_misuse_under_tf32("cpu")
    assert "misuse is refused;" in line and "without it passes" in line
