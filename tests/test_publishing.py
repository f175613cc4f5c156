"""What a DP run publishes: an allow-list up to the Hub commit (HfApi mocked, no network), and no
statistics of the drawn batches (total_flos, token counts) in logs, metrics or trainer_state.json.
A plain ``Trainer`` made private with ``GhostClippingCallback.attach`` publishes the same files with the
same content as ``SecretProtectionTrainer`` (TRL's ``SFTTrainer``: tests/test_trl.py)."""

from __future__ import annotations

import json
import os
import stat
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from huggingface_hub import HfApi
from transformers import Trainer, TrainingArguments

from hush_hf.cli import main as hush
from hush_hf.trainer import GhostClippingCallback
from hush_hf.trainer.publishing import publishable_files
from tests.test_trainer import build, files_holding, seed_encodings, stored_seed
from tests.test_trainer_helpers import (
    make_plan,
    pad_collate,
    single_thread,  # noqa: F401  (autouse fixture)
    tiny_gpt2,
    token_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")

PUBLISHED = {
    "README.md", "config.json", "generation_config.json", "model.safetensors", "hush_plan.json",
    "privacy_report.json", "privacy_report.md", "bound_over_target.png", "targets.png",
}


@pytest.fixture
def commits(monkeypatch):
    """Every commit the code under test makes: (paths in the commit, kwargs); nothing leaves the machine."""
    made = []

    def create_repo(self, repo_id, **kwargs):
        return SimpleNamespace(repo_id=repo_id if "/" in repo_id else f"me/{repo_id}")

    def create_commit(self, repo_id, operations, **kwargs):
        made.append(({op.path_in_repo for op in operations}, {"repo_id": repo_id, **kwargs}))
        if kwargs.get("run_as_future"):
            future = Future()
            future.set_result(None)
            return future
        return SimpleNamespace(commit_url="https://example.invalid/commit")

    def refuse(self, *args, **kwargs):
        raise AssertionError("upload_folder must not be used: it uploads a whole folder")

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    monkeypatch.setattr(HfApi, "upload_folder", refuse)
    return made


def attached(tmp_path, n=8, **overrides):
    """``build``'s trainer as a plain ``Trainer`` with ``GhostClippingCallback.attach`` (same model, data,
    plan, seed and optimizer settings)."""
    steps = overrides.get("max_steps", 2)
    plan = make_plan(np.full(n, 0.5), steps=steps, noise_multiplier=1.0, rows=token_dataset(n))
    values = dict(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, max_grad_norm=0.0, report_to=[],
        use_cpu=True, disable_tqdm=True, save_strategy="no", logging_steps=1, learning_rate=1e-2,
        lr_scheduler_type="constant", dataloader_pin_memory=False,
    )  # fmt: skip
    trainer = Trainer(
        model=tiny_gpt2(seed=0),
        args=TrainingArguments(**{**values, **overrides}),
        train_dataset=plan.attach(token_dataset(n)),
        data_collator=pad_collate,
    )
    GhostClippingCallback.attach(trainer, plan, clip_norm=1.0, dp_seed=1234)
    return trainer


def run_clm_style_outputs(trainer):
    """What transformers' run_clm.py leaves in output_dir after training, besides the model."""
    result = trainer.train()
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)  # train_results.json and all_results.json
    trainer.save_state()  # trainer_state.json
    out = trainer.args.output_dir
    runs = Path(out) / "runs" / "events"
    runs.mkdir(parents=True)
    (runs / "events.out.tfevents.0").write_bytes(b"loss per step")
    return result


@pytest.mark.parametrize("make", [build, attached], ids=["SecretProtectionTrainer", "Trainer+attach"])
def test_push_to_hub_uploads_only_the_allow_list(tmp_path, commits, make):
    trainer = make(tmp_path, max_steps=2, save_strategy="steps", save_steps=2, hub_model_id="me/tiny")
    run_clm_style_outputs(trainer)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"trainer_state.json", "train_results.json", "all_results.json", "runs", "checkpoint-2",
            "training_args.bin"} <= names  # present locally...
    trainer.push_to_hub()
    (paths, kwargs), = commits
    assert paths == PUBLISHED  # ...but never uploaded
    assert kwargs["repo_id"] == "me/tiny" and kwargs["run_as_future"] is False

    trainer.push_to_hub(extra_files=["trainer_state.json", "runs"])  # named explicitly: uploaded
    assert commits[1][0] == PUBLISHED | {"trainer_state.json", "runs/events/events.out.tfevents.0"}
    with pytest.raises(ValueError, match="extra_files: 'nope.json' does not exist"):
        trainer.push_to_hub(extra_files=["nope.json"])
    assert len(commits) == 2


@pytest.mark.parametrize("make", [build, attached], ids=["SecretProtectionTrainer", "Trainer+attach"])
def test_pushes_during_training_go_through_the_allow_list(tmp_path, commits, make):
    trainer = make(
        tmp_path, max_steps=2, save_strategy="steps", save_steps=1, push_to_hub=True,
        hub_model_id="me/tiny", hub_strategy="every_save", hub_always_push=True,
    )
    trainer.train()
    trainer._finish_current_push()
    assert len(commits) == 2  # one per save (checkpoint-1 and checkpoint-2 exist locally by then)
    for paths, kwargs in commits:
        assert paths == PUBLISHED and kwargs["run_as_future"] is True
        assert not any(p.startswith("checkpoint-") for p in paths)


def test_attach_saves_what_secret_protection_trainer_saves(tmp_path, capsys):
    """Same plan, seed and data: the same files, the same weights, plan and report (but for the model
    name, the output folder's), and ``hush verify`` accepts both."""
    saved = {}
    for name, make in [("reference", build), ("attached", attached)]:
        trainer = make(tmp_path / name, max_steps=2)
        trainer.train()
        trainer.save_model()
        folder = tmp_path / name
        saved[name] = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
        assert hush(["verify", str(folder)]) == 0, capsys.readouterr()
        assert "Secret protection" in (folder / "README.md").read_text()
    reference, attached_files = saved["reference"], saved["attached"]
    assert set(reference) == set(attached_files) == PUBLISHED | {"training_args.bin"}
    for name in ("model.safetensors", "hush_plan.json"):
        assert reference[name] == attached_files[name], name
    reports = [json.loads(files["privacy_report.json"].decode().replace(label, "MODEL"))
               for files, label in [(reference, "reference"), (attached_files, "attached")]]  # fmt: skip
    assert reports[0] == reports[1]


def test_a_dp_run_logs_no_flos_or_token_counts(tmp_path):
    trainer = build(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    result = trainer.train()
    assert "total_flos" not in result.metrics and "train_loss" in result.metrics
    assert trainer.state.total_flos == 0 and trainer.state.num_input_tokens_seen == 0
    for log in trainer.state.log_history:
        assert not {"total_flos", "num_input_tokens_seen"} & set(log)
    saved = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert saved["total_flos"] == 0
    assert all("total_flos" not in log for log in saved["log_history"])


def test_publishable_files_picks_model_tokenizer_and_protection_files(tmp_path):
    for name in ["model-00001-of-00002.safetensors", "model.safetensors.index.json", "adapter_config.json",
                 "adapter_model.safetensors", "tokenizer.json", "vocab.txt", "merges.txt",
                 "special_tokens_map.json", "privacy_report.md", "eval_results.json", "trainer_state.json",
                 "training_args.bin", "optimizer.pt", "hush_dp_state.json", "notes.txt"]:
        (tmp_path / name).write_text("x")
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / "model.safetensors").write_text("x")
    assert publishable_files(tmp_path) == sorted([
        "adapter_config.json", "adapter_model.safetensors", "merges.txt", "model-00001-of-00002.safetensors",
        "model.safetensors.index.json", "privacy_report.md", "special_tokens_map.json", "tokenizer.json",
        "vocab.txt",
    ])
    assert "notes.txt" in publishable_files(tmp_path, ["notes.txt"])


def test_no_file_under_output_dir_holds_the_seed_it_is_in_the_private_state_dir(
    tmp_path, private_dp_state_dir, commits
):
    """A run with checkpoints, save_model(), save_state() and a push of a checkpoint folder: no file under
    output_dir (recursively, any file, any encoding of the seed) holds the drawn seed; it is in
    dp_state_dir/<run id>.json, owner-only in an owner-only folder, and every checkpoint names that run."""
    out = tmp_path / "out"
    trainer = build(
        out, max_steps=4, save_strategy="steps", save_steps=2, hub_model_id="me/tiny", dp_seed=None
    )
    trainer.train()
    trainer.save_model()  # the final output, beside the checkpoints
    trainer.save_state()
    seed, seed_file = stored_seed(private_dp_state_dir, out, 4)
    assert seed_file.parent == private_dp_state_dir
    assert stat.S_IMODE(os.stat(seed_file).st_mode) == 0o600
    assert list(private_dp_state_dir.iterdir()) == [seed_file]  # one file per run, nothing else
    assert stored_seed(private_dp_state_dir, out, 2) == (seed, seed_file)
    assert seed.bit_length() > 64  # drawn from the OS (128 bits), so no accidental match below
    assert files_holding(private_dp_state_dir, seed) == [f"{seed_file.name} (decimal)"]  # the search works
    assert {"hush_state.json", "hush_plan.json", "model.safetensors"} <= set(os.listdir(out / "checkpoint-4"))
    assert files_holding(out, seed) == []
    trainer.push_to_hub(extra_files=["checkpoint-4"])  # the checkpoint uploaded on purpose: still no seed
    ((paths, _),) = commits
    assert "checkpoint-4/hush_state.json" in paths
    uploaded = {name: (out / name).read_bytes() for name in paths}
    assert not [n for n, data in uploaded.items() for b in seed_encodings(seed).values() if b in data]
