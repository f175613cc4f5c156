"""Shared builders for the trainer tests: tiny models, token datasets, hand-made plans (no tests here)."""

from __future__ import annotations

from typing import Any

import datasets
import numpy as np
import pytest
import torch

from hush_hf.planning.binding import RowBinding
from hush_hf.planning.plan import ProtectionPlan, SecretReport

VOCAB = 64


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models run fastest on one thread; with `pytest -n 2` on 2 cores, more threads only contend.
    Autouse in every module that imports it; the previous setting is restored after each test."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def make_plan(
    probs: Any,
    *,
    steps: int,
    noise_multiplier: float,
    expected_batch_size: float | None = None,
    secret_ids: list[list[int]] | None = None,
    rows: Any = None,
) -> ProtectionPlan:
    """A ProtectionPlan with the given rho, memberships ``secret_ids`` (default: one secret in
    example 0) and sigma. Its bounds are the real ones at that sigma, and each target is set above
    its bound (at least 1e-2), so every target holds; sigma is given, not the smallest meeting the
    targets, so the plan says ``calibrated=False`` (``hush verify`` checks a calibrated plan's claim).
    ``rows``: the dataset it is bound to (as plan_protection(dataset) binds; without, it can be used
    with no dataset)."""
    from hush_hf.accounting import SecretGroups, posterior_bounds
    from hush_hf.planning.memberships import membership_matrix

    probs = np.asarray(probs, dtype=np.float64)
    if secret_ids is None:
        secret_ids = [[0]] + [[] for _ in range(probs.size - 1)]
    m = 1 + max((j for ids in secret_ids for j in ids), default=0)
    membership = membership_matrix(secret_ids, m)
    groups = SecretGroups.from_membership(membership, probs)
    prior = np.full(m, 1e-4)
    bound = np.asarray(posterior_bounds(groups, prior, noise_multiplier, steps, accountant="tight"))
    target = np.maximum(1e-2, np.minimum(1.5 * bound, 0.5 * (1 + bound)))
    assert np.all(bound < target), "choose a larger noise multiplier: no target < 1 holds"
    return ProtectionPlan(
        weights=np.ones(probs.size),
        sampling_probs=probs,
        noise_multiplier=float(noise_multiplier),
        accountant="tight",
        budget="tight",
        lp_c=1.0,
        expected_batch_size=float(probs.sum() if expected_batch_size is None else expected_batch_size),
        steps=steps,
        secrets=SecretReport(
            num_examples=groups.sizes.astype(np.int64),
            sum_rho=groups.sum_rho(),
            prior=prior,
            target=target,
            bound=bound,
        ),
        memberships=membership,
        calibrated=False,
        rows=None if rows is None else RowBinding.of(rows),
    )


def tiny_gpt2(seed: int = 0, vocab: int = VOCAB) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab,
        n_embd=16,
        n_layer=2,
        n_head=2,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def tiny_bert(seed: int = 0, vocab: int = VOCAB) -> torch.nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
    )
    return BertForMaskedLM(config)


def tiny_gemma2(seed: int = 0, vocab: int = VOCAB) -> torch.nn.Module:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(seed)
    config = Gemma2Config(
        vocab_size=vocab,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=32,
        max_position_embeddings=64,
        attn_implementation="eager",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return Gemma2ForCausalLM(config)


def token_dataset(n: int, *, seed: int = 0, min_len: int = 4, max_len: int = 12, vocab: int = VOCAB):
    """Rows of random token ids (ids >= 3, lengths vary) with attention_mask and causal labels."""
    rng = np.random.default_rng(seed)
    ids = [rng.integers(3, vocab, size=int(rng.integers(min_len, max_len + 1))).tolist() for _ in range(n)]
    return datasets.Dataset.from_dict(
        {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids], "labels": ids}
    )


def pad_collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Right-pad input_ids/attention_mask with 0 and labels with -100."""
    length = max(len(f["input_ids"]) for f in features)

    def pad(key: str, value: int) -> torch.Tensor:
        return torch.tensor([f[key] + [value] * (length - len(f[key])) for f in features])

    return {
        "input_ids": pad("input_ids", 0),
        "attention_mask": pad("attention_mask", 0),
        "labels": pad("labels", -100),
    }


def dp_config(output_dir: Any, **overrides: Any):
    """A quiet CPU SecretProtectionConfig for tests (explicit dp_seed: tests must be reproducible)."""
    from hush_hf.trainer import SecretProtectionConfig

    values: dict[str, Any] = dict(
        output_dir=str(output_dir),
        max_steps=2,
        per_device_train_batch_size=4,
        per_example_clip_norm=1.0,
        dp_seed=1234,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        dataloader_pin_memory=False,
    )
    values.update(overrides)
    return SecretProtectionConfig(**values)


def sgd(model: torch.nn.Module, lr: float = 1.0):
    """Plain SGD with a constant schedule: the parameter update is exactly -lr * p.grad."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)


def parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_trimmed_micro_batches_stay_usable_by_models_that_view_their_inputs():
    # A micro-batch whose trailing positions are padding in every row is trimmed; BERT's MLM loss then
    # calls labels.view(-1), which fails on a column slice (a random Poisson batch once hit this).
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from hush_hf.trainer.micro_batches import trim_right_padding

    batch = {
        "input_ids": torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]]),
        "labels": torch.tensor([[-100, 6, -100, -100], [7, -100, -100, -100]]),
    }
    out = trim_right_padding(batch)
    assert out["input_ids"].shape == (2, 2)
    assert all(v.is_contiguous() for v in out.values())
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
    )
    loss = BertForMaskedLM(config)(**out).loss  # the model's own loss, as the first-batch check computes it
    assert torch.isfinite(loss)
