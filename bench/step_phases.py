"""Where a DP step's time goes: process CPU seconds per phase, hush_hf and plain, one process each.

    .venv/bin/python bench/step_phases.py [--models gpt2 bert256 llama4x256] [--steps 2] [--repeats 1]

Same models, batches and step as ``bench/peer_overhead.py`` (plain and hush contenders). Phases of a
hush_hf step: forward, per-example loss, the one ``autograd.grad`` to the layer outputs, zero-step
dropping, combining uses (materialising where that is no larger than the factors), norms, clipped
sums (book-keeping), noise, AdamW; of a plain step: forward with transformers' loss, ``backward()``,
AdamW. Each phase is timed by wrapping the engine's functions (``time.process_time``, all threads);
the phases of ``clipped_backward`` not listed are the rules and the checks. Prints one line per
process: total CPU seconds per step, peak RSS (VmHWM after the warm-up) and the phases. Fresh
processes, interleaved, like peer_overhead.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer_overhead as po  # noqa: E402


def measure(name: str, contender: str, steps: int) -> dict:
    import torch

    family, tied, batch, seq = po.MODELS[name]
    torch.manual_seed(0)
    model, causal = po.build_model(family, tied, seq)
    model.train()
    head = getattr(getattr(model, "cls", None), "predictions", None)
    if head is not None and head.bias is not head.decoder.bias:
        head.bias.requires_grad_(False)
    inputs, labels = po.random_batch(model.config.vocab_size, batch, seq, causal)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    phases: dict[str, float] = {}

    def timed(label, f, *args, **kwargs):
        start = time.process_time()
        result = f(*args, **kwargs)
        phases[label] = phases.get(label, 0.0) + time.process_time() - start
        return result

    def wrap(owner, attr: str, label: str) -> None:
        f = getattr(owner, attr)
        setattr(owner, attr, functools.wraps(f)(functools.partial(timed, label, f)))

    def adamw() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if contender == "plain":

        def step(k: int) -> None:
            loss = timed("forward+loss", lambda: model(**inputs, labels=labels).loss)
            timed("backward", loss.backward)
            timed("adamw", adamw)

    else:
        from hush_hf.clipping import GhostClipper, example_cross_entropy, ghost, gram_batches, sum_batches
        from hush_hf.trainer.noise import privatize_gradients_

        for owner, attr, label in [
            (ghost, "drop_zero_steps_all", "drop_zero"),
            (ghost, "combine_uses", "combine"),
            (gram_batches, "squared_norms", "norms"),
            (ghost, "weighted_sum", "clipped_sums"),
            (sum_batches, "weighted_sums", "clipped_sums"),
        ]:
            wrap(owner, attr, label)
        wrap(torch.autograd, "grad", "autograd.grad")
        clipper = GhostClipper(model, 1.0)
        params = [p for p in model.parameters() if p.requires_grad]

        def step(k: int) -> None:
            logits = timed("forward", lambda: model(**inputs).logits)
            loss = timed("loss", example_cross_entropy, logits, labels, causal=causal)
            del logits
            timed("clipped_backward", clipper.clipped_backward, loss)
            timed("noise", privatize_gradients_, params, noise_multiplier=1.0, clip_norm=1.0,
                  expected_batch_size=batch, dp_seed=1, step=k)  # fmt: skip
            timed("adamw", adamw)

    step(0)  # warm-up (hush_hf's one-time self-check)
    po.reset_peak_rss()
    phases.clear()
    start = time.process_time()
    for k in range(steps):
        step(k + 1)
    total = (time.process_time() - start) / steps
    per_step = {label: round(s / steps, 2) for label, s in phases.items()}
    return {"cpu_seconds": round(total, 2), "peak_rss_mb": round(po.peak_rss_mb()), "phases": per_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert256", "llama4x256"], choices=po.MODELS)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--_measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._measure:
        spec = json.loads(args._measure)
        warnings.filterwarnings("ignore")
        print(json.dumps(measure(spec["model"], spec["contender"], spec["steps"])))
        return
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    for name in args.models:
        for r in range(args.repeats):
            for contender in ["plain", "hush"][r % 2 :] + ["plain", "hush"][: r % 2]:
                spec = json.dumps({"model": name, "contender": contender, "steps": args.steps})
                done = subprocess.run(
                    [sys.executable, __file__, "--_measure", spec], capture_output=True, text=True, env=env
                )
                lines = done.stdout.strip().splitlines()
                result = lines[-1] if done.returncode == 0 and lines else done.stderr.strip()[-300:]
                print(f"{name:<12} {contender:<6} {result}", flush=True)


if __name__ == "__main__":
    main()
