"""SecretProtectionConfig: DP defaults, up-front validation, HfArgumentParser, a secret dp_seed."""

from __future__ import annotations

import pickle

import pytest
from transformers import HfArgumentParser, TrainingArguments

from hush_hf.trainer import SecretProtectionConfig
from hush_hf.trainer.config import as_secret_protection_config

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")

BASE = {"output_dir": "unused", "max_steps": 10, "report_to": [], "use_cpu": True}


def test_defaults_differ_from_training_arguments_where_dp_needs_it():
    config = SecretProtectionConfig(**BASE)
    assert config.max_grad_norm == 0.0 and TrainingArguments(**BASE).max_grad_norm > 0
    assert config.per_example_clip_norm == 1.0
    assert config.noise_multiplier is None and config.expected_batch_size is None and config.dp_seed is None
    assert config.accountant == "tight" and config.lp_c == 1.0 and config.secrets_text_column == "text"


def test_hf_argument_parser_reads_the_dp_fields():
    (config,) = HfArgumentParser(SecretProtectionConfig).parse_args_into_dataclasses(
        [
            "--output_dir",
            "o",
            "--max_steps",
            "7",
            "--per_example_clip_norm",
            "0.5",
            "--expected_batch_size",
            "64",
            "--noise_multiplier",
            "1.5",
            "--accountant",
            "rdp",
            "--lp_c",
            "0.25",
            "--secrets_file",
            "s.csv",
            "--report_to",
            "none",
            "--use_cpu",
            "true",
        ]
    )
    assert (config.max_steps, config.per_example_clip_norm, config.expected_batch_size) == (7, 0.5, 64.0)
    assert (config.noise_multiplier, config.accountant, config.lp_c, config.secrets_file) == (
        1.5,
        "rdp",
        0.25,
        "s.csv",
    )


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"gradient_accumulation_steps": 4}, "gradient_accumulation_steps must be 1, got 4"),
        ({"max_grad_norm": 1.0}, "max_grad_norm must be 0, got 1.0"),
        ({"per_example_clip_norm": 0.0}, "per_example_clip_norm must be a positive finite number, got 0.0"),
        (
            {"per_example_clip_norm": float("inf")},
            "per_example_clip_norm must be a positive finite number, got inf",
        ),
        ({"expected_batch_size": -2.0}, "expected_batch_size must be a positive finite number, got -2.0"),
        ({"max_steps": 0}, "max_steps must be an integer >= 1 .* got 0"),
        ({"max_steps": -1}, "max_steps must be an integer >= 1 .* got -1"),
        ({"noise_multiplier": -0.5}, "noise_multiplier must be None or a finite number >= 0, got -0.5"),
        ({"lp_c": 0.0}, "lp_c must be a positive finite number, got 0.0"),
        ({"accountant": "pld"}, "accountant must be one of .*, got 'pld'"),
        ({"dp_seed": -3}, "dp_seed must be an integer in"),
        ({"auto_find_batch_size": True}, "auto_find_batch_size=True is not supported"),
        ({"ignore_data_skip": True}, "ignore_data_skip=True is not supported"),
        ({"label_smoothing_factor": 0.1}, "label_smoothing_factor=0.1 is not supported"),
        (
            {"activation_checkpointing": True, "fsdp": True},
            "activation_checkpointing=True with fsdp=.* is not supported .* two backward passes",
        ),
        ({"secrets_file": "a.csv", "plan_file": "p.json"}, "give secrets_file or plan_file, not both"),
        ({"optim": "adalomo"}, "optim='adalomo' is not supported .* inside the backward pass"),
        ({"fsdp": True, "fsdp_config": {"version": 1}}, "fsdp_version=1 is not supported .*FSDP2"),
        ({"fsdp": True, "fsdp_config": {"cpu_offload": True}}, "fsdp cpu_offload is not supported"),
        ({"fsdp": "full_shard offload"}, "fsdp cpu_offload is not supported"),
        (
            {"fsdp": True, "fsdp_config": {"activation_checkpointing": True}},
            "fsdp_activation_checkpointing=True is not supported",
        ),
        ({"train_sampling_strategy": "group_by_length"}, "train_sampling_strategy='group_by_length' is not"),
        (
            {"push_to_hub": True, "hub_strategy": "checkpoint", "hub_model_id": "x/y"},
            "would upload checkpoints",
        ),
        ({"include_num_input_tokens_seen": True}, "include_num_input_tokens_seen='all' is not supported"),
        (
            {"include_num_input_tokens_seen": "non_padding"},
            "include_num_input_tokens_seen='non_padding' is not supported .* depends on which examples",
        ),
    ],
)
def test_bad_settings_are_refused_with_field_and_value(overrides, match):
    with pytest.raises(ValueError, match=match):
        SecretProtectionConfig(**{**BASE, **overrides})


def test_fsdp2_in_bf16_is_a_supported_setting():
    """bf16=True under FSDP becomes accelerate's bf16 FSDP2 policy (tests/test_trainer_fsdp.py trains it)."""
    config = SecretProtectionConfig(**BASE, fsdp=True, bf16=True)
    assert config.bf16 and config.fsdp_plugin_args["fsdp_version"] == 2


def test_dp_seed_never_leaves_through_the_config():
    seed = 271828182845904523536028747135266249
    config = SecretProtectionConfig(**BASE, dp_seed=seed)
    assert config.dp_seed == seed  # usable in the process
    assert str(seed) not in str(config) and str(seed) not in repr(config)
    assert str(seed) not in config.to_json_string()
    assert config.to_dict()["dp_seed"] == "<DP_SEED>"
    restored = pickle.loads(pickle.dumps(config))  # what training_args.bin holds
    assert restored.dp_seed is None and restored.max_steps == 10


def test_explicit_dp_seed_warns_loudly():
    from hush_hf.trainer.callback import GhostClippingCallback
    from tests.test_trainer_helpers import make_plan

    with pytest.warns(
        UserWarning, match="anyone who knows it can reproduce the batches and subtract the noise"
    ):
        GhostClippingCallback(make_plan([0.5, 0.5], steps=3, noise_multiplier=1.0), dp_seed=5)


def test_plain_training_arguments_are_converted_with_batch_clipping_off():
    plain = TrainingArguments(**BASE, per_device_train_batch_size=3, learning_rate=3e-4)
    with pytest.warns(UserWarning, match="max_grad_norm=1.0 .* is turned off"):
        config = as_secret_protection_config(plain)
    assert isinstance(config, SecretProtectionConfig)
    assert (config.max_grad_norm, config.per_device_train_batch_size, config.learning_rate) == (0.0, 3, 3e-4)
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be 1, got 2"):
        as_secret_protection_config(TrainingArguments(**BASE, gradient_accumulation_steps=2))


@pytest.mark.parametrize("watch", ["gradients", "all"])
def test_wandb_watching_gradients_is_refused(monkeypatch, watch):
    """wandb.watch hooks read the clipped gradient before the noise is added."""
    monkeypatch.setenv("WANDB_WATCH", watch)
    with pytest.raises(ValueError, match=f"WANDB_WATCH='{watch}' with report_to=.*wandb.* is not supported"):
        SecretProtectionConfig(**{**BASE, "report_to": ["wandb"]})
    SecretProtectionConfig(**BASE)  # no wandb: nothing watches
    monkeypatch.setenv("WANDB_WATCH", "parameters")  # weights only: they are post-noise
    SecretProtectionConfig(**{**BASE, "report_to": ["wandb"]})
