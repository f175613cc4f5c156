"""Evaluation on rows holding secrets is outside the plan: counted, warned about (counts only), and stated
on the model card when evaluations ran on them."""

from __future__ import annotations

import logging

import datasets
import numpy as np
import pytest

from hush_hf.cli import main as hush
from hush_hf.trainer import SecretProtectionTrainer
from hush_hf.trainer.evaluation import secret_rows
from tests.test_trainer_helpers import (
    dp_config,
    make_plan,
    pad_collate,
    single_thread,  # noqa: F401  (autouse fixture)
    tiny_gpt2,
    token_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")

SECRET = "alpha"
TRAIN_TEXTS = ["alpha beta", "gamma", "alpha", "delta", "epsilon", "zeta", "eta", "theta"]
EVAL_TEXTS = ["the alpha run", "gamma", "Alpha", "delta"]  # rows 0 and 2 hold the secret


def test_evaluating_on_rows_with_secrets_warns_with_the_count_and_the_card_says_so(tmp_path):
    (tmp_path / "secrets.csv").write_text(f"id,prior,target,terms\ns0,1e-3,0.2,{SECRET}\n")
    train = token_dataset(8).add_column("text", TRAIN_TEXTS)
    evaluation = token_dataset(4, seed=5).add_column("text", EVAL_TEXTS)
    with pytest.warns(UserWarning) as caught:
        trainer = SecretProtectionTrainer(
            model=tiny_gpt2(),
            args=dp_config(tmp_path / "out", secrets_file=str(tmp_path / "secrets.csv"), max_steps=2,
                           expected_batch_size=2.0, eval_strategy="steps", eval_steps=1),
            train_dataset=train,
            eval_dataset=evaluation,
            data_collator=pad_collate,
        )
    (message,) = [str(w.message) for w in caught if "eval dataset" in str(w.message)]
    expected = sum(SECRET in text.lower() for text in EVAL_TEXTS)
    assert expected == 2
    assert message.startswith(f"eval dataset 'eval': {expected} of 4 rows hold protected secrets.")
    assert "NOT covered by the protection plan" in message and SECRET not in message.lower()
    trainer.save_model(str(tmp_path / "before"))
    assert "### Evaluation" not in (tmp_path / "before" / "README.md").read_text()  # nothing evaluated yet
    trainer.train()
    assert [log for log in trainer.state.log_history if "eval_loss" in log]
    trainer.save_model(str(tmp_path / "after"))
    card = (tmp_path / "after" / "README.md").read_text()
    assert "### Evaluation" in card
    assert (f"**Evaluation metrics are not covered.** The evaluations run during training (eval) included "
            f"{expected} rows that hold protected secrets.") in card
    assert SECRET not in card.lower()
    assert hush(["verify", str(tmp_path / "after")]) == 0  # the note is stated, not certified


def test_named_eval_datasets_and_evaluate_calls_are_recorded_per_metric_prefix(tmp_path, caplog):
    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0, rows=token_dataset(8))
    clean = token_dataset(4, seed=5).add_column("secret_ids", [[], [], [], []])
    holding = token_dataset(3, seed=6).add_column("secret_ids", [[0], [], [0, 0]])
    with pytest.warns(UserWarning, match=r"eval dataset 'holding': 2 of 3 rows hold protected secrets"):
        trainer = SecretProtectionTrainer(
            model=tiny_gpt2(),
            args=dp_config(tmp_path, max_steps=2),
            train_dataset=plan.attach(token_dataset(8)),
            eval_dataset={"clean": clean, "holding": holding},
            data_collator=pad_collate,
            plan=plan,
        )
    trainer.evaluate()
    assert trainer.dp.evaluation.ran == {"eval_clean": 0, "eval_holding": 2}
    with caplog.at_level(logging.WARNING, logger="hush_hf.trainer.evaluation"):
        trainer.evaluate(eval_dataset=token_dataset(2, seed=7), metric_key_prefix="test")  # cannot be checked
    assert "eval dataset 'test' could not be checked for secrets" in caplog.text
    assert trainer.dp.evaluation.card_section() == {
        "evaluations": ["eval_holding", "test"], "rows_with_secrets": 2, "unchecked": ["test"],
    }
    trainer.save_model(str(tmp_path / "final"))
    card = (tmp_path / "final" / "README.md").read_text()
    assert ("(eval_holding, test) included 2 rows that hold protected secrets and data that could not be "
            "checked for secrets (test)") in card


def test_secret_rows_reads_marks_secret_ids_or_tags_the_text():
    from hush_hf import mark_secrets
    from hush_hf.assets import gpt2_tokenizer
    from hush_hf.secrets import SecretSet

    secrets = SecretSet.from_records([{"id": "s0", "prior": 1e-3, "target": 0.2, "terms": [SECRET]}])
    raw = datasets.Dataset.from_dict({"text": EVAL_TEXTS})
    tokenizer = mark_secrets(gpt2_tokenizer(), secrets)
    marked = raw.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])
    assert secret_rows(marked) == 2  # per-token marks
    assert secret_rows(raw, secrets=secrets) == 2  # tagged from the text
    assert secret_rows(raw) is None  # nothing to tell by
    assert secret_rows(raw.add_column("secret_ids", [[], [1], [], []])) == 1


def test_a_plain_trainer_made_private_with_attach_warns_and_its_card_says_so(tmp_path):
    from transformers import Trainer

    from hush_hf.trainer import GhostClippingCallback

    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0, rows=token_dataset(8))
    trainer = Trainer(
        model=tiny_gpt2(),
        args=dp_config(tmp_path, max_steps=2),
        train_dataset=plan.attach(token_dataset(8)),
        eval_dataset=token_dataset(3, seed=6).add_column("secret_ids", [[0], [], []]),
        data_collator=pad_collate,
    )
    with pytest.warns(UserWarning, match=r"eval dataset 'eval': 1 of 3 rows hold protected secrets"):
        GhostClippingCallback.attach(trainer, plan)
    trainer.evaluate()  # routed by attach: recorded like SecretProtectionTrainer.evaluate
    trainer.save_model(str(tmp_path / "final"))
    card = (tmp_path / "final" / "README.md").read_text()
    assert ("**Evaluation metrics are not covered.** The evaluations run during training (eval) included "
            "1 rows that hold protected secrets.") in card


def secrets_file(tmp_path):
    path = tmp_path / "secrets.csv"
    path.write_text(f"id,prior,target,terms\ns0,1e-3,0.2,{SECRET}\n")
    return path


@pytest.mark.parametrize("route", ["SecretProtectionTrainer", "attach"])
def test_predict_on_rows_with_secrets_is_counted_warned_and_noted_on_the_card(tmp_path, route):
    """The attack: predict() returns predictions and metrics computed from rows holding secrets; before,
    nothing was counted or noted (only evaluate() was)."""
    from transformers import Trainer

    from hush_hf.trainer import GhostClippingCallback

    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0, rows=token_dataset(8))
    train = plan.attach(token_dataset(8))
    if route == "attach":
        trainer = Trainer(model=tiny_gpt2(), args=dp_config(tmp_path, max_steps=2), train_dataset=train,
                          data_collator=pad_collate)  # fmt: skip
        GhostClippingCallback.attach(trainer, plan)
    else:
        args = dp_config(tmp_path, max_steps=2)
        trainer = SecretProtectionTrainer(
            model=tiny_gpt2(), args=args, train_dataset=train, data_collator=pad_collate, plan=plan
        )
    test_rows = token_dataset(3, seed=6).add_column("secret_ids", [[0], [], [0]])
    with pytest.warns(UserWarning, match=r"eval dataset 'test': 2 of 3 rows hold protected secrets"):
        trainer.predict(test_rows)
    trainer.save_model(str(tmp_path / "final"))
    card = (tmp_path / "final" / "README.md").read_text()
    assert "(test) included 2 rows that hold protected secrets" in card


def test_stale_eval_secret_ids_are_counted_from_the_text(tmp_path, caplog):
    """The attack: an eval set tagged, then its text changed by a map, so its secret_ids say no row holds
    a secret (all empty) while two do; before, it was counted as clean."""
    from hush_hf.secrets import SecretSet, tag_dataset, tagger_for

    secrets = SecretSet.from_csv(secrets_file(tmp_path))
    tagged = tag_dataset(datasets.Dataset.from_dict({"text": ["x", "y", "z", "w"]}), tagger_for(secrets))
    assert all(ids == [] for ids in tagged["secret_ids"])
    stale = tagged.map(lambda row, i: {"text": EVAL_TEXTS[i]}, with_indices=True)
    with caplog.at_level(logging.WARNING, logger="hush_hf.trainer.evaluation"):
        assert secret_rows(stale, secrets=secrets) == 2
    assert "stale" in caplog.text and SECRET not in caplog.text.lower()
    with caplog.at_level(logging.WARNING, logger="hush_hf.trainer.evaluation"):
        assert secret_rows(stale) is None  # no secrets to tag the text with: unknown, never "clean"
