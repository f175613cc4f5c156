"""Two CPU processes (gloo, `accelerate launch --config_file configs/accelerate/cpu_2proc.yaml`) train
exactly the model one process trains: same logical batches, disjoint shares, clipped sums added up,
noise added once. Run as a script, this file is the worker each launched process executes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.launching import REPO, accelerate_launch

CONFIG = REPO / "configs" / "accelerate" / "cpu_2proc.yaml"
N, STEPS, SEED = 14, 3, 5551212


def train_once(
    output_dir: str, resume: str | None = None, dtype: torch.dtype | None = None, **overrides
) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The run both tests compare: micro-batches of 2, varying rho, noise on; ``dtype``: the model
    loaded in it (bf16: every rank's clipped sums are float32 until the noise, whatever it drew)."""
    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import (
        dp_config,
        make_plan,
        pad_collate,
        parameters,
        tiny_gpt2,
        token_dataset,
    )

    model = tiny_gpt2(seed=0).to(dtype or torch.float32)
    rows = token_dataset(N, seed=4)
    plan = make_plan(np.linspace(0.2, 0.9, N), steps=STEPS, noise_multiplier=0.6, rows=rows)
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(
            output_dir,
            max_steps=STEPS,
            **{
                "per_device_train_batch_size": 2,
                "dp_seed": SEED,
                "learning_rate": 0.05,
                "per_example_clip_norm": 0.5,
                **overrides,
            },
        ),
        train_dataset=plan.attach(token_dataset(N, seed=4)),
        data_collator=pad_collate,
        plan=plan,
    )
    trainer.train(resume_from_checkpoint=resume)
    return parameters(model), trainer.state.log_history


def coupled_refusal(output_dir: str, use_cpu: bool = True) -> str:
    """The error of a run whose per-example loss is normalised over the batch (refused by the first
    step's independence check, on every rank); "not refused" otherwise."""
    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import dp_config, make_plan, pad_collate, tiny_gpt2, token_dataset

    class BatchNormalised(SecretProtectionTrainer):
        def compute_per_example_loss(self, model, inputs):
            losses = super().compute_per_example_loss(model, inputs)
            return losses / losses.mean()

    rows = token_dataset(N, seed=4)
    plan = make_plan(np.full(N, 0.5), steps=1, noise_multiplier=0.6, rows=rows)
    trainer = BatchNormalised(
        model=tiny_gpt2(seed=0),
        args=dp_config(output_dir, max_steps=1, per_device_train_batch_size=2, dp_seed=SEED, use_cpu=use_cpu),
        train_dataset=plan.attach(rows),
        data_collator=pad_collate,
        plan=plan,
    )
    try:
        trainer.train()
    except ValueError as error:
        return str(error)
    return "not refused"


def resume_with_the_seed_on_rank_zero_only(folder: Path, rank: int) -> tuple[float, float]:
    """A run with a drawn seed and a checkpoint at step 1, resumed where only rank 0's dp_state_dir holds
    the seed (rank 1's is empty): (largest difference to the uninterrupted run, 1.0 if a resume with
    rank 0's folder empty too was refused on this rank)."""
    uninterrupted, _ = train_once(str(folder / "run"), dp_seed=None, save_strategy="steps", save_steps=1)
    own = folder / f"empty_{rank}"
    state_dir = os.environ["HUSH_HF_DP_STATE_DIR"] if rank == 0 else str(own)
    resumed, _ = train_once(
        str(folder / f"resumed_{rank}"), resume=str(folder / "run" / "checkpoint-1"), dp_seed=None,
        dp_state_dir=state_dir,
    )
    diff = max(float((resumed[n] - v).abs().max()) for n, v in uninterrupted.items())
    try:
        train_once(str(folder / f"refused_{rank}"), resume=str(folder / "run" / "checkpoint-1"), dp_seed=None,
                   dp_state_dir=str(own))
        refused = 0.0
    except ValueError as error:
        refused = float(str(error).startswith("cannot resume checkpoint"))
    return diff, refused


def worker(out_path: str) -> None:
    import torch.distributed as dist

    from hush_hf.trainer.distributed import all_reduce_sum_, check_replicas_agree, rank_and_world_size

    params, logs = train_once(str(Path(out_path).parent / "run"))
    bf16_params, _ = train_once(str(Path(out_path).parent / "bf16"), dtype=torch.bfloat16, optim="sgd")
    rank, world_size = rank_and_world_size()
    resume_diff, refused = resume_with_the_seed_on_rank_zero_only(Path(out_path).parent / "resume", rank)
    refusals = torch.tensor([refused])
    dist.all_reduce(refusals)
    # The bucketed all-reduce: many buckets, mixed shapes and dtypes, every rank contributes rank + 1.
    tensors = [
        torch.full((3, 5), rank + 1.0),
        torch.full((7,), rank + 1.0, dtype=torch.float64),
        torch.full((2, 2, 2), rank + 1.0),
    ]
    all_reduce_sum_(tensors, bucket_numel=8)
    check_replicas_agree(tensors)  # equal after the sum: passes
    try:
        check_replicas_agree([torch.zeros(3), torch.full((2,), float(rank))])
        disagreement_caught = False
    except RuntimeError:
        disagreement_caught = True  # on every rank, not only where it differs
    caught = torch.tensor([float(disagreement_caught)])
    dist.all_reduce(caught)
    refusal = coupled_refusal(str(Path(out_path).parent / "coupled"))
    refused = torch.tensor([float(refusal.startswith("example independence check failed"))])
    dist.all_reduce(refused)  # reached by both ranks: neither waits in a collective the other skipped
    if rank == 0:
        torch.save(
            {
                "params": params,
                "bf16_params": bf16_params,
                "logs": logs,
                "world_size": world_size,
                "reduced": tensors,
                "caught": caught.item(),
                "refused": refused.item(),
                "refusal": refusal,
                "resume_diff": resume_diff,
                "refusals": refusals.item(),
            },
            out_path,
        )
    dist.barrier()
    dist.destroy_process_group()  # join gloo's threads now, not in static destructors at exit


from tests.test_trainer_helpers import single_thread  # noqa: E402,F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")


def test_two_processes_train_the_same_model_as_one(tmp_path):
    out = tmp_path / "two.pt"
    accelerate_launch(CONFIG, __file__, str(out))
    two = torch.load(out, weights_only=False)
    assert two["world_size"] == 2

    one_params, one_logs = train_once(str(tmp_path / "one"))
    sizes = [log["dp_batch_size"] for log in one_logs if "loss" in log]
    assert sizes == [log["dp_batch_size"] for log in two["logs"] if "loss" in log]  # same logical batches
    assert max(sizes) > 2  # micro-batches and both ranks had work
    for name, value in one_params.items():
        torch.testing.assert_close(two["params"][name], value, rtol=0, atol=1e-6)
    # A model loaded in bf16: the ranks' float32 clipped sums are reduced, noised and rounded once, as
    # one process does (they differ only by the order of float32 additions, within bf16 rounding). SGD:
    # AdamW's m / sqrt(v) turns a one-ulp difference in a near-zero gradient entry into a full step.
    one_bf16, _ = train_once(str(tmp_path / "one_bf16"), dtype=torch.bfloat16, optim="sgd")
    for name, value in one_bf16.items():
        assert two["bf16_params"][name].dtype == torch.bfloat16
        torch.testing.assert_close(two["bf16_params"][name].float(), value.float(), rtol=2.0**-7, atol=1e-4)

    expected = [
        torch.full((3, 5), 3.0),
        torch.full((7,), 3.0, dtype=torch.float64),
        torch.full((2, 2, 2), 3.0),
    ]
    for got, want in zip(two["reduced"], expected, strict=True):
        assert torch.equal(got, want)
    assert two["caught"] == 2.0  # replicas that disagree are detected on both ranks
    # A loss normalised over the batch is refused at the first step on both ranks (no rank left waiting).
    assert two["refused"] == 2.0, two["refusal"]
    # Resumed with the seed in rank 0's dp_state_dir only: exact; with none: refused on both ranks.
    assert two["resume_diff"] <= 1e-6
    assert two["refusals"] == 2.0


if __name__ == "__main__":
    worker(sys.argv[1])
