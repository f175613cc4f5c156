"""What a checkpoint must keep for a DP run to resume exactly: the secret seed, the step, the plan.

Written into each ``checkpoint-*`` folder only (checkpoints hold weights trained on the private data
and are private anyway); never into logs, ``training_args.bin`` or the final ``save_model`` output.
Batch t and noise t are functions of ``(dp_seed, t)``, so the seed and the step counter are the
whole sampler and noise RNG state.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hush_hf.planning.plan import ProtectionPlan
from hush_hf.sampling.seeds import check_dp_seed

RUN_STATE_NAME = "hush_state.json"
PLAN_NAME = "hush_plan.json"
RUN_STATE_VERSION = 1


@dataclass(frozen=True)
class RunState:
    """The DP parameters a run was started with and how far it got."""

    dp_seed: int
    global_step: int
    noise_multiplier: float
    clip_norm: float
    expected_batch_size: float
    steps: int

    def __repr__(self) -> str:  # the seed is secret
        return (
            f"RunState(global_step={self.global_step}, noise_multiplier={self.noise_multiplier}, "
            f"clip_norm={self.clip_norm}, expected_batch_size={self.expected_batch_size}, steps={self.steps})"
        )

    def check_continues(self, other: RunState) -> None:
        """ValueError unless ``other`` (the resuming run) has the same DP parameters."""
        for name in ("noise_multiplier", "clip_norm", "expected_batch_size", "steps"):
            saved, now = getattr(self, name), getattr(other, name)
            if not math.isclose(saved, now, rel_tol=1e-12, abs_tol=0.0):
                raise ValueError(
                    f"cannot resume: the checkpoint was trained with {name}={saved!r} but this run has "
                    f"{name}={now!r}; the privacy accounting covers one setting for all steps"
                )


def save_run_state(folder: str | Path, state: RunState, plan: ProtectionPlan) -> None:
    """Write ``hush_state.json`` (owner-only permissions: it holds the seed) and ``hush_plan.json``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"checkpoint folder {str(folder)!r} does not exist")
    data = {"format_version": RUN_STATE_VERSION, **asdict(state), "dp_seed": str(state.dp_seed)}
    path = folder / RUN_STATE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    plan.save(folder / PLAN_NAME)


def load_run_state(folder: str | Path) -> tuple[RunState, ProtectionPlan]:
    """Read what ``save_run_state`` wrote; a clear error if the checkpoint is not from a DP run."""
    folder = Path(folder)
    path = folder / RUN_STATE_NAME
    if not path.is_file() or not (folder / PLAN_NAME).is_file():
        raise ValueError(
            f"checkpoint {str(folder)!r} has no {RUN_STATE_NAME}/{PLAN_NAME}: it was not saved by a DP run "
            "(GhostClippingCallback); resuming from it would restart the DP randomness"
        )
    data = json.loads(path.read_text())
    if data.get("format_version") != RUN_STATE_VERSION:
        raise ValueError(f"{path}: format_version={data.get('format_version')!r} is not supported")
    state = RunState(
        dp_seed=check_dp_seed(int(data["dp_seed"]), f"{RUN_STATE_NAME} dp_seed"),
        global_step=int(data["global_step"]),
        noise_multiplier=float(data["noise_multiplier"]),
        clip_norm=float(data["clip_norm"]),
        expected_batch_size=float(data["expected_batch_size"]),
        steps=int(data["steps"]),
    )
    return state, ProtectionPlan.load(folder / PLAN_NAME)


def same_sampling(a: ProtectionPlan, b: ProtectionPlan) -> bool:
    """Whether two plans sample every example with exactly the same probability."""
    return a.sampling_probs.shape == b.sampling_probs.shape and bool(
        np.array_equal(a.sampling_probs, b.sampling_probs)
    )
