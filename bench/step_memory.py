"""Peak memory of one training step on this CPU: plain step against the DP step, at the GPU table's widths.

    .venv/bin/python bench/step_memory.py [--models gpt2 llama-1b] [--layers 12] [--batch 4]

What ``torch.cuda.max_memory_allocated`` measures on a GPU, approximated on a CPU (Linux only): each
contender runs in a fresh process whose allocator returns every freed block of 64 KiB or more to the
system at once (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``), so that the resident set follows
the tensors alive. After two steps (optimizer state allocated, hush_hf's self-check run) the peak resident
set is reset (``/proc/self/clear_refs``) and one more step runs (``op_census.step_of``: forward,
backward, clipping, noise, AdamW); printed: the peak over that step (``VmHWM``), and the resident set
before it. Models of ``bench/gpu_step.py`` with ``--layers`` layers, float32, sequences of the GPU table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
"""glibc: every block of 64 KiB or more is its own mapping, unmapped when freed (a fixed threshold also
stops glibc from raising it after the first large free, which would keep freed tensors resident)."""


def resident_mib(key: str) -> int:
    """``/proc/self/status``'s ``key`` (``VmRSS``, ``VmHWM``) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) // 1024
    raise RuntimeError(f"no {key} in /proc/self/status: Linux only")


def measure(name: str, contender: str, layers: int, batch: int) -> tuple[int, int]:
    """(peak MiB over one step, MiB resident before it), in this process."""
    import gpu_step
    import op_census
    import torch

    family, tied, _, seq, lora, _ = gpu_step.MODELS[name]
    torch.manual_seed(0)
    model, causal = gpu_step.build_model(family, tied, seq, lora, "cpu", False, layers)
    step = op_census.step_of(model.train(), causal, contender, batch, seq)
    step(0)
    step(1)
    before = resident_mib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from here
    step(2)
    return resident_mib("VmHWM"), before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    names = ["gpt2", "gpt2-tied", "llama-1b", "llama-1b-lora"]
    parser.add_argument("--models", nargs="+", default=["gpt2"], choices=names)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "CONTENDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.child:
        peak, before = measure(*args.child, args.layers, args.batch)
        print(peak, before)
        return
    print(f"peak resident MiB over one step, float32, {args.layers} layers, batch {args.batch}")
    print("| model | plain: peak (before) | hush_hf: peak (before) | peak ratio |")
    print("|---|---|---|---|")
    for name in args.models:
        found = {}
        for contender in ("plain", "hush"):
            command = [sys.executable, __file__, "--child", name, contender]
            command += ["--layers", str(args.layers), "--batch", str(args.batch)]
            out = subprocess.run(
                command, env={**os.environ, **ALLOCATOR}, capture_output=True, text=True, check=True
            )
            found[contender] = tuple(int(v) for v in out.stdout.split()[-2:])
        (p_peak, p_before), (h_peak, h_before) = found["plain"], found["hush"]
        ratio = h_peak / p_peak
        print(f"| {name} | {p_peak} ({p_before}) | {h_peak} ({h_before}) | {ratio:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
