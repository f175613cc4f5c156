"""The trainer's per-step Python work: SecretProtectionTrainer against Trainer at the same B.

    .venv/bin/python bench/step_python_work.py [--bf16] [--layers 12] [--hidden 64] [--steps 6]

On a GPU a small DP step is bound by what the host does per step (Python calls, kernel launches), not by
arithmetic; on a shared CPU its wall time is too noisy to compare small changes. This counts what is
deterministic instead (hush_hf with a fixed ``dp_seed``, so that every run draws the same batches): the
Python function calls (cProfile's count, builtins included) and the ``Tensor.to`` calls of one optimizer
step, after 2 warm-up steps, for a plain ``transformers.Trainer`` (B = 64 by 8 accumulation steps of 8)
and a ``SecretProtectionTrainer`` drawing B = 64 in expectation (Poisson sampling, micro-batches of 8;
ghost clipping, noise), both training the same GPT-2 (``--hidden``, ``--layers`` layers, vocabulary 512,
sequences of 32) for the same steps. Counted inside ``Trainer.training_step`` for plain, ``DPStep.run``
and ``DPStep.privatize`` for hush_hf (the step's forward, backward, clipping and noise; the optimizer
and data loading left out of both). Also printed: CPU seconds of a whole optimizer step (one step's end
to the next's: data, step, optimizer, callbacks; median and fastest), in a second run without the
profiler. With a
small ``--hidden`` (8) the arithmetic is negligible and this is a host-bound proxy; on a shared CPU it is
for orientation only.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

B, MICRO, SEQ, VOCAB, WARMUP = 64, 8, 32, 512, 2


def profiled(owner: type, name: str, profile: cProfile.Profile, active: list[bool]) -> None:
    """Wrap ``owner.name`` so that its calls (not nested ones twice) run under ``profile``."""
    original = getattr(owner, name)

    def wrapper(self, *args, **kwargs):
        if active[0]:
            return original(self, *args, **kwargs)
        active[0] = True
        profile.enable()
        try:
            return original(self, *args, **kwargs)
        finally:
            profile.disable()
            active[0] = False

    setattr(owner, name, wrapper)


def run(
    contender: str, bf16: bool, layers: int, hidden: int, steps: int, timed: bool, dump: str | None = None
) -> dict[str, float]:
    """Counts (``timed`` False) or times (True) one contender's steps after the warm-up."""
    import step_overhead
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback

    from hush_hf.trainer.engine import DPStep

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=hidden, n_layer=layers, n_head=2)
    model = GPT2LMHeadModel(config)
    total = WARMUP + steps
    rows = B * total
    dataset = step_overhead.random_batch(VOCAB, rows, SEQ, True)
    profile, active, seconds = cProfile.Profile(), [False], []

    class Clock(TrainerCallback):
        """Counts from the third step on; times whole steps (one step's end to the next's) when not
        counting, since the profiler's own cost would weigh on the contender that makes more calls."""

        def on_step_end(self, args, state, control, **kwargs):
            now = time.process_time()
            if state.global_step == WARMUP and not timed:  # profile from here on
                for owner, name in targets:
                    profiled(owner, name, profile, active)
            if state.global_step > WARMUP and timed:
                seconds.append(now - self.last)
            self.last = time.process_time()

    common = step_overhead.timed_run_arguments("step_python_work_", total, MICRO, bf16=bf16, use_cpu=True)
    plain = contender == "plain"
    targets = [(Trainer, "training_step")] if plain else [(DPStep, "run"), (DPStep, "privatize")]
    trainer = step_overhead.same_b_trainer(contender, model, dataset, B, MICRO, total, common, [Clock()])
    trainer.train()
    shutil.rmtree(common["output_dir"], ignore_errors=True)  # nothing was saved in it
    if timed:
        return {"seconds": statistics.median(seconds), "fastest": min(seconds)}
    stats = pstats.Stats(profile)
    if dump:
        stats.dump_stats(f"{dump}.{contender}")
    to_calls = sum(
        entry[1]
        for key, entry in stats.stats.items()
        if key[2] == "<method 'to' of 'torch._C.TensorBase' objects>"
    )
    return {"calls": stats.total_calls / steps, "to": to_calls / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--bf16", action="store_true", help="bf16 mixed precision (autocast) for both trainers"
    )
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument(
        "--hidden", type=int, default=64, help="hidden size (small: the host's work is most of a step)"
    )
    parser.add_argument("--steps", type=int, default=6, help="counted steps (after 2 warm-up steps)")
    parser.add_argument("--dump", help="write each contender's cProfile stats to DUMP.plain / DUMP.hush")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    found = {}
    for contender in ("plain", "hush"):
        shape = (contender, args.bf16, args.layers, args.hidden, args.steps)
        found[contender] = run(*shape, timed=False, dump=args.dump) | run(*shape, timed=True)
    precision = "bf16" if args.bf16 else "fp32"
    print(f"GPT-2 {args.layers} x {args.hidden}, B = {B} (micro-batches of {MICRO}), {precision}")
    print("| per optimizer step | plain Trainer | SecretProtectionTrainer | ratio |")
    print("|---|---|---|---|")
    rows = (
        ("calls", "Python function calls"),
        ("to", "Tensor.to calls"),
        ("seconds", "CPU s, whole step (median)"),
        ("fastest", "CPU s, whole step (fastest)"),
    )
    for key, label in rows:
        plain, hush = found["plain"][key], found["hush"][key]
        timed = key in ("seconds", "fastest")
        shown = (f"{plain:.3f}", f"{hush:.3f}") if timed else (f"{plain:.0f}", f"{hush:.0f}")
        print(f"| {label} | {shown[0]} | {shown[1]} | {hush / plain:.2f}x |")


if __name__ == "__main__":
    main()
