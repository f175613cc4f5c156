"""What a checkpoint must keep for a DP run to resume exactly: the run id, the step, the plan.

Batch t and noise t are functions of ``(dp_seed, t)``, so the seed and the step counter are the whole
sampler and noise RNG state. The seed is secret and is NOT in the checkpoint: ``hush_state.json``
records the run's random id, and the seed is looked up under that id in the private ``dp_state_dir``
(:mod:`hush_hf.trainer.seed_store`), outside ``output_dir``, so no upload of ``output_dir`` or of a
checkpoint can carry it. The state also records the keyed digest of the seed (``seed_digest``), so a
resume can refuse a seed file that is not the run's own.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from hush_hf.jsonfile import read_json
from hush_hf.planning.plan import ProtectionPlan
from hush_hf.trainer.seed_store import check_commitment, check_run_id

RUN_STATE_NAME = "hush_state.json"
PLAN_NAME = "hush_plan.json"
RUN_STATE_VERSION = 3  # 1 held the seed itself; 2 did not bind the seed file to the run


@dataclass(frozen=True)
class RunState:
    """The DP parameters a run was started with and how far it got; ``run_id`` names its seed file."""

    run_id: str
    global_step: int
    noise_multiplier: float
    clip_norm: float
    expected_batch_size: float
    steps: int
    #: ``hmac-sha256:<hex>`` of the run's seed (:func:`hush_hf.trainer.seed_store.seed_commitment`);
    #: None only in a state being compared, never in one saved.
    seed_digest: str | None = None

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
    """Write ``hush_state.json`` (no secret in it) and ``hush_plan.json`` into the checkpoint ``folder``;
    ``state`` must carry its seed's digest."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"checkpoint folder {str(folder)!r} does not exist")
    check_commitment(state.seed_digest, f"DP state of checkpoint {str(folder)!r}")
    data = {"format_version": RUN_STATE_VERSION, **asdict(state)}
    (folder / RUN_STATE_NAME).write_text(json.dumps(data))
    plan.save(folder / PLAN_NAME)


def load_run_state(folder: str | Path) -> tuple[RunState, ProtectionPlan]:
    """Read what ``save_run_state`` wrote; a one-line error naming the file if it is missing or corrupt."""
    folder = Path(folder)
    path = folder / RUN_STATE_NAME
    if not path.is_file() or not (folder / PLAN_NAME).is_file():
        raise ValueError(
            f"checkpoint {str(folder)!r} has no {RUN_STATE_NAME}/{PLAN_NAME}: it was not saved by a DP run "
            "(GhostClippingCallback); resuming from it would restart the DP randomness"
        )
    names = [f.name for f in fields(RunState)]
    source = f"DP state file {str(path)!r}"
    data = read_json(path, what="DP state file", shown_keys=("format_version", *names))
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object, got a {type(data).__name__}")
    if data.get("format_version") != RUN_STATE_VERSION:
        raise ValueError(
            f"{source}: format_version={data.get('format_version')!r} is not supported (expected "
            f"{RUN_STATE_VERSION}; version 1 checkpoints hold the secret seed: delete them, never upload; "
            "version 2 checkpoints record no digest of the seed, so no seed file can be shown to be their "
            "run's: start again from step 0 with a fresh model)"
        )
    missing = [name for name in names if name not in data]
    if missing:
        raise ValueError(f"{source}: missing field {missing[0]!r}")
    state = RunState(
        run_id=check_run_id(data["run_id"], source),
        global_step=_field(data, "global_step", int, source),
        noise_multiplier=_field(data, "noise_multiplier", float, source),
        clip_norm=_field(data, "clip_norm", float, source),
        expected_batch_size=_field(data, "expected_batch_size", float, source),
        steps=_field(data, "steps", int, source),
        seed_digest=check_commitment(data["seed_digest"], source),
    )
    return state, ProtectionPlan.load(folder / PLAN_NAME)


def _field(data: dict, name: str, kind: type, source: str) -> int | float:
    value = data[name]
    wrong_type = isinstance(value, bool) or not isinstance(value, (int, float))
    if wrong_type or (kind is int and isinstance(value, float)):
        wanted = "an integer" if kind is int else "a number"
        raise ValueError(f"{source}: {name} must be {wanted}, got a {type(value).__name__}")
    return kind(value)


def same_sampling(a: ProtectionPlan, b: ProtectionPlan) -> bool:
    """Whether two plans sample every example with exactly the same probability."""
    return a.sampling_probs.shape == b.sampling_probs.shape and bool(
        np.array_equal(a.sampling_probs, b.sampling_probs)
    )
