"""SecretProtectionTrainer under FSDP2 on two CPU processes (gloo) trains exactly the model one process
trains: the same Poisson batches, disjoint shares, zero-weight filler micro-batches where a share is
short (or empty), clipped sums reduce-scattered to the shards, noise sliced per shard.

Launched with ``accelerate launch`` and ``configs/accelerate/fsdp.yaml`` (its ``fsdp_config``, with
``use_cpu: true``). accelerate 1.15 never turns FSDP on for CPU processes (``AcceleratorState`` sets
``DistributedType.FSDP`` only in its GPU-family branch; on CPU the run silently becomes MULTI_CPU/DDP),
so the worker opens exactly that gate (:func:`fsdp_on_cpu`, which also gives the plugin accelerate's
mixed precision policy, as that branch does); everything after it -- the plugin built from the
launcher's environment, ``fsdp2_prepare_model``, the Trainer's FSDP paths and checkpointing -- is the
real code. Also a resume from the sharded checkpoint of step 2, and the config with ``mixed_precision:
bf16`` (bf16 compute over float32 master weights). The same test on two GPUs (the config unchanged)
runs where two are present. Run as a script, this file is the worker each launched process executes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.launching import REPO, accelerate_launch
from tests.test_trainer_helpers import single_thread  # noqa: F401  (autouse fixture)

CONFIG = REPO / "configs" / "accelerate" / "fsdp.yaml"
N, STEPS, SEED, MICRO = 14, 4, 1022, 2
PROBS = np.linspace(0.02, 0.6, N)  # with SEED: batches of 1, 6, 5, 5 rows (see the test)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")


def fsdp_on_cpu() -> None:
    """Let accelerate run FSDP on CPU processes: after ``AcceleratorState`` chose MULTI_CPU, switch it to
    FSDP with the plugin it was given (what it does on GPUs)."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # as accelerate syncs it
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)  # bf16: its MixedPrecisionPolicy
            self.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = init


def train_once(
    output_dir: str, resume: str | None = None, model_name: str = "gpt2", **overrides
) -> tuple[dict[str, torch.Tensor], list[dict], object]:
    """The run both sides compare: micro-batches of 2, varying rho, noise on, AdamW; a tiny GPT-2 or
    Gemma-2 (tied embeddings both; Gemma-2: scaled embedding, RMSNorm, the mission's model)."""
    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import (
        dp_config,
        make_plan,
        pad_collate,
        tiny_gemma2,
        tiny_gpt2,
        token_dataset,
    )

    model = {"gpt2": tiny_gpt2, "gemma2": tiny_gemma2}[model_name](seed=0)
    plan = make_plan(PROBS, steps=STEPS, noise_multiplier=0.6, rows=token_dataset(N, seed=4))
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(
            output_dir,
            max_steps=STEPS,
            per_device_train_batch_size=MICRO,
            dp_seed=SEED,
            learning_rate=0.05,
            per_example_clip_norm=0.5,
            **overrides,
        ),
        train_dataset=plan.attach(token_dataset(N, seed=4)),
        data_collator=pad_collate,
        plan=plan,
    )
    trainer.train(resume_from_checkpoint=resume)
    return full_parameters(trainer.model), trainer.state.log_history, trainer


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a whole tensor (a collective for FSDP2 shards)."""
    from torch.distributed.tensor import DTensor

    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().clone()
        for n, p in model.named_parameters()
    }


def crt_under_fsdp(output_dir: Path, use_cpu: bool) -> str:
    """The error a CRT-mode trainer gets under FSDP (its public steps run a plain backward)."""
    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_crt import SECRET_IDS, crt_dataset
    from tests.test_trainer_helpers import dp_config, make_plan, pad_collate, tiny_gpt2

    plan = make_plan(np.full(6, 0.5), steps=1, noise_multiplier=2.0, secret_ids=SECRET_IDS,
                     rows=crt_dataset())
    args = dp_config(
        output_dir, max_steps=1, crt_schedule="interleave", crt_public_batch_size=2, use_cpu=use_cpu
    )
    try:
        SecretProtectionTrainer(
            model=tiny_gpt2(), args=args, train_dataset=crt_dataset(), data_collator=pad_collate, plan=plan
        )
    except ValueError as error:
        return str(error)
    return "not refused"


def saved_parameters(folder: Path) -> dict[str, torch.Tensor]:
    from transformers import GPT2LMHeadModel

    return {n: p.detach().clone() for n, p in GPT2LMHeadModel.from_pretrained(folder).named_parameters()}


def bf16_worker(out_path: str, device: str) -> None:
    """Launched with mixed_precision: bf16: the tiny GPT-2 and Gemma-2 runs, the FSDP policy accelerate
    built and the dtype of the (sharded) master weights."""
    import torch.distributed as dist

    from hush_hf.trainer.distributed import rank_and_world_size

    if device == "cpu":
        fsdp_on_cpu()
    results = {}
    for name in ("gpt2", "gemma2"):
        folder = str(Path(out_path).parent / name)
        params, logs, trainer = train_once(folder, model_name=name, use_cpu=device == "cpu")
        policy = trainer.accelerator.state.fsdp_plugin.mixed_precision_policy
        results[name] = params
        results[f"{name}_logs"] = logs
        results["policy"] = (policy.param_dtype, policy.reduce_dtype)
        results["mixed_precision"] = trainer.accelerator.mixed_precision
        results["master_dtypes"] = {p.dtype for p in trainer.model.parameters()}
    if rank_and_world_size()[0] == 0:
        torch.save(results, out_path)
    dist.barrier()
    dist.destroy_process_group()


def worker(out_path: str, device: str, precision: str = "no") -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from hush_hf.trainer.distributed import rank_and_world_size

    if precision == "bf16":
        bf16_worker(out_path, device)
        return
    if device == "cpu":
        fsdp_on_cpu()
    run = str(Path(out_path).parent / "run")
    params, logs, trainer = train_once(
        run, save_strategy="steps", save_steps=STEPS // 2, use_cpu=device == "cpu"
    )
    rank, world_size = rank_and_world_size()
    sharded = [n for n, p in trainer.model.named_parameters() if isinstance(p, DTensor)]
    # Resumed from the sharded checkpoint of step STEPS/2: the same model as the uninterrupted run.
    checkpoint = f"{run}/checkpoint-{STEPS // 2}"
    resumed, _, _ = train_once(
        str(Path(out_path).parent / "resumed"), resume=checkpoint, use_cpu=device == "cpu"
    )
    final = Path(out_path).parent / "final"
    trainer.save_model(str(final))  # whole weights, although checkpoints are sharded
    gemma2, _, _ = train_once(
        str(Path(out_path).parent / "gemma2"), model_name="gemma2", use_cpu=device == "cpu"
    )
    crt_refusal = crt_under_fsdp(Path(out_path).parent / "crt", use_cpu=device == "cpu")
    # The first step's independence check runs FSDP forwards (collectives) and refuses on both ranks.
    from tests.test_distributed import coupled_refusal

    refusal = coupled_refusal(str(Path(out_path).parent / "coupled"), use_cpu=device == "cpu")
    refused = torch.tensor([float(refusal.startswith("example independence check failed"))])
    dist.all_reduce(refused)
    if rank == 0:
        torch.save(
            {
                "params": params,
                "resumed": resumed,
                "gemma2": gemma2,
                "crt_refusal": crt_refusal,
                "refused": refused.item(),
                "refusal": refusal,
                "saved": sorted(os.listdir(final)),
                "saved_params": saved_parameters(final),
                "logs": logs,
                "world_size": world_size,
                "fsdp": trainer.is_fsdp_enabled,
                "sharded": sharded,
                "checkpoint": sorted(os.listdir(Path(run) / f"checkpoint-{STEPS}")),
            },
            out_path,
        )
    dist.barrier()
    dist.destroy_process_group()


def launch_two_processes(tmp_path: Path, device: str, precision: str = "no") -> dict:
    """Run :func:`worker` under ``accelerate launch`` with configs/accelerate/fsdp.yaml (``use_cpu`` on
    for ``device="cpu"``, its ``mixed_precision`` set to ``precision``); rank 0's results."""
    config = yaml.safe_load(CONFIG.read_text())
    assert config["distributed_type"] == "FSDP" and config["fsdp_config"]["fsdp_version"] == 2
    config["use_cpu"] = device == "cpu"
    config["mixed_precision"] = precision
    launch_config = tmp_path / "fsdp.yaml"
    launch_config.write_text(yaml.safe_dump(config))
    out = tmp_path / "two.pt"
    accelerate_launch(launch_config, __file__, str(out), device, precision)
    return torch.load(out, weights_only=False)


def check_equals_one_process(two: dict, tmp_path: Path, *, use_cpu: bool, atol: float) -> None:
    from hush_hf.sampling import WeightedPoissonSampler
    from tests.test_trainer_helpers import tiny_gpt2

    sizes = [len(WeightedPoissonSampler(PROBS, num_steps=STEPS, seed=SEED).batch(t)) for t in range(STEPS)]
    # Step 0: rank 1's share is empty, so its first micro-batch is a filler; steps 2-3: 3 + 2 rows, so
    # rank 1 runs one micro-batch and one filler.
    assert sizes == [1, 6, 5, 5]
    assert two["world_size"] == 2 and two["fsdp"]
    assert two["sharded"] == [n for n, _ in tiny_gpt2(seed=0).named_parameters()]  # every one sharded
    assert {"hush_state.json", "hush_plan.json"} <= set(two["checkpoint"])
    for name, value in two["params"].items():  # resumed from the sharded checkpoint of step 2
        torch.testing.assert_close(two["resumed"][name], value, rtol=0, atol=atol)
    assert two["crt_refusal"].startswith("crt_schedule='interleave' is not supported under FSDP")
    assert two["refused"] == 2.0, two["refusal"]  # a batch-normalised loss: refused on both ranks
    # save_model() wrote the whole trained model (loadable without FSDP) and the protection artifacts.
    assert {"model.safetensors", "hush_plan.json", "README.md"} <= set(two["saved"])
    assert two["saved_params"].keys() == two["params"].keys()
    for name, value in two["params"].items():
        assert torch.equal(two["saved_params"][name], value), name

    one_params, one_logs, _ = train_once(str(tmp_path / "one"), use_cpu=use_cpu)
    initial = dict(tiny_gpt2(seed=0).named_parameters())
    logged = [log["dp_batch_size"] for log in one_logs if "loss" in log]
    assert logged == sizes == [log["dp_batch_size"] for log in two["logs"] if "loss" in log]
    for name, value in one_params.items():
        assert (value - initial[name]).abs().max() > 1e-3  # every parameter moved
        torch.testing.assert_close(two["params"][name], value, rtol=0, atol=atol)
    one_gemma2, _, _ = train_once(str(tmp_path / "one_gemma2"), model_name="gemma2", use_cpu=use_cpu)
    assert one_gemma2.keys() == two["gemma2"].keys()
    for name, value in one_gemma2.items():
        torch.testing.assert_close(two["gemma2"][name], value, rtol=0, atol=atol)


@pytest.mark.slow  # two launched processes importing transformers, plus the 1-process run: ~45 s
def test_fsdp2_trainer_on_two_cpu_processes_trains_the_one_process_model(tmp_path):
    two = launch_two_processes(tmp_path, "cpu")
    check_equals_one_process(two, tmp_path, use_cpu=True, atol=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (the CPU test above always runs)")
def test_fsdp2_trainer_on_two_gpus_trains_the_one_gpu_model(tmp_path):
    """configs/accelerate/fsdp.yaml as it is (no CPU switch); the reference runs on one GPU, since the
    noise generator of a CUDA device (Philox) differs from the CPU's."""
    two = launch_two_processes(tmp_path, "cuda")
    check_equals_one_process(two, tmp_path, use_cpu=False, atol=1e-5)


def check_bf16_equals_one_process(two: dict, tmp_path: Path, *, use_cpu: bool) -> None:
    """FSDP2 under accelerate's mixed_precision: bf16 (bf16 compute and reduce_dtype, float32 master
    weights) against one process with bf16=True (bf16 autocast over float32 weights): the same batches
    and the same model up to bf16 rounding, which the two compute differently (FSDP rounds every weight
    to bf16, autocast only the matmul inputs). Measured: per tensor, ||two - one|| is at most 0.16% of the
    one-process run's ||update|| (GPT-2) and 0.32% (Gemma-2); a lost or doubled share would be ~100%."""
    from tests.test_trainer_helpers import tiny_gemma2, tiny_gpt2

    assert two["mixed_precision"] == "bf16" and two["policy"] == (torch.bfloat16, torch.bfloat16)
    assert two["master_dtypes"] == {torch.float32}  # accelerate keeps float32 master weights
    sizes = [log["dp_batch_size"] for log in two["gpt2_logs"] if "loss" in log]
    assert sizes == [1, 6, 5, 5]
    for name, make in (("gpt2", tiny_gpt2), ("gemma2", tiny_gemma2)):
        one, logs, _ = train_once(str(tmp_path / f"one_{name}"), model_name=name, use_cpu=use_cpu, bf16=True)
        assert [log["dp_batch_size"] for log in logs if "loss" in log] == sizes
        initial = dict(make(seed=0).named_parameters())
        worst = 0.0
        for key, value in one.items():
            update = value - initial[key].detach()
            assert update.abs().max() > 1e-3  # every parameter moved
            worst = max(worst, float((two[name][key] - value).norm() / update.norm()))
        assert worst <= 0.01, (name, worst)


@pytest.mark.slow  # two launched processes importing transformers, plus the 1-process runs: ~40 s
def test_fsdp2_trainer_in_bf16_on_two_cpu_processes_trains_the_one_process_bf16_model(tmp_path):
    """configs/accelerate/fsdp.yaml with mixed_precision: bf16 (gloo all-gathers and reduce-scatters bf16)."""
    two = launch_two_processes(tmp_path, "cpu", precision="bf16")
    check_bf16_equals_one_process(two, tmp_path, use_cpu=True)


if __name__ == "__main__":
    worker(*sys.argv[1:])
