"""The DP step on a GPU: plain / hush_hf / Opacus ghost x fp32 / TF32 / bf16, CUDA time and peak memory.

    .venv/bin/python bench/gpu_step.py [--models gpt2 gpt2-tied llama-1b llama-1b-lora llama-1b-lora-ckpt]
        [--precisions fp32 tf32 bf16] [--contenders plain hush opacus-ghost] [--steps 6] [--warmup 2]

The harness of issue 28, as one prepared script (with ``bench/gpu_trainer.py``: ``bench/gpu_session.sh``,
run on one H200 on 2026-11-28: docs/benchmarks.md).
Every (model, precision, contender) runs in a fresh process on the same model (same seed, built on
the GPU) and the same random batch; a full step is forward, backward pass(es), clipping, noise and
``torch.optim.AdamW`` (fused off, foreach on, as its CUDA default), written out here for every
contender alike (no Trainer):

- ``plain``: transformers' batch-mean loss, one ``backward()``, AdamW.
- ``hush``: ``GhostClipper.clipped_backward`` of the per-example mean token loss, then
  ``privatize_gradients_`` (sigma = 1, C = 1, B = batch), AdamW.
- ``opacus-ghost``: Opacus ``make_private(grad_sample_mode="ghost")`` with its
  ``DPLossFastGradientClipping`` (as ``bench/peer_overhead.py``; an optional dependency, extra
  ``bench``: a missing Opacus makes its cells ``missing``).

Precisions: ``fp32`` (``torch.set_float32_matmul_precision("highest")``), ``tf32`` (``"high"``: TF32
matrix products, as ``TrainingArguments(tf32=True)``), ``bf16`` (the model's weights in bf16, as the
issue's bf16 rows). Reported per cell: the median CUDA-synchronised wall time of the ``--steps``
timed steps after ``--warmup`` warm-up steps (hush_hf's one-time self-check runs in the warm-up),
the peak of ``torch.cuda.max_memory_allocated`` over the timed steps, and both as ratios to ``plain``
of the same row. A contender that raises shows ``refused`` (it declines the model) or ``error``, with
the last line of its message.

Without CUDA it exits at once with a message (status 2): the CPU ratios are ``bench/peer_overhead.py``
and ``bench/step_overhead.py``, the operation census ``bench/op_census.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# name: (family, tied, batch, seq, lora, gradient checkpointing (non-reentrant))
MODELS = {
    "gpt2": ("gpt2", False, 32, 512, False, False),  # GPT-2 124M untied
    "gpt2-tied": ("gpt2", True, 32, 512, False, False),
    "llama-1b": ("llama-1b", False, 8, 1024, False, False),  # 16 layers x 2048 (TinyLlama-sized)
    "llama-1b-lora": ("llama-1b", False, 8, 1024, True, False),  # LoRA r = 16 on all projections
    "llama-1b-lora-ckpt": ("llama-1b", False, 8, 1024, True, True),
}
DEFAULT_ROWS = [
    ("gpt2", "fp32"),
    ("gpt2", "tf32"),
    ("gpt2-tied", "bf16"),
    ("llama-1b", "bf16"),
    ("llama-1b-lora", "bf16"),
    ("llama-1b-lora-ckpt", "bf16"),
]
CONTENDERS = ("plain", "hush", "opacus-ghost")
PRECISIONS = ("fp32", "tf32", "bf16")


SMOKE = {
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 256},
    "llama-1b": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
    },
}
"""Config changes that shrink each family for a CPU smoke run of the harness (``tests/test_bench_gpu.py``)."""


def build_model(
    family: str,
    tied: bool,
    seq: int,
    lora: bool,
    device: str = "cuda",
    smoke: bool = False,
    layers: int | None = None,
):
    """Random-init model, built on ``device`` (no Hub): (model, causal). ``smoke``: the family shrunk;
    ``layers``: that many transformer layers instead of the family's."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    shrink = dict(SMOKE[family]) if smoke else {}
    if layers is not None:
        shrink["n_layer" if family == "gpt2" else "num_hidden_layers"] = layers
    with torch.device(device):
        if family == "gpt2":
            config = GPT2Config(n_positions=max(1024, seq), tie_word_embeddings=tied, **shrink)
            model = GPT2LMHeadModel(config)
        else:
            sizes = dict(
                vocab_size=32000,
                hidden_size=2048,
                intermediate_size=5632,
                num_hidden_layers=16,
                num_attention_heads=32,
                num_key_value_heads=4,
            )
            config = LlamaConfig(
                **{**sizes, **shrink}, max_position_embeddings=max(2048, seq), tie_word_embeddings=tied
            )
            model = LlamaForCausalLM(config)
    if lora:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets))
    return model, True


def measure(
    name: str,
    precision: str,
    contender: str,
    steps: int,
    warmup: int,
    device: str = "cuda",
    smoke: bool = False,
    profile: bool = False,
) -> dict:
    """CUDA-synchronised seconds per full step and peak allocated memory, in this (fresh) process
    (``device="cpu"``, ``smoke``: a smoke run of the same steps on a shrunk model and batch, wall time,
    no memory figure); ``profile``: one more step under the profiler (``profile_step``), plain and
    hush_hf only."""
    import time

    import peer_overhead as po
    import torch

    family, tied, batch, seq, lora, checkpointing = MODELS[name]
    if smoke:
        batch, seq = 2, 16
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    torch.manual_seed(0)
    model, causal = build_model(family, tied, seq, lora, device, smoke)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    cuda = device == "cuda"
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    vocab = model.config.vocab_size
    inputs, labels = po.random_batch(vocab, batch, seq, causal)
    inputs, labels = {k: v.to(device) for k, v in inputs.items()}, labels.to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=cuda or None)

    if contender == "plain":

        def step(k: int) -> None:
            model(**inputs, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    elif contender == "hush":
        from hush_hf.clipping import GhostClipper, example_cross_entropy
        from hush_hf.trainer.noise import privatize_gradients_

        clipper = GhostClipper(model, 1.0)

        def step(k: int) -> None:
            loss = example_cross_entropy(model(**inputs).logits, labels, causal=causal)
            clipper.clipped_backward(loss)
            privatize_gradients_(
                trainable, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=batch, dp_seed=1, step=k
            )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    elif contender == "opacus-ghost":
        from opacus import PrivacyEngine
        from torch.utils.data import DataLoader, TensorDataset

        po.register_opacus_conv1d()
        loader = DataLoader(TensorDataset(inputs["input_ids"].cpu()), batch_size=batch)
        made = PrivacyEngine().make_private(
            module=model,
            optimizer=optimizer,
            criterion=torch.nn.CrossEntropyLoss(ignore_index=-100),
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            poisson_sampling=False,
            grad_sample_mode="ghost",
        )
        private, dp_optimizer, dp_criterion = made[0], made[1], made[2]

        def step(k: int) -> None:
            logits = private(**inputs).logits[:, :-1]
            target = labels[:, 1:]
            flat_logits, flat_target = logits.reshape(-1, vocab), target.reshape(-1)
            dp_criterion(flat_logits, flat_target, shape=logits.shape).backward()
            dp_optimizer.step()
            dp_optimizer.zero_grad(set_to_none=True)

    else:
        raise ValueError(f"unknown contender {contender!r}")

    seconds = []
    for k in range(warmup + steps):
        if k == warmup and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        step(k)
        if cuda:
            torch.cuda.synchronize()
        if k >= warmup:
            seconds.append(time.perf_counter() - start)
    found = {
        "seconds": seconds,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
    }
    if profile and contender != "opacus-ghost":
        try:
            found["profile"] = profile_step(lambda: step(warmup + steps), cuda)
        except Exception as error:  # the timings stand without it
            found["profile"] = f"profile failed: {type(error).__name__}: {error}"
    return found


PROFILED_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::_to_copy", "aten::copy_")


def profile_step(step, cuda: bool, top: int = 12) -> str:
    """One more step under ``torch.profiler``: kernels launched, device time, the calls of the matrix
    products and casts, and the ``top`` operators by their own device (CPU: host) time, as text."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    averages = prof.key_averages()
    counts = {e.key: e.count for e in averages if e.key in PROFILED_OPS}
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    device_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
    lines = [
        f"kernels launched: {len(kernels)}; device time {device_ms:.1f} ms",
        "calls: " + ", ".join(f"{op} {counts.get(op, 0)}" for op in PROFILED_OPS),
        averages.table(sort_by=sort, row_limit=top, max_name_column_width=60),
    ]
    return "\n".join(lines)


def run_isolated(name: str, precision: str, contender: str, args: argparse.Namespace) -> dict:
    """``measure`` in a fresh interpreter; a failure becomes a ``refused`` / ``error`` / ``missing`` cell."""
    spec = {"model": name, "precision": precision, "contender": contender, "profile": bool(args.profile)}
    return isolated(__file__, {**spec, "steps": args.steps, "warmup": args.warmup}, args.timeout)


def isolated(script: str, spec: dict, timeout: float) -> dict:
    """``script --_measure SPEC`` in a fresh interpreter: the JSON its last line prints, or a ``refused`` /
    ``error`` / ``missing`` cell with the last line of its error."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    try:
        result = subprocess.run(
            [sys.executable, script, "--_measure", json.dumps(spec)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"failed": "error", "message": f"ran past --timeout {timeout} s"}
    lines = result.stdout.strip().splitlines()
    if result.returncode == 0 and lines:
        return json.loads(lines[-1])
    last = (result.stderr.strip().splitlines() or ["no output"])[-1]
    if "No module named 'opacus'" in last:
        return {"failed": "missing", "message": "opacus is not installed (pip install hush_hf[bench])"}
    lowered = last.lower()
    kind = "refused" if "not supported" in lowered or "unsupported" in lowered else "error"
    return {"failed": kind, "message": last[:200]}


def cell(found: dict, plain: dict | None) -> str:
    if "failed" in found:
        return f"{found['failed']}: {found['message']}"
    seconds = statistics.median(found["seconds"])
    text = f"{seconds:.3f} s, {found['peak_gib']:.2f} GiB"
    if plain is not None and "failed" not in plain:
        ratio = seconds / statistics.median(plain["seconds"])
        text += f" ({ratio:.2f}x, memory {found['peak_gib'] / plain['peak_gib']:.2f}x)"
    return text


def parse_measurement_arguments(parser: argparse.ArgumentParser, steps: int) -> argparse.Namespace:
    """The arguments both GPU scripts take (timed steps, warm-up, a process's timeout, the inner
    ``--_measure``), parsed."""
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=240, help="seconds per contender process")
    parser.add_argument("--_measure", help=argparse.SUPPRESS)
    return parser.parse_args()


def require_cuda(script: str, instead: str) -> None:
    """Exit with status 2 and a message when no CUDA GPU is visible."""
    import torch

    if not torch.cuda.is_available():
        print(
            f"bench/{script} needs a CUDA GPU and none is visible (torch.cuda.is_available() is False); "
            f"on a CPU machine run {instead} instead",
            file=sys.stderr,
        )
        sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, help="default: the issue's four rows")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS)
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--profile", help="also profile one step of plain and hush_hf; write the tables here")
    args = parse_measurement_arguments(parser, steps=6)
    require_cuda("gpu_step.py", "bench/op_census.py and bench/peer_overhead.py")
    import torch

    if args._measure:
        spec = json.loads(args._measure)
        warnings.filterwarnings("ignore")
        found = measure(
            spec["model"], spec["precision"], spec["contender"], spec["steps"], spec["warmup"],
            profile=spec.get("profile", False),
        )  # fmt: skip
        print(json.dumps(found))
        return
    if args.models or args.precisions:
        rows = [(m, p) for m in args.models or MODELS for p in args.precisions or PRECISIONS]
    else:
        rows = DEFAULT_ROWS
    device = torch.cuda.get_device_name()
    print(f"{device}, torch {torch.__version__}; {args.warmup} warm-up + {args.steps} timed steps")
    print(f"| model, batch | precision | {' | '.join(args.contenders)} |")
    print("|---|---|" + "---|" * len(args.contenders))
    for name, precision in rows:
        found = {c: run_isolated(name, precision, c, args) for c in args.contenders}
        plain = found.get("plain")
        batch, seq = MODELS[name][2:4]
        cells = " | ".join(cell(found[c], plain if c != "plain" else None) for c in args.contenders)
        print(f"| {name}, {batch}x{seq} | {precision} | {cells} |", flush=True)
        if args.profile:
            with open(args.profile, "a") as out:
                for c in args.contenders:
                    if "profile" in found[c]:
                        out.write(f"\n## {name}, {batch}x{seq}, {precision}, {c}\n\n{found[c]['profile']}\n")


if __name__ == "__main__":
    main()
