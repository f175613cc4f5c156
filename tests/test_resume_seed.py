"""A resume uses the run's own seed or none (issue 26 §4): the attack first, then the check that stops it.

A checkpoint records a keyed digest of its run's seed (HMAC-SHA256 keyed with a random key kept in the
seed file); a seed file with the right run id but another valid seed is refused in one line naming it."""

from __future__ import annotations

import hashlib
import hmac
import json

import numpy as np
import pytest
import torch

from hush_hf.trainer.seed_store import load_dp_seed, new_run_id, save_dp_seed, seed_commitment, seed_path
from tests.test_trainer import SEED, build, files_holding, seed_encodings
from tests.test_trainer_helpers import make_plan, parameters, single_thread, tiny_gpt2  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")


def interrupted_run(tmp_path):
    """4 planned steps, stopped after the checkpoint at step 2: (its run id, the seed file, kwargs)."""
    plan = make_plan(np.full(10, 0.4), steps=4, noise_multiplier=0.7)
    kwargs = dict(plan=plan, max_steps=4, dp_seed=None, learning_rate=5e-2)
    first = build(tmp_path / "out", 10, save_strategy="steps", save_steps=2, **kwargs)
    first.train()
    state = json.loads((tmp_path / "out" / "checkpoint-2" / "hush_state.json").read_text())
    return state, first, kwargs


def test_a_seed_file_with_the_right_run_id_but_another_seed_is_refused(tmp_path, private_dp_state_dir):
    state, first, kwargs = interrupted_run(tmp_path)
    run_id, path = state["run_id"], seed_path(private_dp_state_dir, state["run_id"])
    own = path.read_bytes()
    # The attack: another valid seed file for the same run id (another seed, its own key), put in place.
    forged_folder = tmp_path / "forged"
    save_dp_seed(forged_folder, run_id, SEED)
    path.write_bytes(seed_path(forged_folder, run_id).read_bytes())
    resumed = build(tmp_path / "out", 10, model=tiny_gpt2(seed=9), **kwargs)
    before = parameters(resumed.model)
    with pytest.raises(ValueError) as info:
        resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert message.startswith(f"cannot resume checkpoint '{tmp_path / 'out' / 'checkpoint-2'}': DP seed file "
                              f"'{path}' has the run id {run_id} but not the seed of the run that saved the "
                              "checkpoint")
    assert all(v.decode("latin-1") not in message for v in seed_encodings(SEED).values())
    assert resumed.state.global_step == 0
    for name, value in parameters(resumed.model).items():
        assert torch.equal(value, before[name]), name  # no step taken with the wrong randomness
    # The same seed under another key is not the run's file either (the file is written once per run).
    data = json.loads(own)
    path.write_text(json.dumps({**data, "digest_key": "ab" * 32}))
    with pytest.raises(ValueError, match="not the seed of the run that saved the checkpoint"):
        build(tmp_path / "out", 10, **kwargs).train(resume_from_checkpoint=True)
    path.write_bytes(own)  # the run's own file: the resume is exact
    again = build(tmp_path / "out", 10, model=tiny_gpt2(seed=9), **kwargs)
    again.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    for name, value in parameters(again.model).items():
        assert torch.equal(value, parameters(first.model)[name]), name


def test_the_digest_is_hmac_sha256_of_run_id_and_seed_and_shows_nothing_of_the_seed(tmp_path):
    run_id = new_run_id()
    path = save_dp_seed(tmp_path / "state", run_id, 7)  # an explicit, guessable seed
    key = bytes.fromhex(json.loads(path.read_text())["digest_key"])
    message = b"hush_hf dp seed commitment\0" + run_id.encode() + b"\0" + (7).to_bytes(16, "big")
    expected = hmac.new(key, message, hashlib.sha256).hexdigest()
    commitment = seed_commitment(tmp_path / "state", run_id)
    assert commitment == "hmac-sha256:" + expected
    assert save_dp_seed(tmp_path / "state", run_id, 7) == path  # written once: the key, and the digest
    assert seed_commitment(tmp_path / "state", run_id) == commitment  # every checkpoint records, stay
    guesses = {"hmac-sha256:" + hmac.new(b"", run_id.encode() + str(s).encode(), hashlib.sha256).hexdigest()
               for s in range(100)} | {"hmac-sha256:" + hashlib.sha256(f"{run_id}{s}".encode()).hexdigest()
                                       for s in range(100)}
    assert commitment not in guesses  # without the key, a small seed cannot be found by trying seeds
    assert load_dp_seed(tmp_path / "state", run_id, checkpoint=None, commitment=commitment) == 7
    other = "hmac-sha256:" + "0" * 64
    with pytest.raises(ValueError, match=f"DP seed file '{path}' has the run id {run_id} but not the seed"):
        load_dp_seed(tmp_path / "state", run_id, checkpoint=None, commitment=other)


def test_checkpoints_record_the_digest_and_no_seed_and_older_states_are_refused(tmp_path,
                                                                               private_dp_state_dir):
    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0)
    build(tmp_path, plan=plan, save_strategy="steps", save_steps=1, dp_seed=SEED).train()
    state_file = tmp_path / "checkpoint-1" / "hush_state.json"
    state = json.loads(state_file.read_text())
    assert state["format_version"] == 3
    assert state["seed_digest"] == seed_commitment(private_dp_state_dir, state["run_id"])
    assert json.loads((tmp_path / "checkpoint-2" / "hush_state.json").read_text())["seed_digest"] \
        == state["seed_digest"]
    assert files_holding(tmp_path, SEED) == []
    # A checkpoint saved before the digest existed cannot show which seed file is its run's.
    older = {k: v for k, v in state.items() if k != "seed_digest"}
    state_file.write_text(json.dumps({**older, "format_version": 2}))
    refused = "format_version=2 is not supported .*version 2 checkpoints record no digest of the seed"
    with pytest.raises(ValueError, match=refused):
        build(tmp_path, plan=plan).train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    state_file.write_text(json.dumps({**state, "seed_digest": "sha256:" + "0" * 64}))
    with pytest.raises(ValueError, match="seed_digest must be 'hmac-sha256:' and 64 hex digits"):
        build(tmp_path, plan=plan).train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    # A seed file of format 1 (no key) is refused in one line, never trusted.
    path = seed_path(private_dp_state_dir, state["run_id"])
    path.write_text(json.dumps({"format_version": 1, "run_id": state["run_id"], "dp_seed": str(SEED)}))
    state_file.write_text(json.dumps(state))
    with pytest.raises(ValueError, match=f"DP seed file '{path}': format_version 1 holds no digest key"):
        build(tmp_path, plan=plan).train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
