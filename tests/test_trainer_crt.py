"""CRT mode: public steps are plain mean-gradient steps (no clipping, no noise) on public rows; the
DP steps are exactly those of a run without CRT mode (same batches, clipping and noise)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad
from transformers import TrainerCallback

from hush_hf.sampling import WeightedPoissonSampler
from hush_hf.trainer import SecretProtectionTrainer
from hush_hf.trainer.crt import CrtBatchSampler, build_schedule
from tests.test_trainer_helpers import (
    dp_config,
    make_plan,
    pad_collate,
    parameters,
    sgd,
    single_thread,  # noqa: F401  (autouse fixture)
    tiny_gpt2,
    token_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")

SECRET_IDS = [[0], [0], [1], [], [], []]
PUBLIC = [False, False, False, True, True, False]  # row 5 has no secret but is private (e.g. a mask)


class GradRecorder(TrainerCallback):
    """The gradient the optimizer applies at each step (after the DP callback, which runs first)."""

    def __init__(self):
        self.grads, self.before = [], []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append({k: p.grad.detach().clone() for k, p in model.named_parameters()})
        self.before.append(parameters(model))


def crt_dataset(public=PUBLIC):
    data = token_dataset(len(SECRET_IDS), seed=7)
    return data.add_column("secret_ids", SECRET_IDS).add_column("crt_public", public)


def crt_plan(*, steps, sigma, rows=None):
    """rho = 1/2 for the 6 rows of ``crt_dataset()`` (or ``rows``), bound to them."""
    rows = crt_dataset() if rows is None else rows
    return make_plan(np.full(6, 0.5), steps=steps, noise_multiplier=sigma, secret_ids=SECRET_IDS, rows=rows)


def trainer_for(tmp_path, model, dataset, plan, steps, **overrides):
    recorder = GradRecorder()
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(tmp_path, max_steps=steps, per_example_clip_norm=1e-3, **overrides),
        train_dataset=dataset,
        data_collator=pad_collate,
        plan=plan,
        optimizers=sgd(model, lr=1.0),
        callbacks=[recorder],
    )
    return trainer, recorder


def mean_gradient(model, params, dataset, rows):
    """(1/b) sum_i g_i, unclipped, each example alone (torch.func reference)."""

    def loss_of(p, ids):
        logits = functional_call(
            model, p, (ids[None],), {"position_ids": torch.arange(ids.numel())[None]}
        ).logits[0]
        return F.cross_entropy(logits[:-1], ids[1:])

    total = {k: torch.zeros_like(v) for k, v in params.items()}
    for i in rows:
        g = grad(loss_of)(params, torch.tensor(dataset[i]["input_ids"]))
        for k in total:
            total[k] += g[k]
    return {k: v / len(rows) for k, v in total.items()}


def test_schedules():
    inter = build_schedule(
        "interleave",
        private_steps=3,
        num_public=5,
        num_private=5,
        public_batch_size=2,
        expected_batch_size=2.0,
    )
    assert inter.public.tolist() == [True, False] * 3
    assert inter.private_index.tolist() == [-1, 0, -1, 1, -1, 2]
    assert inter.public_index.tolist() == [0, 1, 1, 2, 2, 3]
    # Alg. 1: ceil(5/2) = 3 public steps, then round(4/2) = 2 DP steps, until T = 3 DP steps.
    alt = build_schedule(
        "alternate_epochs",
        private_steps=3,
        num_public=5,
        num_private=4,
        public_batch_size=2,
        expected_batch_size=2.0,
    )
    assert alt.public.tolist() == [True] * 3 + [False] * 2 + [True] * 3 + [False]
    assert (alt.private_steps, alt.public_steps, alt.total_steps) == (3, 6, 9)
    none = build_schedule(
        "interleave",
        private_steps=2,
        num_public=0,
        num_private=4,
        public_batch_size=2,
        expected_batch_size=2.0,
    )
    assert none.public.tolist() == [False, False]


def test_batch_sampler_private_batches_are_the_plans_and_public_epochs_cover_public_rows():
    probs = np.array([0.5, 0.5, 0.5, 0.2, 0.2, 0.5])
    private = WeightedPoissonSampler(probs, num_steps=4, seed=99)
    schedule = build_schedule(
        "alternate_epochs",
        private_steps=4,
        num_public=3,
        num_private=3,
        public_batch_size=2,
        expected_batch_size=2.0,
    )
    sampler = CrtBatchSampler(private, schedule, np.array([1, 3, 4]), public_batch_size=2, seed=5)
    batches = list(sampler)
    assert len(batches) == len(sampler) == schedule.total_steps
    dp = [b for b, pub in zip(batches, schedule.public, strict=True) if not pub]
    assert dp == [private.batch(k).tolist() for k in range(4)]
    public = [b for b, pub in zip(batches, schedule.public, strict=True) if pub]
    assert sorted(public[0] + public[1]) == [1, 3, 4]  # one public epoch: each public row once
    shares = [
        list(
            CrtBatchSampler(
                private, schedule, np.array([1, 3, 4]), public_batch_size=2, seed=5, num_replicas=2, rank=r
            )
        )
        for r in (0, 1)
    ]
    assert [sorted(a + b) for a, b in zip(*shares, strict=True)] == [sorted(b) for b in batches]


def test_public_step_is_unclipped_noise_free_mean_and_dp_step_is_unchanged(tmp_path):
    dataset = crt_dataset()
    probs = np.full(len(SECRET_IDS), 0.5)
    plan = make_plan(probs, steps=1, noise_multiplier=2.0, secret_ids=SECRET_IDS, rows=dataset)
    model = tiny_gpt2(seed=3).double()
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer, rec = trainer_for(
        tmp_path / "crt", model, dataset, plan, 1, crt_schedule="interleave", crt_public_batch_size=2
    )
    trainer.train()
    assert trainer.state.global_step == 2 and len(rec.grads) == 2  # 1 public + T = 1 DP step
    # Step 0 (public): the plain mean gradient of rows 3 and 4 (clip C = 1e-3 and sigma = 2 would show).
    expected = mean_gradient(model, start, dataset, [3, 4])
    norm = torch.sqrt(sum((v**2).sum() for v in expected.values()))
    assert norm > 100 * 1e-3  # far above C: a clipped step would differ
    for k, v in expected.items():
        torch.testing.assert_close(rec.grads[0][k], v, rtol=1e-7, atol=1e-12)
    # Step 1 (DP): identical to step 0 of a run without CRT mode from the same parameters.
    reference = tiny_gpt2(seed=3).double()
    reference.load_state_dict(rec.before[1], strict=False)  # lm_head is tied to wte
    ref_trainer, ref_rec = trainer_for(tmp_path / "ref", reference, dataset, plan, 1)
    ref_trainer.train()
    for k, v in ref_rec.grads[0].items():
        torch.testing.assert_close(rec.grads[1][k], v, rtol=0, atol=0)
    assert trainer.dp.noise_multiplier == ref_trainer.dp.noise_multiplier == 2.0
    assert trainer.plan is plan  # the plan and its per-secret bounds are untouched
    dp_logs = [h for h in trainer.state.log_history if "dp_batch_size" in h]
    assert len(dp_logs) == 1  # public steps are not logged as DP steps


def test_public_row_holding_a_tagged_secret_is_refused(tmp_path):
    public = [True, False, False, True, True, False]
    plan = crt_plan(steps=1, sigma=1.0, rows=crt_dataset(public))
    with pytest.raises(ValueError, match=r"row 0 is marked public \(crt_public=True\) but holds 1 tagged"):
        trainer_for(tmp_path, tiny_gpt2(), crt_dataset(public), plan, 1, crt_schedule="interleave")


def test_crt_mode_needs_the_public_column_and_refuses_resume(tmp_path):
    dataset = crt_dataset().remove_columns("crt_public")
    plan = make_plan(np.full(6, 0.5), steps=1, noise_multiplier=1.0, secret_ids=SECRET_IDS, rows=dataset)
    with pytest.raises(ValueError, match="needs a bool column 'crt_public'"):
        trainer_for(tmp_path, tiny_gpt2(), dataset, plan, 1, crt_schedule="alternate_epochs")
    plan = crt_plan(steps=1, sigma=1.0)
    trainer, _ = trainer_for(tmp_path, tiny_gpt2(), crt_dataset(), plan, 1, crt_schedule="alternate_epochs")
    with pytest.raises(ValueError, match="resuming a CRT-mode run"):
        trainer.train(resume_from_checkpoint=str(tmp_path))


def test_config_rejects_unknown_schedule(tmp_path):
    with pytest.raises(ValueError, match="crt_schedule must be one of"):
        dp_config(tmp_path, crt_schedule="sometimes")
    with pytest.raises(ValueError, match="crt_public_batch_size must be None or an integer >= 1"):
        dp_config(tmp_path, crt_public_batch_size=0)


def test_saved_card_states_the_crt_run_and_confidentiality(tmp_path):
    plan = crt_plan(steps=1, sigma=2.0)
    trainer, _ = trainer_for(
        tmp_path, tiny_gpt2(), crt_dataset(), plan, 1, crt_schedule="interleave", crt_recall=0.9
    )
    paths = trainer.write_protection_artifacts(tmp_path / "out")
    card = paths["card"].read_text()
    assert "CRT mode (`interleave`): 2 public rows" in card and "-Bayesian confidentiality" in card


def test_public_rows_are_checked_again_when_train_dataset_is_replaced(tmp_path):
    plan = crt_plan(steps=1, sigma=1.0)
    trainer, _ = trainer_for(tmp_path, tiny_gpt2(), crt_dataset(), plan, 1, crt_schedule="interleave")
    trainer.train_dataset = crt_dataset([False, True, False, True, True, False])  # row 1 made public
    with pytest.raises(ValueError, match=r"the plan was made from at 1 of 6 rows \(first: row 1"):
        trainer.train()


def test_plain_trainer_with_attach_runs_the_crt_schedule(tmp_path):
    from transformers import Trainer

    from hush_hf.trainer import GhostClippingCallback

    plan = crt_plan(steps=2, sigma=1.0)
    model = tiny_gpt2()
    trainer = Trainer(
        model=model,
        args=dp_config(tmp_path, max_steps=2),
        train_dataset=crt_dataset(),
        data_collator=pad_collate,
        optimizers=sgd(model, lr=0.1),
    )
    callback = GhostClippingCallback.attach(trainer, plan, dp_seed=1234, crt_schedule="interleave")
    trainer.train()
    assert callback.crt.total_steps == trainer.state.global_step == 4
    assert callback.steps_behind(4) == (2, 2) and callback.steps_behind(3) == (1, 2)  # public step first
    assert len([h for h in trainer.state.log_history if "dp_batch_size" in h]) == 2
    trainer.save_model(str(tmp_path / "out"))  # the card states the CRT run, as SecretProtectionTrainer does
    assert "CRT mode (`interleave`): 2 public rows" in (tmp_path / "out" / "README.md").read_text()


def test_trainer_report_carries_the_occurrences_it_is_given(tmp_path):
    plan = crt_plan(steps=1, sigma=2.0)
    trainer, _ = trainer_for(tmp_path, tiny_gpt2(), crt_dataset(), plan, 1)  # no CRT mode, no recall
    assert trainer.crt_report_section() is None
    trainer.crt_occurrences = {"rows": [2, 1], "unique": [1, 1]}
    assert trainer.crt_report_section()["occurrences"] == {"rows": [2, 1], "unique": [1, 1]}
    card = trainer.write_protection_artifacts(tmp_path / "out")["card"].read_text()
    assert "**Occurrences (CRT Prop. 7).**" in card
