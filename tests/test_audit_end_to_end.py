"""The issue's acceptance test: without noise, inserted canaries reach high exposure; trained with
hush_hf (canaries declared as secrets), their exposure stays near chance, and the audit says so.

Two tiny GPT-2 runs of 200 DP steps on CPU (a few seconds each).
"""

import warnings

import datasets
import numpy as np
import pytest
import torch
from transformers import DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel

from hush_hf.audit.canaries import CanarySpace, canary_secret_records, insert_canaries, make_canaries
from hush_hf.audit.card import write_protection_artifacts
from hush_hf.audit.exposure import CHANCE_EXPOSURE_BITS, canary_exposures
from hush_hf.audit.run import run_audit
from hush_hf.secrets import SecretSet
from hush_hf.trainer import SecretProtectionConfig, SecretProtectionTrainer
from tests.test_audit_toys import (
    CHARS,
    char_tokenizer,
    one_torch_thread,  # noqa: F401 (autouse fixture)
)

SPACE = CanarySpace(template="My code is: {secret}.", alphabet="0123456789", length=3)  # |R| = 1000
WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta", "lambda", "zeta"]
STEPS = 200


def training_data():
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=4)) + "." for _ in range(64)]
    # Canaries 0-3 inserted 8 times each; canary 4 never (a control scored like the others).
    canaries = make_canaries(5, repetitions=[8, 8, 8, 8, 0], space=SPACE, seed=1)
    train, _ = insert_canaries(texts, canaries, seed=2)
    tokenizer = char_tokenizer()
    dataset = datasets.Dataset.from_dict({"text": train}).map(lambda b: tokenizer(b["text"]), batched=True)
    secrets = SecretSet.from_records(canary_secret_records(canaries[:4], target_posterior=1e-2))  # p = 1e-3
    return dataset, tokenizer, canaries, secrets


def train(dataset, tokenizer, secrets, output_dir, *, noise_multiplier, lp_c):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(CHARS), n_positions=64, n_embd=64, n_layer=2, n_head=2,
                                       bos_token_id=None, eos_token_id=None, pad_token_id=0))
    args = SecretProtectionConfig(
        output_dir=str(output_dir), max_steps=STEPS, per_device_train_batch_size=16, expected_batch_size=8,
        learning_rate=1e-2, per_example_clip_norm=1.0, noise_multiplier=noise_multiplier, lp_c=lp_c,
        dp_seed=1234, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the explicit dp_seed and the noise-free baseline warn loudly
        trainer = SecretProtectionTrainer(model=model, args=args, train_dataset=dataset, secrets=secrets,
                                          data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
                                          processing_class=tokenizer)
        trainer.train()
    return trainer


@pytest.fixture(scope="module")
def data():
    return training_data()


def test_without_noise_canaries_are_exposed(data, tmp_path):
    dataset, tokenizer, canaries, secrets = data
    # c = 16 keeps every example (weight 1) and sigma = 0: plain clipped SGD, the non-private baseline.
    trainer = train(dataset, tokenizer, secrets, tmp_path, noise_multiplier=0.0, lp_c=16.0)
    assert np.all(trainer.plan.weights == 1.0)
    exposures = canary_exposures(trainer.model, tokenizer, canaries, method="exact", batch_size=1000)
    inserted = [e.exposure for e in exposures if e.repetitions > 0]
    assert np.mean(inserted) > 6.0 and max(inserted) > 8.0  # of at most log2(1000) = 9.97 bits


def test_with_hush_exposure_stays_near_chance_and_the_audit_reports_it(data, tmp_path):
    dataset, tokenizer, canaries, secrets = data
    trainer = train(dataset, tokenizer, secrets, tmp_path / "run", noise_multiplier=None, lp_c=1.0)
    plan = trainer.plan
    assert plan.meets_targets and plan.noise_multiplier > 0.5
    model_dir = tmp_path / "model"
    trainer.save_model(str(model_dir))
    write_protection_artifacts(model_dir, plan, clip_norm=trainer.args.per_example_clip_norm,
                               noise_multiplier=trainer.dp.noise_multiplier,
                               dp_steps=trainer.state.global_step, model_name="tiny")

    report = run_audit(model_dir, output_dir=tmp_path / "audit", secrets=secrets, canaries=canaries,
                       exposure_method="exact", num_alternatives=200, batch_size=1000)
    exposure = report["attacks"]["exposure"]
    # Chance: exposure ~ Exp(ln 2), mean 1/ln 2 = 1.44 bits; 4 chance canaries average >= 3.5 bits w.p. ~1%.
    assert exposure["inserted"]["count"] == 4
    assert exposure["chance_mean"] == pytest.approx(CHANCE_EXPOSURE_BITS)
    assert exposure["inserted"]["mean"] < 3.5
    reconstruction = report["attacks"]["reconstruction"]
    assert reconstruction["num_evaluated"] == 4 and reconstruction["num_ranked_first"] == 0
    assert reconstruction["mean_probability"] <= reconstruction["mean_bound_at_candidate_prior"]
    training = report["training"]
    assert training["noise_multiplier"] == plan.noise_multiplier and training["bounds_hold"]
    assert training["clip_norm"] == 1.0
    assert "4 protected secrets" in (model_dir / "README.md").read_text()
