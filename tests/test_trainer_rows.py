"""The rows trained are the rows planned (issue 18 s4), through SecretProtectionTrainer and through
GhostClippingCallback.attach on a plain Trainer: the issue's three attacks are refused before any step,
the happy paths (same rows; tokenized with the marking tokenizer) train, and the published plan holds
no per-row digest."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import torch
from transformers import Trainer, TrainingArguments

from hush_hf.planning import ProtectionPlan, plan_protection
from hush_hf.secrets import SecretSet, mark_secrets, tag_dataset, tagger_for
from hush_hf.trainer import GhostClippingCallback, SecretProtectionTrainer
from tests.test_trainer_helpers import dp_config, pad_collate, single_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given", "ignore:.*mark more than")

SECRET = "falcon"
SECRETS = SecretSet.from_records([{"name": "falcon", "p": 1e-4, "r": 5e-2, "terms": [SECRET]}])
N, HOLDING = 24, (2, 7, 11, 19)  # 4 of the 24 rows hold the secret


def texts(suffix: str = "") -> list[str]:
    return [f"row {i} says {SECRET if i in HOLDING else 'nothing'}{suffix}" for i in range(N)]


@pytest.fixture(scope="module")
def tokenizer():
    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer

    return gpt2_tokenizer()


def tokenize(tokenizer, data: datasets.Dataset, **kwargs) -> datasets.Dataset:
    def encode(batch):
        out = tokenizer(batch["text"])
        return {**out, "labels": out["input_ids"]}

    return data.map(encode, batched=True, **kwargs)


def tiny_lm(vocab: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=8, n_layer=1, n_head=2, n_positions=32))


def tagged_tokens(tokenizer, suffix: str = "") -> datasets.Dataset:
    """Text and its tokens in every row, tagged on the text (secret_ids and tagged-text digests)."""
    data = tokenize(tokenizer, datasets.Dataset.from_dict({"text": texts(suffix)}))
    return tag_dataset(data, tagger_for(SECRETS), num_secrets=1)


def appended_after_tagging(tokenizer, rows: datasets.Dataset) -> datasets.Dataset:
    """The issue's map: the secret appended to every row (text and tokens) after tagging."""

    def append(row):
        text = row["text"] + f" {SECRET}"
        out = tokenizer(text)
        return {"text": text, **out, "labels": out["input_ids"]}

    return rows.map(append)


def plain_trainer(tmp_path, tokenizer, dataset) -> Trainer:
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, max_grad_norm=0.0,
        report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", learning_rate=1e-2,
    )  # fmt: skip
    return Trainer(model=tiny_lm(len(tokenizer)), args=args, train_dataset=dataset, data_collator=pad_collate)


def refused(call, match: str) -> str:
    with pytest.raises(ValueError, match=match) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and SECRET not in message.lower() and "nothing" not in message
    return message


def test_secret_protection_trainer_trains_its_rows_and_refuses_the_issue_attacks(tmp_path, tokenizer):
    marked = mark_secrets(tokenizer, SECRETS)
    tokens = tokenize(marked, datasets.Dataset.from_dict({"text": texts()}), remove_columns=["text"])
    trainer = SecretProtectionTrainer(
        model=tiny_lm(len(tokenizer)), args=dp_config(tmp_path / "run", save_strategy="steps", save_steps=1),
        train_dataset=tokens, data_collator=pad_collate, secrets=SECRETS,
    )  # fmt: skip
    assert list(trainer.plan.secrets.num_examples) == [4]
    assert trainer.plan.rows.columns == ("attention_mask", "input_ids", "labels")
    trainer.train()
    assert trainer.state.global_step == 2
    trainer.save_model()
    local = trainer.plan.save(tmp_path / "plan.json", include_fingerprint=True)
    key = json.loads(local.read_text())["rows"]["key"]
    for published in (
        tmp_path / "run" / "hush_plan.json",
        tmp_path / "run" / "checkpoint-2" / "hush_plan.json",
    ):
        text = published.read_text()
        assert "rows" not in json.loads(text) and key not in text, published
        assert ProtectionPlan.load(published).rows is None

    def with_plan(dataset):
        return SecretProtectionTrainer(
            model=tiny_lm(len(tokenizer)), args=dp_config(tmp_path / "again"), train_dataset=dataset,
            data_collator=pad_collate, plan=str(local),
        )  # fmt: skip

    with_plan(tokens)  # the same rows (marks included): accepted
    planned = trainer.train_dataset  # secret_ids from the marks, marks dropped
    # 1. shuffled, secret_ids removed
    refused(
        lambda: with_plan(planned.shuffle(seed=0).remove_columns("secret_ids")),
        r"train_dataset differs from the rows the plan was made from at \d+ of 24 rows \(first: row \d+\)",
    )
    # 2. 24 unrelated rows, each holding the secret
    unrelated = tokenize(marked, datasets.Dataset.from_dict({"text": [f"{SECRET} {i}" for i in range(N)]}),
                         remove_columns=["text"])  # fmt: skip
    refused(lambda: with_plan(unrelated), "differs from the rows the plan was made from at 24 of 24 rows")
    # 3. the secret appended to every row after tagging: stale ids are refused before planning
    stale = appended_after_tagging(tokenizer, tagged_tokens(tokenizer))
    refused(
        lambda: SecretProtectionTrainer(
            model=tiny_lm(len(tokenizer)),
            args=dp_config(tmp_path / "stale"),
            train_dataset=stale,
            data_collator=pad_collate,
            secrets=SECRETS,
        ),  # fmt: skip
        r"'secret_ids' were tagged from other text than column 'text' holds now, at 24 of 24 rows \(first",
    )


def test_ghost_clipping_callback_on_a_plain_trainer_refuses_the_issue_attacks(tmp_path, tokenizer):
    rows = tagged_tokens(tokenizer)
    plan = plan_protection(rows, SECRETS.priors, SECRETS.targets, expected_batch_size=4.0, steps=2)
    assert list(plan.secrets.num_examples) == [4]
    appended = appended_after_tagging(tokenizer, rows)
    attacks = {
        "shuffled": rows.shuffle(seed=0).remove_columns("secret_ids"),
        "unrelated": tokenize(tokenizer, datasets.Dataset.from_dict({"text": texts(f" {SECRET}")})),
        "appended": appended,
    }
    for name, dataset in attacks.items():
        differ = np.flatnonzero(
            [a != b for a, b in zip(dataset["input_ids"], rows["input_ids"], strict=True)]
        )
        trainer = plain_trainer(tmp_path / name, tokenizer, dataset)
        refused(lambda trainer=trainer: GhostClippingCallback.attach(trainer, plan),
                f"train_dataset differs from the rows the plan was made from at {differ.size} of 24 rows "
                rf"\(first: row {differ[0]}\)")  # fmt: skip
    # A plan bound to the appended rows but counting the 4 stale memberships (4 in the plan, 24 in the rows):
    stale_plan = plan_protection(appended["secret_ids"], SECRETS.priors, SECRETS.targets,
                                 expected_batch_size=4.0, steps=2).bound_to(appended)  # fmt: skip
    assert list(stale_plan.secrets.num_examples) == [4]
    assert sum(len(tagger_for(SECRETS)(t)) for t in appended["text"]) == 24
    trainer = plain_trainer(tmp_path / "stale", tokenizer, appended)
    stale = r"tagged from other text than column 'text' holds now, at 24 of 24 rows \(first: row 0"
    refused(lambda: GhostClippingCallback.attach(trainer, stale_plan), stale)
    # The rows it was made from, attached: trains.
    trainer = plain_trainer(tmp_path / "ok", tokenizer, plan.attach(rows))
    GhostClippingCallback.attach(trainer, plan, dp_seed=7)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def test_secret_ids_whose_text_is_gone_train_with_a_loud_warning_saying_what_is_trusted(tmp_path, tokenizer):
    rows = tagged_tokens(tokenizer).remove_columns("text")
    with pytest.warns(UserWarning, match=r"cannot be checked against the text they were tagged from \(column "
                                         r"'text' is gone\): they are trusted") as caught:  # fmt: skip
        trainer = SecretProtectionTrainer(
            model=tiny_lm(len(tokenizer)), args=dp_config(tmp_path), train_dataset=rows,
            data_collator=pad_collate, secrets=SECRETS,
        )  # fmt: skip
    assert not any(SECRET in str(w.message).lower() for w in caught)
    assert list(trainer.plan.secrets.num_examples) == [4] and trainer.plan.rows is not None


def test_a_map_style_dataset_of_dict_rows_is_planned_and_bound_like_a_dataset(tmp_path, tokenizer):
    secret_ids = [[0] if i in HOLDING else [] for i in range(N)]
    rows = [
        {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": ids, "secret_ids": secret_ids[i]}
        for i, ids in enumerate(tokenizer(texts())["input_ids"])
    ]
    trainer = SecretProtectionTrainer(
        model=tiny_lm(len(tokenizer)), args=dp_config(tmp_path), train_dataset=rows,
        data_collator=pad_collate, secrets=SECRETS,
    )  # fmt: skip
    assert list(trainer.plan.secrets.num_examples) == [4]
    assert trainer.plan.rows.columns == ("attention_mask", "input_ids", "labels")
    trainer.train()
    assert trainer.state.global_step == 2
    trainer.train_dataset = rows[1:] + rows[:1]
    with pytest.raises(ValueError, match="differs from the rows the plan was made from at 24 of 24 rows"):
        trainer.dp.train_dataloader(trainer)
