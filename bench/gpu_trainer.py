"""The trainer row of issue 28 on a GPU: ``SecretProtectionTrainer`` against ``Trainer`` at the same B.

    .venv/bin/python bench/gpu_trainer.py [--precisions fp32 bf16] [--steps 20] [--warmup 2]

GPT-2 (12 layers, hidden 768) with a vocabulary of 8192, sequences of 512, micro-batches of 8 and
B = 256: the plain ``Trainer`` takes 32 accumulation steps of 8, the ``SecretProtectionTrainer`` a
Poisson draw of expected size 256 (a fixed ``dp_seed``, so every run draws the same batches) split into
micro-batches of 8 (ghost clipping, noise). Precisions: ``fp32``, and ``bf16`` = ``TrainingArguments(
bf16=True)`` (autocast) for both. Each (precision, contender) runs in a fresh process; a step is timed
from one step's end to the next's (data, forward, backward, clipping, noise, optimizer, callbacks),
CUDA-synchronised, after ``--warmup`` steps (hush_hf's one-time self-check runs in the warm-up).
Reported: the median seconds per optimizer step, peak ``torch.cuda.max_memory_allocated`` over the
timed steps, and both as ratios to ``Trainer``'s. Target (issue 28): at most 1.35x in fp32 and bf16.

Without CUDA it exits at once with a message (status 2); ``bench/step_python_work.py`` is the CPU
counterpart (the per-step Python work, and a host-bound proxy with ``--hidden 8``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_step  # noqa: E402

SIZES = {"hidden": 768, "layers": 12, "vocab": 8192, "seq": 512, "micro": 8, "batch": 256}
SMOKE = {"hidden": 16, "layers": 2, "vocab": 128, "seq": 16, "micro": 2, "batch": 4}
"""The trainer row's sizes, and those of a CPU smoke run of this script (``tests/test_bench_gpu.py``)."""
CONTENDERS = ("plain", "hush")


def measure(contender: str, precision: str, steps: int, warmup: int, smoke: bool = False) -> dict:
    """Seconds per optimizer step and peak allocated memory of ``contender`` in this (fresh) process;
    ``smoke``: the shrunk sizes on the CPU, wall time, no memory figure."""
    import step_overhead
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback


    size = SMOKE if smoke else SIZES
    cuda = not smoke
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=size["vocab"],
        n_positions=size["seq"],
        n_embd=size["hidden"],
        n_layer=size["layers"],
        n_head=max(1, size["hidden"] // 64),
    )
    model = GPT2LMHeadModel(config)
    total = warmup + steps
    rows = size["batch"] * total
    dataset = step_overhead.random_batch(size["vocab"], rows, size["seq"], True)
    seconds: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            now = time.perf_counter()
            if state.global_step == warmup and cuda:
                torch.cuda.reset_peak_memory_stats()
            if state.global_step > warmup:
                seconds.append(now - self.last)
            self.last = now

    common = step_overhead.timed_run_arguments(
        "gpu_trainer_", total, size["micro"], bf16=precision == "bf16", use_cpu=not cuda
    )
    trainer = step_overhead.same_b_trainer(
        contender, model, dataset, size["batch"], size["micro"], total, common, [Clock()]
    )
    trainer.train()
    shutil.rmtree(common["output_dir"], ignore_errors=True)  # nothing was saved in it
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    return {"seconds": seconds, "peak_gib": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    args = gpu_step.parse_measurement_arguments(parser, steps=20)
    gpu_step.require_cuda("gpu_trainer.py", "bench/step_python_work.py")
    import torch

    if args._measure:
        spec = json.loads(args._measure)
        warnings.filterwarnings("ignore")
        print(json.dumps(measure(spec["contender"], spec["precision"], spec["steps"], spec["warmup"])))
        return
    device = torch.cuda.get_device_name()
    sizes = ", ".join(f"{k} {v}" for k, v in SIZES.items())
    timed = f"{args.warmup} warm-up + {args.steps} timed steps"
    print(f"{device}, torch {torch.__version__}; GPT-2 {sizes}; {timed}")
    print("| precision | Trainer | SecretProtectionTrainer |")
    print("|---|---|---|")
    for precision in args.precisions:
        spec = {"precision": precision, "steps": args.steps, "warmup": args.warmup}
        found = {c: gpu_step.isolated(__file__, {**spec, "contender": c}, args.timeout) for c in CONTENDERS}
        plain = found["plain"]
        cells = " | ".join(gpu_step.cell(found[c], plain if c != "plain" else None) for c in CONTENDERS)
        print(f"| {precision} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
