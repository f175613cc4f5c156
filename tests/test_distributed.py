"""Two CPU processes (gloo, `accelerate launch --config_file configs/accelerate/cpu_2proc.yaml`) train
exactly the model one process trains: same logical batches, disjoint shares, clipped sums added up,
noise added once. Run as a script, this file is the worker each launched process executes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.launching import REPO, accelerate_launch

CONFIG = REPO / "configs" / "accelerate" / "cpu_2proc.yaml"
N, STEPS, SEED = 14, 3, 5551212


def train_once(output_dir: str) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The run both tests compare: micro-batches of 2, varying rho, noise on."""
    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import (
        dp_config,
        make_plan,
        pad_collate,
        parameters,
        tiny_gpt2,
        token_dataset,
    )

    model = tiny_gpt2(seed=0)
    rows = token_dataset(N, seed=4)
    plan = make_plan(np.linspace(0.2, 0.9, N), steps=STEPS, noise_multiplier=0.6, rows=rows)
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(
            output_dir,
            max_steps=STEPS,
            per_device_train_batch_size=2,
            dp_seed=SEED,
            learning_rate=0.05,
            per_example_clip_norm=0.5,
        ),
        train_dataset=plan.attach(token_dataset(N, seed=4)),
        data_collator=pad_collate,
        plan=plan,
    )
    trainer.train()
    return parameters(model), trainer.state.log_history


def worker(out_path: str) -> None:
    import torch.distributed as dist

    from hush_hf.trainer.distributed import all_reduce_sum_, check_replicas_agree, rank_and_world_size

    params, logs = train_once(str(Path(out_path).parent / "run"))
    rank, world_size = rank_and_world_size()
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
    if rank == 0:
        torch.save(
            {
                "params": params,
                "logs": logs,
                "world_size": world_size,
                "reduced": tensors,
                "caught": caught.item(),
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

    expected = [
        torch.full((3, 5), 3.0),
        torch.full((7,), 3.0, dtype=torch.float64),
        torch.full((2, 2, 2), 3.0),
    ]
    for got, want in zip(two["reduced"], expected, strict=True):
        assert torch.equal(got, want)
    assert two["caught"] == 2.0  # replicas that disagree are detected on both ranks


if __name__ == "__main__":
    worker(sys.argv[1])
