"""A gradient written outside the DP step never reaches the optimizer (hush_hf.trainer.gradient_writes)."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

import tests.test_trainer as trainer_tests
from hush_hf.trainer import SecretProtectionTrainer
from hush_hf.trainer.gradient_writes import GradientStamps, optimizer_step_guard
from tests.test_trainer import build
from tests.test_trainer_helpers import parameters, single_thread, tiny_gpt2  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")

MODEL_INPUTS = ("input_ids", "attention_mask", "labels")


class AuxiliaryLossTrainer(SecretProtectionTrainer):
    """A subclass adding an auxiliary term the usual way: ``super().training_step`` then its own backward."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        output = model(**{k: v for k, v in inputs.items() if k in MODEL_INPUTS})
        (0.1 * output.loss).backward()  # the batch-mean loss: neither clipped nor noised
        return loss


def _assert_untrained(trainer, model, before):
    assert trainer.state.global_step == 0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_training_step_that_back_propagates_more_than_super_is_refused(tmp_path, monkeypatch, dtype):
    # Before: a float32 model trained and was certified with the unclipped auxiliary gradient in p.grad.
    monkeypatch.setattr(trainer_tests, "SecretProtectionTrainer", AuxiliaryLossTrainer)
    model = tiny_gpt2(seed=0).to(dtype)
    before = parameters(model)
    trainer = build(tmp_path, model=model)
    with pytest.raises(RuntimeError, match=r"^the gradient of parameter '[\w.]+' was written after the DP "
                                           r"step's backward passes and before the noise was added"):
        trainer.train()
    _assert_untrained(trainer, model, before)


class WriteGradients(TrainerCallback):
    """Writes the trainable gradients in ``on_pre_optimizer_step``: ``mode`` says how."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        p = next(p for p in model.parameters() if p.requires_grad)
        if self.mode == "in_place":
            p.grad.mul_(0.5)  # even a data-free rescaling: it cannot be told from a data-dependent one
        elif self.mode == "replaced":
            p.grad = torch.zeros_like(p)
        else:  # "backward": a gradient of the model's output on some rows
            model(input_ids=torch.ones(1, 4, dtype=torch.long)).logits.sum().backward()


@pytest.mark.parametrize("mode", ["in_place", "replaced", "backward"])
def test_a_callback_writing_the_noised_gradient_is_refused_before_the_optimizer_step(tmp_path, mode):
    model = tiny_gpt2(seed=0)
    before = parameters(model)
    trainer = build(tmp_path, model=model)
    trainer.add_callback(WriteGradients(mode))  # after the DP callback, which is first in line
    with pytest.raises(RuntimeError, match=r"was written after the noise was added and before the optimizer "
                                           r"step"):
        trainer.train()
    _assert_untrained(trainer, model, before)


def test_a_callback_ordered_before_the_dp_callback_is_refused_before_the_noise(tmp_path):
    model = tiny_gpt2(seed=0)
    trainer = build(tmp_path, model=model)
    trainer.callback_handler.callbacks.insert(0, WriteGradients("backward"))
    with pytest.raises(RuntimeError, match=r"written after the DP step's backward passes and before the "):
        trainer.train()
    assert trainer.state.global_step == 0


class StepOnItsOwn(TrainerCallback):
    """Back-propagates some rows and steps the optimizer itself, at ``on_step_begin``."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        model(input_ids=torch.ones(1, 4, dtype=torch.long)).logits.sum().backward()
        self.trainer.optimizer.step()


def test_an_optimizer_step_outside_the_trainers_is_refused(tmp_path):
    model = tiny_gpt2(seed=0)
    before = parameters(model)
    trainer = build(tmp_path, model=model)
    trainer.add_callback(StepOnItsOwn(trainer))
    with pytest.raises(RuntimeError, match=r"^the optimizer stepped before this step's noise was added"):
        trainer.train()
    _assert_untrained(trainer, model, before)


def test_an_optimizer_whose_step_calls_super_step_trains(tmp_path):
    # torch runs the step pre-hooks of each class's step: twice for one step of such a subclass.
    class LoggedSGD(torch.optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    model = tiny_gpt2(seed=0)
    optimizer = LoggedSGD(model.parameters(), lr=0.1)
    torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)  # SGD.step itself hooked too
    trainer = build(tmp_path, model=model)
    trainer.optimizer = optimizer
    trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    trainer.train()
    assert trainer.state.global_step == 2


def test_training_as_usual_passes_and_the_guard_leaves_with_the_run(tmp_path):
    model = tiny_gpt2(seed=0)
    trainer = build(tmp_path, model=model, max_steps=3)
    trainer.train()
    assert trainer.state.global_step == 3
    optimizer = trainer.optimizer.optimizer  # accelerate's wrapper around torch's
    assert not optimizer._optimizer_step_pre_hooks  # taken off when the run ended
    trainer.optimizer.step()  # after training, the optimizer is the user's again


def test_attach_on_a_plain_trainer_guards_the_same_windows(tmp_path):
    from transformers import Trainer

    from hush_hf.trainer import GhostClippingCallback
    from tests.test_trainer_helpers import dp_config, make_plan, pad_collate, token_dataset

    rows = token_dataset(8)
    plan = make_plan([0.5] * 8, steps=2, noise_multiplier=1.0, rows=rows)
    trainer = Trainer(model=tiny_gpt2(seed=0), args=dp_config(tmp_path), train_dataset=plan.attach(rows),
                      data_collator=pad_collate)
    GhostClippingCallback.attach(trainer, plan)
    trainer.add_callback(WriteGradients("in_place"))
    with pytest.raises(RuntimeError, match="written after the noise was added"):
        trainer.train()


# ----------------------------------------------------------------------------- the stamps themselves
def test_stamps_see_autograd_accumulation_in_place_writes_and_new_tensors():
    layer = torch.nn.Linear(3, 2)
    layer(torch.ones(1, 3)).sum().backward()
    params = list(layer.parameters())
    assert GradientStamps(params, "now").first_written() is None
    for write in (
        lambda: layer(torch.ones(1, 3)).sum().backward(),  # autograd accumulates into the same tensor
        lambda: params[1].grad.add_(1.0),
        lambda: setattr(params[1], "grad", params[1].grad.clone()),
        lambda: setattr(params[0], "grad", None),
    ):
        stamps = GradientStamps(params, "now")
        write()
        assert stamps.first_written() is not None


def test_stamps_see_the_float32_sum_beside_a_bf16_parameter():
    from hush_hf.clipping import clipped_sums

    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    clipped_sums.accumulate_(p, torch.ones(4))
    stamps = GradientStamps([p], "now")
    clipped_sums.accumulate_(p, torch.ones(4))  # a second accumulation into the float32 sum
    assert stamps.first_written() == 0


def test_the_guard_sits_on_the_torch_optimizer_inside_wrappers():
    class Wrapper:
        def __init__(self, optimizer):
            self.optimizer = optimizer

    layer = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    calls = []
    handle = optimizer_step_guard(Wrapper(Wrapper(optimizer)), lambda: calls.append(1))
    optimizer.step()
    assert calls == [1]
    handle.remove()
    optimizer.step()
    assert calls == [1]
    assert optimizer_step_guard(None, lambda: None) is None
