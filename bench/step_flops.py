"""Matrix-product FLOPs of one training step at the GPU table's shapes: plain step against the DP step.

    .venv/bin/python bench/step_flops.py [--models gpt2 gpt2-tied llama-1b llama-1b-lora] [--batch 1]

A float32 step on a GPU is bound by its matrix products: on the H200 (docs/benchmarks.md) the GPT-2 fp32
row took 1.23x the plain step, and its products' FLOPs are in the same ratio. This counts those FLOPs
exactly, on any machine: ``torch.utils.flop_counter.FlopCounterMode`` over one full step (forward,
backward, clipping, noise, AdamW: ``op_census.step_of``) after ``--warmup`` steps (hush_hf's
self-check runs there: twice with LoRA, whose adapters' first gradients are zero), on the models of
``bench/gpu_step.py`` at their widths and sequence lengths, built with 1 and 2 transformer layers: one
layer's FLOPs are the difference, the full model's ``F(1) + (L - 1) (F(2) - F(1))``. Every product of
both steps is linear in the batch (a ghost norm's Gram matrix is (T x T) per example), so the ratio does
not depend on ``--batch``.

float32 only. The same FLOPs run under TF32, faster, so there the rest of the step weighs more; a bf16
model takes other routes (two bf16 pieces per clipped sum: docs/benchmarks.md, "bf16 products and the
clipped sum"), and this CPU multiplies bf16 at under 1 GFLOP/s.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_step  # noqa: E402
import op_census  # noqa: E402

LAYERS = {"gpt2": 12, "llama-1b": 16}
"""The full models' layer counts (``gpu_step.build_model``)."""


def shallow_model(name: str, layers: int, smoke: bool = False) -> tuple[torch.nn.Module, bool, int]:
    """(model, causal, sequence length): ``gpu_step.MODELS[name]`` on the CPU with ``layers`` layers (seed 0),
    checkpointed where the row is; ``smoke``: the family shrunk, sequences of 16."""
    family, tied, _, seq, lora, checkpointing = gpu_step.MODELS[name]
    if smoke:
        seq = 16
    torch.manual_seed(0)
    model, causal = gpu_step.build_model(family, tied, seq, lora, "cpu", smoke, layers)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, causal, seq


def step_flops(
    name: str, contender: str, layers: int, batch: int, warmup: int = 2, smoke: bool = False
) -> Counter[str]:
    """FLOPs of one ``contender`` step by operation, for ``gpu_step.MODELS[name]`` with ``layers`` layers."""
    model, causal, seq = shallow_model(name, layers, smoke)
    step = op_census.step_of(model.train(), causal, contender, batch, seq)
    for k in range(warmup):
        step(k)
    counter = FlopCounterMode(display=False)
    with counter:
        step(warmup)
    return Counter({str(op).split(".")[-1]: n for op, n in counter.get_flop_counts()["Global"].items()})


def full_model(one: Counter[str], two: Counter[str], layers: int) -> Counter[str]:
    """``F(1) + (layers - 1) (F(2) - F(1))``, operation by operation (the total is exact; products may move
    between ``mm`` and ``bmm`` where small layers' products are batched together)."""
    return Counter({op: one[op] + (layers - 1) * (two[op] - one[op]) for op in one.keys() | two.keys()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    names = [n for n in gpu_step.MODELS if not gpu_step.MODELS[n][5]]
    parser.add_argument("--models", nargs="+", default=names, choices=names)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(f"matrix-product GFLOP per step, float32, batch {args.batch}, torch {torch.__version__}")
    print("| model | layers | plain | hush_hf | ratio | one layer (plain / hush_hf) |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        family, _, _, seq, _, _ = gpu_step.MODELS[name]
        layers = LAYERS[family]
        found = {}
        for contender in ("plain", "hush"):
            one, two = (step_flops(name, contender, n, args.batch, args.warmup) for n in (1, 2))
            found[contender] = (full_model(one, two, layers), sum(two.values()) - sum(one.values()))
        (plain, plain_layer), (hush, hush_layer) = found["plain"], found["hush"]
        total_plain, total_hush = sum(plain.values()), sum(hush.values())
        print(
            f"| {name} (T = {seq}) | {layers} | {total_plain / 1e9:.1f} | {total_hush / 1e9:.1f} | "
            f"**{total_hush / total_plain:.3f}x** | {plain_layer / 1e9:.1f} / {hush_layer / 1e9:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
