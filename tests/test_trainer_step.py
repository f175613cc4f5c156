"""One DP step against an independent reference: clipped per-example gradients (torch.func) / B."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad

from hush_hf.sampling import WeightedPoissonSampler
from hush_hf.trainer import SecretProtectionTrainer
from tests.test_trainer_helpers import (
    dp_config,
    make_plan,
    pad_collate,
    parameters,
    sgd,
    single_thread,  # noqa: F401  (autouse fixture)
    tiny_bert,
    tiny_gpt2,
    token_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given", "ignore:noise_multiplier=0")


def reference_clipped_mean(model, dataset, clip_norm: float, expected_batch_size: float, *, causal: bool):
    """sum_i min(1, C/||g_i||) g_i / B with g_i from torch.func.grad of example i's mean token loss
    (each example alone, unpadded); also returns the norms ||g_i||."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_of(p, ids, labels):
        logits = functional_call(
            model, p, (ids[None],), {"position_ids": torch.arange(ids.numel())[None]}
        ).logits[0]
        if causal:
            logits, labels = logits[:-1], labels[1:]
        keep = labels != -100
        return F.cross_entropy(logits[keep], labels[keep])

    total = {k: torch.zeros_like(v) for k, v in params.items()}
    norms = []
    for row in dataset:
        g = grad(loss_of)(params, torch.tensor(row["input_ids"]), torch.tensor(row["labels"]))
        norms.append(torch.sqrt(sum((v**2).sum() for v in g.values())).item())
        scale = min(1.0, clip_norm / norms[-1])
        for k in total:
            total[k] += scale * g[k]
    return {k: v / expected_batch_size for k, v in total.items()}, np.array(norms)


@pytest.mark.parametrize("micro_batch", [2, 8])
def test_update_equals_clipped_mean_gpt2(tmp_path, micro_batch):
    n, clip = 6, 1e-3  # every example sampled (rho = 1, B = n); C small enough to clip all
    dataset = token_dataset(n, seed=1)
    model = tiny_gpt2(seed=1).double()  # float64: the comparison is not limited by rounding
    expected, norms = reference_clipped_mean(model, dataset, clip, n, causal=True)
    assert norms.min() > 10 * clip  # every example is clipped
    before = parameters(model)
    plan = make_plan(np.ones(n), steps=1, noise_multiplier=1.0, rows=dataset)
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(
            tmp_path,
            max_steps=1,
            per_example_clip_norm=clip,
            noise_multiplier=0.0,
            per_device_train_batch_size=micro_batch,
        ),
        train_dataset=plan.attach(dataset),
        data_collator=pad_collate,
        plan=plan,
        optimizers=sgd(model, lr=1.0),
    )
    trainer.train()
    after = parameters(model)
    assert trainer.state.log_history[0]["dp_batch_size"] == n
    for name, update in expected.items():
        torch.testing.assert_close(before[name] - after[name], update, rtol=1e-7, atol=1e-13)


def test_update_equals_clipped_mean_bert_mlm(tmp_path):
    n, clip = 5, 1e-3
    dataset = token_dataset(n, seed=2)
    # Masked LM: only some positions are targets (the rest -100), scored without a shift.
    rng = np.random.default_rng(0)
    dataset = dataset.map(
        lambda row: {
            "labels": [t if rng.random() < 0.4 or i == 0 else -100 for i, t in enumerate(row["input_ids"])]
        }
    )
    model = tiny_bert(seed=2).double()
    expected, norms = reference_clipped_mean(model, dataset, clip, n, causal=False)
    assert norms.min() > 10 * clip
    before = parameters(model)
    plan = make_plan(np.ones(n), steps=1, noise_multiplier=1.0, rows=dataset)
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(tmp_path, max_steps=1, per_example_clip_norm=clip, noise_multiplier=0.0),
        train_dataset=plan.attach(dataset),
        data_collator=pad_collate,
        plan=plan,
        optimizers=sgd(model, lr=1.0),
    )
    trainer.train()
    after = parameters(model)
    for name, update in expected.items():
        torch.testing.assert_close(before[name] - after[name], update, rtol=1e-7, atol=1e-13)


def test_divides_by_expected_not_drawn_batch_size(tmp_path):
    """With rho = 1/2 the drawn batch varies, but the sum is always divided by B = n/2."""
    n, clip = 8, 1e-3
    dataset = token_dataset(n, seed=3)
    model = tiny_gpt2(seed=3).double()
    plan = make_plan(np.full(n, 0.5), steps=1, noise_multiplier=1.0, rows=dataset)
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(tmp_path, max_steps=1, per_example_clip_norm=clip, noise_multiplier=0.0),
        train_dataset=plan.attach(dataset),
        data_collator=pad_collate,
        plan=plan,
        optimizers=sgd(model, lr=1.0),
    )
    before = parameters(model)
    rows = WeightedPoissonSampler(np.full(n, 0.5), num_steps=1, seed=1234).batch(0)  # dp_config's seed
    assert 0 < rows.size < n and rows.size != n / 2  # this seed draws a partial batch of size != B
    expected, _ = reference_clipped_mean(model, dataset.select(rows), clip, n / 2, causal=True)
    trainer.train()
    after = parameters(model)
    assert trainer.state.log_history[0]["dp_batch_size"] == rows.size
    for name, update in expected.items():
        torch.testing.assert_close(before[name] - after[name], update, rtol=1e-7, atol=1e-13)


def test_micro_batches_cover_the_rows_and_trim_only_padding_shared_by_all_rows():
    from hush_hf.trainer.micro_batches import split_micro_batches

    mask = torch.tensor(
        [[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]]
    )
    ids = torch.arange(30).view(5, 6) * mask
    labels = torch.where(mask == 1, ids, torch.full_like(ids, -100))
    labels[4, 3] = 7  # a target under a masked position keeps its column
    micro = split_micro_batches({"input_ids": ids, "attention_mask": mask, "labels": labels, "tag": "x"}, 2)
    assert [m["input_ids"].shape for m in micro] == [(2, 3), (2, 6), (1, 4)]
    assert torch.equal(torch.cat([m["input_ids"][:, :3] for m in micro]), ids[:, :3])
    assert all(m["tag"] == "x" for m in micro)
    # Left padding is never cut; unknown tensors (e.g. pixel values) switch trimming off.
    assert split_micro_batches({"input_ids": ids[3:4], "attention_mask": mask[3:4]}, 4)[0][
        "input_ids"
    ].shape == (1, 6)
    other = split_micro_batches(
        {"input_ids": ids, "attention_mask": mask, "pixel_values": torch.zeros(5, 6)}, 2
    )
    assert other[0]["input_ids"].shape == (2, 6)
    assert split_micro_batches({}, 3) == []
    with pytest.raises(ValueError, match="different numbers of rows"):
        split_micro_batches({"input_ids": ids, "labels": labels[:4]}, 2)
    with pytest.raises(ValueError, match="per_device_train_batch_size must be a positive integer, got 0"):
        split_micro_batches({"input_ids": ids}, 0)
