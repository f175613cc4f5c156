"""DP step against a plain step, side by side with Opacus 1.6: the peer table of issue 11.

    .venv/bin/python bench/peer_overhead.py [--models gpt2 gpt2-untied bert256 ...]
        [--contenders plain hush opacus-ghost opacus-per-sample] [--steps 2] [--warmup 1] [--repeats 1]

Contenders, each on the same model (same seed) and the same fixed batch, in a training loop written
out here (no Trainer, so every contender pays for the same things): a full step is forward,
backward pass(es), clipping, noise and ``torch.optim.AdamW``.

- ``plain``: transformers' batch-mean loss, one ``backward()``, AdamW.
- ``hush``: ``GhostClipper.clipped_backward`` of the per-example mean token loss (one backward pass,
  book-keeping), then ``privatize_gradients_`` (sigma = 1, C = 1, B = batch), AdamW.
- ``opacus-ghost``: Opacus 1.6 ``PrivacyEngine.make_private(grad_sample_mode="ghost")`` with
  ``DPLossFastGradientClipping`` (per-sequence mean of the token loss), its DPOptimizer over AdamW.
- ``opacus-per-sample``: the same with ``grad_sample_mode="hooks"`` (materialised per-sample grads).

GPT-2's ``Conv1D`` gets Opacus grad and norm samplers registered below (Opacus has none; without
them it falls back to functorch), so Opacus runs its fastest path; hush_hf runs its own rules (Llama's
RMSNorm has a built-in one, ``hush_hf.clipping.rules_rms_norm``).
A contender that raises is reported as ``refused`` (it declines the model, e.g. Opacus on tied
weights) or ``error`` (it crashes), with the last line of the message printed; ``skipped`` when
per-sample gradients would take more than half the machine's available memory. Untied BERT-MLM's
unused ``cls.predictions.bias`` is frozen for every contender (so all of them train the same
parameters).

Each (model, contender) runs in a fresh process; the contenders of a model run one after the other,
in a rotated order on each repeat (interleaved), so a change in the machine's load hits all of them.
Reported: the median over timed steps and repeats of the *process CPU seconds* of one full step
(``time.process_time``, all threads; less sensitive than wall time to other processes on a shared
machine), its ratio to ``plain``, and the ratio of the process's peak resident set size over the timed steps
(Linux VmHWM, reset after the warm-up; it includes the model, optimizer state and Python/torch runtime,
so it is the whole process's footprint, not the step's extra memory). opacus is an
optional dependency (``pip install hush_hf[bench]``); without it the Opacus cells say ``missing``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

# name: (family, tied, batch, seq)
MODELS = {
    "gpt2": ("gpt2", True, 16, 128),
    "gpt2-untied": ("gpt2", False, 16, 128),
    "gpt2-1024": ("gpt2", True, 4, 1024),
    "bert256": ("bert256", True, 32, 128),
    "bert256-untied": ("bert256", False, 32, 128),
    "bert-tiny": ("bert-tiny", True, 32, 128),
    "bert-tiny-untied": ("bert-tiny", False, 32, 128),
    "llama4x256": ("llama4x256", False, 32, 128),
    "mamba4x256": ("mamba4x256", False, 8, 128),
}
CONTENDERS = ("plain", "hush", "opacus-ghost", "opacus-per-sample")


def build_model(family: str, tied: bool, seq: int):
    """Random-init models from configs (no Hub): (model, causal)."""
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    if family == "gpt2":
        config = GPT2Config(n_positions=max(1024, seq), tie_word_embeddings=tied)
        return GPT2LMHeadModel(config), True
    if family in ("bert256", "bert-tiny"):
        hidden, layers = (256, 4) if family == "bert256" else (128, 2)
        config = BertConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=hidden // 64,
            intermediate_size=4 * hidden,
            max_position_embeddings=max(512, seq),
            tie_word_embeddings=tied,
        )
        return BertForMaskedLM(config), False
    if family == "llama4x256":
        config = LlamaConfig(
            vocab_size=32000,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=1024,
            max_position_embeddings=max(1024, seq),
            tie_word_embeddings=tied,
        )
        return LlamaForCausalLM(config), True
    if family == "mamba4x256":  # state-space (issue 30): each mixer is replayed per example
        from transformers import MambaConfig, MambaForCausalLM

        config = MambaConfig(vocab_size=32000, hidden_size=256, num_hidden_layers=4, state_size=16)
        return MambaForCausalLM(config), True
    raise ValueError(f"unknown model family {family!r}")


def random_batch(vocab: int, batch: int, seq: int, causal: bool):
    """Token ids, full attention mask, (b, T) position ids, labels (causal: the ids; MLM: 15%)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (batch, seq), generator=generator)
    labels = ids.clone()
    if not causal:
        labels[torch.rand(batch, seq, generator=generator) > 0.15] = -100
        labels[:, 0] = ids[:, 0]  # every example has a target
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones(batch, seq, dtype=torch.long),
        "position_ids": torch.arange(seq).expand(batch, seq).contiguous(),
    }
    return inputs, labels


def register_opacus_conv1d() -> None:
    """Opacus samplers for transformers' Conv1D (y = x W + b, W of shape (in, out)): per-sample
    gradient sum_t x_t g_t^T and its norm from the two (T x T) Gram matrices."""
    import torch
    from opacus.grad_sample.utils import register_grad_sampler, register_norm_sampler
    from transformers.pytorch_utils import Conv1D

    def flat(t):
        return t.reshape(t.shape[0], -1, t.shape[-1])

    @register_grad_sampler(Conv1D)
    def conv1d_grad_sample(layer, activations, backprops):
        x, g = flat(activations[0].to(backprops.dtype)), flat(backprops)
        out = {}
        if layer.weight.requires_grad:
            out[layer.weight] = torch.bmm(x.transpose(1, 2), g)
        if layer.bias is not None and layer.bias.requires_grad:
            out[layer.bias] = g.sum(1)
        return out

    @register_norm_sampler(Conv1D)
    def conv1d_norm_sample(layer, activations, backprops):
        x, g = flat(activations[0].to(backprops.dtype)), flat(backprops)
        out = {}
        if layer.weight.requires_grad:
            gram = torch.bmm(x, x.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))
            out[layer.weight] = gram.sum((1, 2)).clamp_min(0).sqrt()
        if layer.bias is not None and layer.bias.requires_grad:
            out[layer.bias] = g.sum(1).norm(dim=1)
        return out


def measure(name: str, contender: str, steps: int, warmup: int) -> dict:
    """Process CPU seconds per full step of ``contender`` on model ``name``, in this (fresh) process."""
    import time

    import torch
    import torch.nn.functional as F

    family, tied, batch, seq = MODELS[name]
    torch.manual_seed(0)
    model, causal = build_model(family, tied, seq)
    model.train()
    head = getattr(getattr(model, "cls", None), "predictions", None)
    if head is not None and head.bias is not head.decoder.bias:
        head.bias.requires_grad_(False)  # untied BERT-MLM (transformers 5) keeps an unused bias
    if contender == "opacus-per-sample":
        import psutil

        needed = batch * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        if needed > psutil.virtual_memory().available / 2:
            raise MemoryError(f"skipped: {needed / 2**30:.1f} GiB of per-sample gradients (shared machine)")
    vocab = model.config.vocab_size
    inputs, labels = random_batch(vocab, batch, seq, causal)
    accepted = inspect.signature(model.forward).parameters
    inputs = {k: v for k, v in inputs.items() if k in accepted}  # (Mamba takes no position_ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    if contender == "plain":

        def step(k: int) -> None:
            model(**inputs, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    elif contender == "hush":
        from hush_hf.clipping import GhostClipper, example_cross_entropy
        from hush_hf.trainer.noise import privatize_gradients_

        clipper = GhostClipper(model, 1.0)
        params = [p for p in model.parameters() if p.requires_grad]

        def step(k: int) -> None:
            loss = example_cross_entropy(model(**inputs).logits, labels, causal=causal)
            clipper.clipped_backward(loss)
            privatize_gradients_(
                params, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=batch, dp_seed=1, step=k
            )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    elif contender in ("opacus-ghost", "opacus-per-sample"):
        from opacus import PrivacyEngine
        from torch.utils.data import DataLoader, TensorDataset

        register_opacus_conv1d()
        loader = DataLoader(TensorDataset(inputs["input_ids"]), batch_size=batch)
        criterion = torch.nn.CrossEntropyLoss(ignore_index=-100)
        ghost = contender == "opacus-ghost"
        engine = PrivacyEngine()
        made = engine.make_private(
            module=model,
            optimizer=optimizer,
            criterion=criterion,
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            poisson_sampling=False,
            grad_sample_mode="ghost" if ghost else "hooks",
        )
        private, dp_optimizer = made[0], made[1]
        dp_criterion = made[2] if ghost else criterion

        def step(k: int) -> None:
            logits = private(**inputs).logits
            target = labels
            if causal:
                logits, target = logits[:, :-1], labels[:, 1:]
            shape = logits.shape
            flat_logits, flat_target = logits.reshape(-1, vocab), target.reshape(-1)
            if ghost:
                dp_criterion(flat_logits, flat_target, shape=shape).backward()
            else:
                F.cross_entropy(flat_logits, flat_target, ignore_index=-100).backward()
            dp_optimizer.step()
            dp_optimizer.zero_grad(set_to_none=True)

    else:
        raise ValueError(f"unknown contender {contender!r}")

    seconds = []
    for k in range(warmup + steps):
        if k == warmup:
            reset_peak_rss()  # the warm-up (hush_hf's one-time self-check included) does not count
        start = time.process_time()
        step(k)
        if k >= warmup:
            seconds.append(time.process_time() - start)
    return {"cpu_seconds": seconds, "peak_rss_mb": peak_rss_mb(), "threads": torch.get_num_threads()}


def reset_peak_rss() -> None:
    """Linux: restart the process's peak-RSS counter (VmHWM) from the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_mb() -> float:
    """Peak resident set size since the last reset (Linux VmHWM), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def classify(message: str) -> str:
    """``refused`` when the contender declines the model on purpose, else ``error``."""
    lowered = message.lower()
    if "skipped:" in lowered:
        return "skipped"
    return "refused" if "not supported" in lowered or "unsupported" in lowered else "error"


def run_isolated(name: str, contender: str, args: argparse.Namespace) -> dict:
    """``measure`` in a fresh interpreter; a failure becomes a ``refused`` / ``error`` cell."""
    spec = json.dumps({"model": name, "contender": contender, "steps": args.steps, "warmup": args.warmup})
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, __file__, "--_measure", spec],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode == 0 and lines:
        return json.loads(lines[-1])
    errors = [line for line in result.stderr.strip().splitlines() if line.strip()]
    last = errors[-1] if errors else f"exit status {result.returncode}"
    if "ModuleNotFoundError" in last and "opacus" in last:
        return {"status": "missing", "message": last}
    return {"status": classify(last), "message": last[:300]}


def table_row(name: str, runs: dict[str, list[dict]], contenders: list[str]) -> str:
    """Median CPU seconds per step, its ratio to plain (x) and the peak-RSS ratio (m)."""
    _, _, batch, seq = MODELS[name]
    plain = [s for run in runs["plain"] for s in run.get("cpu_seconds", [])]
    plain_s = statistics.median(plain) if plain else None
    plain_mb = max((run.get("peak_rss_mb", 0) for run in runs["plain"]), default=0)
    row = []
    for contender in contenders:
        seconds = [s for run in runs[contender] for s in run.get("cpu_seconds", [])]
        if not seconds:
            row.append(f"{runs[contender][0].get('status', 'error'):>22}")
            continue
        med = statistics.median(seconds)
        if contender == "plain" or plain_s is None:
            row.append(f"{med:>9.2f}s {'':>11}")
        else:
            mb = max(run["peak_rss_mb"] for run in runs[contender])
            row.append(f"{med:>9.2f}s {med / plain_s:>4.2f}x {mb / plain_mb:>4.2f}m")
    return f"{name:<17} {batch:>3} {seq:>5} " + " ".join(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["gpt2", "gpt2-untied", "bert256", "bert256-untied", "bert-tiny", "bert-tiny-untied"],
        choices=MODELS,
    )
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per (model, contender)")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    parser.add_argument("--_measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._measure:
        spec = json.loads(args._measure)
        warnings.filterwarnings("ignore")
        result = measure(spec["model"], spec["contender"], spec["steps"], spec["warmup"])
        print(json.dumps(result))
        return
    if "plain" not in args.contenders:
        args.contenders = ["plain", *args.contenders]

    print(
        f"{args.steps} timed steps after {args.warmup} warm-up, {args.repeats} repeat(s); "
        "median process-CPU seconds per full step (ratio to plain) / peak RSS ratio"
    )
    cells: dict[str, dict[str, list[dict]]] = {m: {c: [] for c in args.contenders} for m in args.models}
    header = f"{'model':<17} {'b':>3} {'seq':>5} " + " ".join(f"{c:>22}" for c in args.contenders)
    print(header, flush=True)
    for name in args.models:
        for r in range(args.repeats):
            k = r % len(args.contenders)
            for contender in args.contenders[k:] + args.contenders[:k]:  # interleaved: rotated per repeat
                cells[name][contender].append(run_isolated(name, contender, args))
        print(table_row(name, cells[name], args.contenders), flush=True)
        if args.json:
            args.json.write_text(json.dumps(cells, indent=1))
    for name in args.models:
        for contender in args.contenders:
            for run in cells[name][contender]:
                if "status" in run:
                    print(f"{name} / {contender}: {run['status']}: {run['message']}")


if __name__ == "__main__":
    main()
