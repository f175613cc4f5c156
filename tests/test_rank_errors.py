"""A check that fails on one rank fails every rank at once (2 CPU processes, gloo), never a hang.

Each scenario below makes one check of the DP step fail on one rank only; before, the other rank went
on into the next collective and waited there until the process group's timeout (30 min by default; the
worker sets ``ddp_timeout`` to 20 s, so a hang shows as a gloo timeout error instead of a frozen test).
Now the failing rank raises its own error and every other rank raises ``rank k refused: <that error>``
at the same synchronisation point, before any optimizer step applies the step's gradient. Run as a
script, this file is the worker each launched process executes.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from transformers import TrainerCallback

from tests.launching import REPO, accelerate_launch

CONFIG = REPO / "configs" / "accelerate" / "cpu_2proc.yaml"
TIMEOUT_S = 20  # the process group's timeout in the worker: a rank left waiting fails after it

# scenario: (failing rank, error class, start of the failing rank's message, steps run, ranks whose weights
# changed, max_steps)
SCENARIOS = {
    "loss_shape": (1, "ValueError", "per_example_loss must return a tensor of shape", 0, (), 2),
    "first_step_check": (1, "ValueError", "per_example_loss must return a tensor of shape", 0, (), 2),
    "buffer_write": (0, "ValueError", "layer 'transformer.ln_f' (RunningCount) writes its buffer", 0, (), 2),
    "gradient_write": (1, "RuntimeError", "the gradient of parameter", 0, (), 2),
    "write_between_steps": (1, "ValueError", "trainable parameter 'transformer.wte.weight'", 1, (0, 1), 2),
    # written after the noise: rank 1's optimizer step applies nothing, both ranks refuse at the next step
    # (the ranks next meet there), or at the end of the run after the last step
    "gradient_after_noise": (1, "RuntimeError", "the gradient of parameter", 1, (0,), 2),
    "gradient_after_noise_last_step": (1, "RuntimeError", "the gradient of parameter", 1, (0,), 1),
}


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class RunningCount(nn.Module):
    """A LayerNorm counting its training calls with gradients in a buffer, on rank ``rank`` only."""

    def __init__(self, inner: nn.LayerNorm, rank: int) -> None:
        super().__init__()
        self.inner, self.rank = inner, rank
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled() and _rank() == self.rank:
            self.calls.add_(1)
        return self.inner(x)


class WriteOnOneRank(TrainerCallback):
    """On ``rank`` only: scales a trainable gradient in ``on_pre_optimizer_step`` (before or after the noise,
    by where it is in line), or writes a parameter after step 0."""

    def __init__(self, rank: int, what: str) -> None:
        self.rank, self.what = rank, what

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.what == "gradient" and _rank() == self.rank:
            next(p for p in model.parameters() if p.requires_grad).grad.mul_(0.5)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.what == "parameter" and _rank() == self.rank and state.global_step == 1:
            with torch.no_grad():
                next(p for p in model.parameters() if p.requires_grad).mul_(1.0)


def run_scenario(name: str, folder: Path) -> dict:
    """Train 2 steps with ``name``'s one-rank failure: what this rank raised, how long it took, and whether
    the weights moved beyond the steps the scenario expects."""
    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import (
        dp_config,
        make_plan,
        pad_collate,
        parameters,
        tiny_gpt2,
        token_dataset,
    )

    failing, max_steps = SCENARIOS[name][0], SCENARIOS[name][-1]

    class OneRankLoss(SecretProtectionTrainer):
        def compute_per_example_loss(self, model, inputs):
            losses = super().compute_per_example_loss(model, inputs)
            wrong = name == "first_step_check" or (name == "loss_shape" and torch.is_grad_enabled())
            return losses[:, None] if wrong and _rank() == failing else losses

    model = tiny_gpt2(seed=0)
    if name == "buffer_write":
        model.transformer.ln_f = RunningCount(model.transformer.ln_f, failing)
    rows = token_dataset(8, seed=3)
    plan = make_plan(np.full(8, 0.9), steps=max_steps, noise_multiplier=1.0, rows=rows)
    trainer = OneRankLoss(
        model=model,
        args=dp_config(
            folder / name, max_steps=max_steps, per_device_train_batch_size=1, ddp_timeout=TIMEOUT_S
        ),
        train_dataset=plan.attach(rows),
        data_collator=pad_collate,
        plan=plan,
    )
    if name == "gradient_write":  # before the DP callback: its write lands between the backward and the noise
        trainer.callback_handler.callbacks.insert(0, WriteOnOneRank(failing, "gradient"))
    if name.startswith("gradient_after_noise"):  # after the DP callback: between the noise and the optimizer
        trainer.add_callback(WriteOnOneRank(failing, "gradient"))
    if name == "write_between_steps":
        trainer.add_callback(WriteOnOneRank(failing, "parameter"))
    before = parameters(model)
    start = time.monotonic()
    try:
        trainer.train()
        kind, message = "none", ""
    except Exception as error:  # noqa: BLE001  (what each rank raised is the result)
        kind, message = type(error).__name__, str(error)
    seconds = time.monotonic() - start
    unchanged = all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    return {"kind": kind, "message": message, "seconds": seconds, "steps": trainer.state.global_step,
            "unchanged": unchanged}


COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_object", "broadcast_object_list",
               "barrier")


def collectives_per_step(folder: Path) -> tuple[dict[str, float], dict[str, int]]:
    """Calls of each torch.distributed collective per DP step of a run without an error (a 3-step run less
    a 1-step run, halved), and in the whole 1-step run."""
    import collections

    import torch.distributed as dist

    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import dp_config, make_plan, pad_collate, tiny_gpt2, token_dataset

    counts: collections.Counter = collections.Counter()
    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def counting(name):
        def call(*args, **kwargs):
            counts[name] += 1
            return originals[name](*args, **kwargs)
        return call

    runs = {}
    try:
        for name in COLLECTIVES:
            setattr(dist, name, counting(name))
        for steps in (1, 3):
            rows = token_dataset(8, seed=3)
            plan = make_plan(np.full(8, 0.9), steps=steps, noise_multiplier=1.0, rows=rows)
            args = dp_config(folder / f"count_{steps}", max_steps=steps, per_device_train_batch_size=1,
                             logging_steps=1000, ddp_timeout=TIMEOUT_S)
            trainer = SecretProtectionTrainer(model=tiny_gpt2(seed=0), args=args, plan=plan,
                                              train_dataset=plan.attach(rows), data_collator=pad_collate)
            before = counts.copy()
            trainer.train()
            runs[steps] = {name: counts[name] - before[name] for name in COLLECTIVES}
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
    return {name: (runs[3][name] - runs[1][name]) / 2 for name in COLLECTIVES}, runs[1]


def worker(out_path: str) -> None:
    import torch.distributed as dist

    results: dict = {"collectives": collectives_per_step(Path(out_path).parent)}
    results |= {name: run_scenario(name, Path(out_path).parent) for name in SCENARIOS}
    torch.save(results, f"{out_path}.{_rank()}")
    if dist.is_initialized():
        dist.destroy_process_group()  # join gloo's threads now, not in static destructors at exit


from tests.test_trainer_helpers import single_thread  # noqa: E402,F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")


@pytest.mark.slow  # two launched processes importing transformers: ~30 s (fast: test_rank_agreement.py)
def test_a_check_failing_on_one_rank_fails_every_rank_at_once_with_that_ranks_error(tmp_path):
    out = tmp_path / "ranks.pt"
    accelerate_launch(CONFIG, __file__, str(out), timeout=150)
    ranks = [torch.load(f"{out}.{rank}", weights_only=False) for rank in (0, 1)]
    # Without an error a DP step runs the collectives it ran before the failure flag rode on its count:
    # all-reduces of the clipped sums (one bucket here), of the drawn count (and flag), and of the replica
    # check's verdict after its broadcast; no message is gathered. The run adds one all-reduce at its end.
    per_step, one_step_run = ranks[0]["collectives"]
    assert per_step == {**dict.fromkeys(COLLECTIVES, 0.0), "all_reduce": 3.0, "broadcast": 1.0}
    assert one_step_run["all_gather_object"] == 0
    for name, (failing, kind, start, steps, moved, _) in SCENARIOS.items():
        found = ranks[failing][name]
        assert (found["kind"], found["message"][: len(start)]) == (kind, start), (name, found)
        assert "\n" not in found["message"]
        other = ranks[1 - failing][name]
        # the same error on the other rank, naming where it was found (not a gloo timeout)
        refused = f"rank {failing} refused: {found['message']}"
        assert (other["kind"], other["message"]) == (kind, refused), name
        for k, rank in enumerate(ranks):
            assert rank[name]["seconds"] < TIMEOUT_S, (name, rank[name]["seconds"])  # nobody waited it out
            assert rank[name]["steps"] == steps, name  # the refused step's gradient reached no optimizer
            assert rank[name]["unchanged"] == (k not in moved), (name, k)


if __name__ == "__main__":
    worker(sys.argv[1])
