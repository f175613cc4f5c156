"""TRL's SFTTrainer with DP through the documented attach path (docs/trl.md), with the real ``trl``:
completion-only loss and 'wrapped' packing give one step's update equal to a torch.func reference
(each prepared row's gradient of the model's own loss, clipped, summed, divided by B), and so do
padding-free batches (``padding_free=True`` and TRL's default 'bfd' packing: each drawn row one
example); ``save_model`` and ``push_to_hub`` publish TRL's own model card with the Secret protection
section, the plan and the privacy report, through the allow-list."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from torch.func import functional_call, grad

from hush_hf.cli import main as hush
from hush_hf.trainer import GhostClippingCallback
from tests.test_publishing import commits  # noqa: F401  (fixture: Hub commits, no network)
from tests.test_trainer_helpers import make_plan, sgd, single_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings(
    "ignore:dp_seed was given", "ignore:noise_multiplier=0", "ignore::UserWarning", "ignore::FutureWarning"
)
CLIP = 1e-4

PROMPTS = ["the code for the lab is", "our project is called", "lunch today is", "the meeting moved to"]
COMPLETIONS = [" zebra four four seven one", " falcon", " pasta with tomato sauce", " friday at noon"]


def tiny_gpt2(vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_embd=16, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    return GPT2LMHeadModel(config).double()


def sft_trainer(tmp_path, **config):
    from trl import SFTConfig, SFTTrainer

    from hush_hf.assets import gpt2_tokenizer

    tokenizer = gpt2_tokenizer()
    model = tiny_gpt2(len(tokenizer))
    data = datasets.Dataset.from_dict({"prompt": PROMPTS, "completion": COMPLETIONS})
    args = SFTConfig(**{
        "output_dir": str(tmp_path), "max_steps": 1, "per_device_train_batch_size": 2, "max_grad_norm": 0.0,
        "report_to": [], "use_cpu": True, "disable_tqdm": True, "logging_steps": 1,
        "activation_checkpointing": False, "bf16": False, **config,
    })  # fmt: skip
    return SFTTrainer(
        model=model, args=args, train_dataset=data, processing_class=tokenizer, optimizers=sgd(model, lr=1.0)
    )


def reference_update(model, rows, expected_batch_size: float):
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}

    def own_loss(p, row):
        return functional_call(model, p, (), {k: v[None] for k, v in row.items()}).loss

    total = {n: torch.zeros_like(v) for n, v in params.items()}
    for row in rows:
        keys = [k for k in ("input_ids", "labels", "position_ids") if k in row]
        g = grad(own_loss)(params, {k: torch.tensor(row[k]) for k in keys})
        norm = torch.sqrt(sum((v**2).sum() for v in g.values()))
        assert norm > 10 * CLIP
        for n in total:
            total[n] += (CLIP / norm) * g[n]
    return {n: v / expected_batch_size for n, v in total.items()}


@pytest.mark.parametrize("config", [dict(completion_only_loss=True),
                                    dict(packing=True, packing_strategy="wrapped", max_length=8)],
                         ids=["completion-only", "wrapped-packing"])  # fmt: skip
def test_sft_step_equals_reference(tmp_path, config):
    trainer = sft_trainer(tmp_path, **config)
    rows = trainer.train_dataset
    if "packing" not in config:  # completion-only: the prompt tokens are not scored
        assert all(-100 in row["labels"] and row["labels"] != row["input_ids"] for row in rows)
    n = len(rows)
    plan = make_plan(np.ones(n), steps=1, noise_multiplier=1.0, rows=rows)
    trainer.train_dataset = plan.attach(rows)
    model = trainer.model
    expected = reference_update(model, rows, n)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    GhostClippingCallback.attach(trainer, plan, clip_norm=CLIP, noise_multiplier=0.0, dp_seed=7)
    trainer.train()
    for name, update in expected.items():
        change = before[name] - dict(model.named_parameters())[name].detach()
        assert (change - update).norm() <= 1e-5 * update.norm() + 1e-9, name


def flattened_reference_rows(rows):
    """Each prepared row as the model reads it in a padding-free batch, written out by hand: its own
    tokens, positions restarting at each packed document (TRL's ``seq_lengths``), no label at a
    document's first token (the flattening separator)."""
    out = []
    for row in rows:
        lengths = row.get("seq_lengths") or [len(row["input_ids"])]
        positions = [i for n in lengths for i in range(n)]
        labels = [-100 if p == 0 else t for p, t in zip(positions, row["labels"], strict=True)]
        out.append({"input_ids": row["input_ids"], "labels": labels, "position_ids": positions})
    return out


@pytest.mark.parametrize("config", [dict(padding_free=True, max_length=None),
                                    dict(packing=True, max_length=8)],  # TRL's default: 'bfd', padding-free
                         ids=["padding-free", "bfd-packing"])  # fmt: skip
def test_padding_free_step_clips_each_drawn_row(tmp_path, config):
    """Before, TRL's padding-free batches were refused (one flattened row would have been clipped as one
    example); now each drawn row is its own example, so the step equals the per-row reference."""
    trainer = sft_trainer(tmp_path, **config)
    assert trainer.padding_free
    rows = trainer.train_dataset
    n = len(rows)
    plan = make_plan(np.ones(n), steps=1, noise_multiplier=1.0, rows=rows)
    trainer.train_dataset = plan.attach(rows)
    model = trainer.model
    expected = reference_update(model, flattened_reference_rows(rows), n)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    GhostClippingCallback.attach(trainer, plan, clip_norm=CLIP, noise_multiplier=0.0, dp_seed=7)
    trainer.train()
    assert [log["dp_batch_size"] for log in trainer.state.log_history if "dp_batch_size" in log] == [n]
    for name, update in expected.items():
        change = before[name] - dict(model.named_parameters())[name].detach()
        assert (change - update).norm() <= 1e-5 * update.norm() + 1e-9, name


TRL_CARD = "It has been trained using [TRL](https://github.com/huggingface/trl)."
SECTION = "## Secret protection"
PUBLISHED = {
    "README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
    "tokenizer_config.json", "hush_plan.json", "privacy_report.json", "privacy_report.md",
    "bound_over_target.png", "targets.png",
}


def test_sft_trainer_publishes_trls_card_with_the_protection_artifacts(tmp_path, commits, capsys):  # noqa: F811
    trainer = sft_trainer(
        tmp_path, completion_only_loss=True, save_strategy="steps", save_steps=1, hub_model_id="me/tiny-sft"
    )
    prepared = trainer.train_dataset
    plan = make_plan(np.ones(len(prepared)), steps=1, noise_multiplier=1.0, rows=prepared)
    trainer.train_dataset = plan.attach(trainer.train_dataset)
    GhostClippingCallback.attach(trainer, plan, clip_norm=1.0)
    trainer.train()  # SFTTrainer writes its own card into output_dir with every checkpoint
    (tmp_path / "hush_plan.json").unlink()
    trainer.save_model()
    names = {p.name for p in tmp_path.iterdir()}
    assert PUBLISHED | {"checkpoint-1", "training_args.bin"} <= names
    card = (tmp_path / "README.md").read_text()
    assert TRL_CARD in card and card.count(SECTION) == 1 and card.index(TRL_CARD) < card.index(SECTION)
    assert hush(["verify", str(tmp_path), "--as-pushed"]) == 0, capsys.readouterr()
    assert hush(["verify", str(tmp_path)]) == 1  # all of output_dir: checkpoint-1's weights are not certified
    uncertified = "checkpoint-1/model.safetensors is a weight-like file the plan does not name"
    assert uncertified in capsys.readouterr().out

    trainer.create_model_card(model_name="tiny-sft")  # TRL rewrites README.md: the section comes back
    card = (tmp_path / "README.md").read_text()
    assert TRL_CARD in card and SECTION in card and card.index(TRL_CARD) < card.index(SECTION)

    trainer.push_to_hub()
    (paths, kwargs), = commits
    assert paths == PUBLISHED and kwargs["repo_id"] == "me/tiny-sft"
    card = (tmp_path / "README.md").read_text()  # what the commit uploaded
    assert TRL_CARD in card and card.count(SECTION) == 1
    assert hush(["verify", str(tmp_path), "--as-pushed"]) == 0, capsys.readouterr()
