"""Cost of a DP step against a plain Trainer step: same model, same batch, one run.

    .venv/bin/python bench/step_overhead.py [--quick] [--models bert-tiny gpt2 gemma2-small llama-small ...]
                                            [--seqs 128 256] [--batch 32] [--steps 3] [--bf16]
                                            [--compare checkpointing] [--gradient-checkpointing]
                                            [--rounds 1]

For each model and sequence length, two fresh processes train the same model on the same random
batch of ``--batch`` sequences: a plain ``transformers.Trainer`` (batch-mean loss, one backward,
default batch clipping) and a ``SecretProtectionTrainer`` whose plan samples every example
(rho = 1, B = batch, one micro-batch of the same size; ghost clipping, all-reduce, noise). Reported:
median seconds per optimizer step after ``--warmup`` steps (timed between ``on_step_begin`` and
``on_step_end``, i.e. forward, backward(s), noise and the optimizer), as wall time and as the
process's CPU time (all threads; on a shared CPU less disturbed by other processes than wall time),
and peak memory during the timed steps (CUDA: ``max_memory_allocated``; CPU: peak resident set
size of the process, sampled every 2 ms, which includes the ~0.5 GB of the Python/torch runtime and
dilutes the ratio). Targets on a GPU for GPT-2 small at batch >= 32: time ratio <= 1.3, memory ratio <= 1.1.

``--quick`` (CPU smoke run): sequence 128 only, batch 8, 2 timed steps.

``--compare checkpointing``: the DP step without gradient checkpointing against the same DP step with
``gradient_checkpointing=True`` (transformers' default, non-reentrant; the clipping engine then takes
two backward passes, each recomputing the checkpointed layers), instead of plain against DP: what
checkpointing saves in peak memory and costs in time under per-example clipping.

``--gradient-checkpointing``: both contenders train with ``gradient_checkpointing=True`` (with
``--compare plain``: the plain Trainer with checkpointing against the DP step with checkpointing).

``--rounds N``: N rounds, the two contenders alternating (base, other, base, other, ...), each round's
ratios printed, then their medians: on a shared machine load drifts, and interleaving spreads it over both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

MODELS = (
    "bert-tiny",
    "gpt2",
    "gemma2-small",
    "llama-small",
    "llama-small-lora",
    "mixtral-small",
    "deberta-v3-small",
)


def build_model(name: str, seq: int):
    """BERT-Tiny (L=2, H=128) MLM, GPT-2 small (124M), a small Gemma-2 (eager attention), small Llama and
    Mixtral (eager attention), a small DeBERTa-v3 MLM; random init."""
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        Gemma2Config,
        Gemma2ForCausalLM,
        GPT2Config,
        GPT2LMHeadModel,
    )

    if name == "bert-tiny":
        config = BertConfig(
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=512,
            max_position_embeddings=max(512, seq),
        )
        return BertForMaskedLM(config), False
    if name == "gpt2":
        return GPT2LMHeadModel(GPT2Config(n_positions=max(1024, seq))), True
    if name == "gemma2-small":
        config = Gemma2Config(
            vocab_size=32000,
            hidden_size=512,
            num_hidden_layers=6,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            intermediate_size=2048,
            max_position_embeddings=max(1024, seq),
            attn_implementation="eager",
        )
        return Gemma2ForCausalLM(config), True
    if name in ("llama-small", "llama-small-lora"):
        # Llama-style, 4 layers x 256 (RMSNorm scales take the generic torch.func path).
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=32000,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=1024,
            max_position_embeddings=max(1024, seq),
            attn_implementation="eager",
        )
        model = LlamaForCausalLM(config)
        if name == "llama-small-lora":  # only rank-8 adapters on q/v train; the base is frozen
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
        return model, True
    if name == "mixtral-small":
        # Mixtral-style, 4 layers x 256, 8 experts (256 -> 512 -> 256, gated), top-2, vocab 4096.
        from transformers import MixtralConfig, MixtralForCausalLM

        config = MixtralConfig(
            vocab_size=4096,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=512,
            num_local_experts=8,
            num_experts_per_tok=2,
            max_position_embeddings=max(1024, seq),
            attn_implementation="eager",
        )
        return MixtralForCausalLM(config), True
    if name == "deberta-v3-small":
        # DeBERTa-v3's layout, 4 layers x 256: relative attention through the content projections
        # (share_att_key), its table trained (the encoder replayed per example); dropouts 0, which the
        # per-example replays need.
        from transformers import DebertaV2Config, DebertaV2ForMaskedLM

        config = DebertaV2Config(
            vocab_size=32000,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=1024,
            max_position_embeddings=max(512, seq),
            relative_attention=True,
            position_buckets=256,
            max_relative_positions=-1,
            pos_att_type=["p2c", "c2p"],
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            position_biased_input=False,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return DebertaV2ForMaskedLM(config), False
    raise ValueError(f"model must be one of {MODELS}, got {name!r}")


def random_batch(vocab: int, batch: int, seq: int, causal: bool):
    """One fixed batch: token ids, full attention mask, labels (causal: the ids; MLM: 15% of positions)."""
    import datasets
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (batch, seq), generator=generator)
    labels = ids.clone()
    if not causal:
        labels[torch.rand(batch, seq, generator=generator) > 0.15] = -100
    return datasets.Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": [[1] * seq] * batch, "labels": labels.tolist()}
    )


def collate(features):
    import torch

    return {k: torch.tensor([f[k] for f in features]) for k in ("input_ids", "attention_mask", "labels")}


class PeakRss:
    """Peak resident set size of this process while active (sampled)."""

    def __init__(self, interval: float = 0.002) -> None:
        import psutil

        self.process, self.interval, self.peak, self._stop = psutil.Process(), interval, 0, threading.Event()

    def __enter__(self) -> PeakRss:
        self.peak = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def uniform_plan(dataset, rows: int, expected_batch: float, steps: int):
    """A plan bound to ``dataset``: every row weight 1, drawn with probability B / rows, sigma 1 (set, not
    certified: a step's cost does not depend on the guarantee), one stand-in secret held by row 0."""
    import numpy as np
    import scipy.sparse as sp

    from hush_hf.planning.plan import ProtectionPlan, SecretReport

    return ProtectionPlan(
        weights=np.ones(rows),
        sampling_probs=np.full(rows, expected_batch / rows),
        noise_multiplier=1.0,
        accountant="tight",
        budget="tight",
        lp_c=1.0,
        expected_batch_size=expected_batch,
        steps=steps,
        secrets=SecretReport(
            num_examples=np.array([1]),
            sum_rho=np.array([1.0]),
            prior=np.array([1e-4]),
            target=np.array([1e-2]),
            bound=np.array([5e-3]),
        ),
        memberships=sp.csr_matrix(([1.0], [0], [0, 1]), shape=(1, rows)),
    ).bound_to(dataset)


def same_b_trainer(
    contender: str, model, dataset, batch: int, micro: int, steps: int, common: dict, callbacks: list
):
    """A plain ``Trainer`` taking B = ``batch`` rows a step by accumulating micro-batches of ``micro``
    (``contender == "plain"``), or a ``SecretProtectionTrainer`` drawing B in expectation (Poisson, every
    row with probability B / rows) in micro-batches of ``micro``: sigma set (not certified) and the
    seed fixed, so every run draws the same batches. ``common``: ``timed_run_arguments``'s."""
    from transformers import Trainer, TrainingArguments

    from hush_hf.trainer import SecretProtectionConfig, SecretProtectionTrainer

    if contender == "plain":
        args = TrainingArguments(**common, gradient_accumulation_steps=batch // micro)
        return Trainer(
            model=model, args=args, train_dataset=dataset, data_collator=collate, callbacks=callbacks
        )
    plan = uniform_plan(dataset, len(dataset), float(batch), steps)
    return SecretProtectionTrainer(
        model=model,
        args=SecretProtectionConfig(**common, noise_multiplier=1.0, dp_seed=0),
        train_dataset=plan.attach(dataset),
        data_collator=collate,
        plan=plan,
        callbacks=callbacks,
    )


def timed_run_arguments(prefix: str, steps: int, batch: int, **extra: object) -> dict:
    """The training arguments the benches share for a timed run (both contenders take the same ones):
    ``steps`` steps of ``batch`` rows, no logging, saving, reporting or progress bars, AdamW at 1e-4, and
    an output directory (nothing is saved in it; the caller removes it) named ``prefix``..."""
    return dict(
        output_dir=tempfile.mkdtemp(prefix=prefix),
        max_steps=steps,
        per_device_train_batch_size=batch,
        report_to=[],
        save_strategy="no",
        logging_steps=10**6,
        disable_tqdm=True,
        dataloader_pin_memory=False,
        learning_rate=1e-4,
        **extra,
    )


def measure(
    model_name: str, seq: int, batch: int, steps: int, warmup: int, mode: str, bf16: bool, checkpointing: bool
) -> dict:
    """Seconds per step (wall and process CPU time) and peak memory of ``mode`` ('plain', 'dp' or
    'dp-checkpointing'; ``checkpointing``: gradient checkpointing in either mode), in this (fresh) process."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from hush_hf.trainer import SecretProtectionTrainer

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    model, causal = build_model(model_name, seq)
    dataset = random_batch(model.config.vocab_size, batch, seq, causal)
    total = warmup + steps
    common = timed_run_arguments(
        "step_overhead_",
        total,
        batch,
        bf16=bf16,
        use_cpu=not cuda,
        gradient_checkpointing=checkpointing or mode == "dp-checkpointing",
    )
    times: list[float] = []
    cpu_times: list[float] = []
    rss = PeakRss() if not cuda else None

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            if state.global_step == warmup:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                else:
                    rss.__enter__()
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            if state.global_step > warmup:
                times.append(time.perf_counter() - self.start)
                cpu_times.append(time.process_time() - self.cpu_start)

    if mode == "plain":
        trainer = Trainer(
            model=model,
            args=TrainingArguments(**common),
            train_dataset=dataset,
            data_collator=collate,
            callbacks=[StepClock()],
        )
    else:
        from hush_hf.trainer import SecretProtectionConfig

        plan = uniform_plan(dataset, batch, float(batch), total)
        trainer = SecretProtectionTrainer(
            model=model,
            # The step's cost does not depend on the guarantee: sigma is set, not certified.
            args=SecretProtectionConfig(**common, noise_multiplier=1.0),
            train_dataset=plan.attach(dataset),  # rows are verified against the plan
            data_collator=collate,
            plan=plan,
            callbacks=[StepClock()],
        )
    trainer.train()
    shutil.rmtree(common["output_dir"], ignore_errors=True)
    if cuda:
        peak = torch.cuda.max_memory_allocated()
    else:
        rss.__exit__()
        peak = rss.peak
    return {
        "seconds": statistics.median(times),
        "cpu_seconds": statistics.median(cpu_times),
        "peak_bytes": int(peak),
        "device": torch.cuda.get_device_name() if cuda else f"cpu x{torch.get_num_threads()} threads",
    }


def run_isolated(model: str, seq: int, args: argparse.Namespace, mode: str) -> dict:
    """``measure`` in a fresh interpreter, so that one run's memory cannot inflate the next one's."""
    spec = json.dumps(
        {
            "model": model,
            "seq": seq,
            "batch": args.batch,
            "steps": args.steps,
            "warmup": args.warmup,
            "mode": mode,
            "bf16": args.bf16,
            "checkpointing": args.gradient_checkpointing,
        }
    )
    path = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
    )
    result = subprocess.run(
        [sys.executable, __file__, "--_measure", spec],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    if result.returncode != 0:
        raise RuntimeError(f"{mode} {model} seq={seq} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: seq 128, batch 8, 2 timed steps")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--seqs", nargs="+", type=int, default=[128, 256])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision for both trainers")
    parser.add_argument(
        "--compare",
        choices=("plain", "checkpointing"),
        default="plain",
        help="plain: plain Trainer vs DP (default); checkpointing: DP vs DP with gradient checkpointing",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="gradient checkpointing for both contenders (with --compare plain: plain+ckpt vs DP+ckpt)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds per model and length")
    parser.add_argument("--_measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._measure:
        spec = json.loads(args._measure)
        warnings.filterwarnings("ignore")
        print(
            json.dumps(
                measure(
                    spec["model"],
                    spec["seq"],
                    spec["batch"],
                    spec["steps"],
                    spec["warmup"],
                    spec["mode"],
                    spec["bf16"],
                    spec["checkpointing"],
                )
            )
        )
        return
    if args.quick:
        args.seqs, args.batch, args.steps = [128], 8, 2

    if args.gradient_checkpointing and args.compare == "checkpointing":
        parser.error("--gradient-checkpointing goes with --compare plain (checkpointing on both sides)")
    base, other = ("plain", "dp") if args.compare == "plain" else ("dp", "dp-checkpointing")
    print(
        f"batch {args.batch}, {args.steps} timed steps after {args.warmup} warm-up; bf16={args.bf16}; "
        f"gradient checkpointing on both: {args.gradient_checkpointing}; {args.rounds} round(s)"
    )
    print(f"{base} against {other}")
    header = (
        f"{'model':<13} {'seq':>4} {'round':>5} {'base s/step':>12} {'other s/step':>12} {'time x':>7} "
        f"{'cpu time x':>10} {'base peak MB':>13} {'other peak MB':>13} {'memory x':>8}"
    )
    print(header)
    device = None
    for model in args.models:
        for seq in args.seqs:
            wall, cpu = [], []
            for round_ in range(1, args.rounds + 1):
                first = run_isolated(model, seq, args, base)
                second = run_isolated(model, seq, args, other)
                device = first["device"]
                wall.append(second["seconds"] / first["seconds"])
                cpu.append(second["cpu_seconds"] / first["cpu_seconds"])
                print(
                    f"{model:<13} {seq:>4} {round_:>5} {first['seconds']:>12.4f} {second['seconds']:>12.4f} "
                    f"{wall[-1]:>7.2f} {cpu[-1]:>10.2f} {first['peak_bytes'] / 2**20:>13.0f} "
                    f"{second['peak_bytes'] / 2**20:>13.0f} "
                    f"{second['peak_bytes'] / first['peak_bytes']:>8.2f}",
                    flush=True,
                )
            if args.rounds > 1:
                print(
                    f"{model:<13} {seq:>4} {'med':>5} {'':>12} {'':>12} {statistics.median(wall):>7.2f} "
                    f"{statistics.median(cpu):>10.2f}",
                    flush=True,
                )
    print(f"device: {device}")


if __name__ == "__main__":
    main()
