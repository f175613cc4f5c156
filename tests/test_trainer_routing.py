"""One routing table for both ways in: ``SecretProtectionTrainer`` defines every routed method from it, and
``GhostClippingCallback.attach`` sets the same ones on a plain ``Trainer``; transformers' private members
are reached through one adapter that refuses a release it cannot vouch for."""

from __future__ import annotations

import numpy as np
import pytest
import transformers
from transformers import Trainer

from hush_hf.trainer import GhostClippingCallback, SecretProtectionTrainer
from hush_hf.trainer.routing import ROUTES
from hush_hf.trainer.transformers_api import ROUTED, check_trainer_api
from tests.test_trainer_helpers import dp_config, make_plan, pad_collate, tiny_gpt2, token_dataset

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")


def plain_trainer(tmp_path):
    data = token_dataset(4)
    plan = make_plan(np.full(4, 0.5), steps=2, noise_multiplier=1.0, rows=data)
    trainer = Trainer(
        model=tiny_gpt2(),
        args=dp_config(tmp_path),
        train_dataset=plan.attach(data),
        data_collator=pad_collate,
    )
    return trainer, plan


def test_both_ways_in_take_over_exactly_the_methods_of_the_table(tmp_path):
    assert set(ROUTED) <= set(ROUTES)  # every private method replaced is in the table
    for name, route in ROUTES.items():
        assert name in vars(SecretProtectionTrainer), name
        assert getattr(SecretProtectionTrainer, name).__doc__ == route.__doc__, name
    trainer, plan = plain_trainer(tmp_path)
    before = {name: getattr(trainer, name) for name in ROUTES}
    GhostClippingCallback.attach(trainer, plan)
    for name, route in ROUTES.items():
        routed = vars(trainer)[name]  # set on the instance
        assert routed.func is route and routed.args[2][name] == before[name], name


def test_the_adapter_refuses_a_transformers_it_cannot_vouch_for(tmp_path, monkeypatch):
    trainer, plan = plain_trainer(tmp_path)
    check_trainer_api(trainer)  # the installed release passes
    monkeypatch.setattr(transformers, "__version__", "6.1.0")
    with pytest.raises(ValueError, match=r"transformers 6.1.0 is not supported"):
        GhostClippingCallback.attach(trainer, plan)
    monkeypatch.undo()

    class Renamed(Trainer):
        _get_grad_norm = None  # a release where Trainer no longer has the method the DP step replaces

    data = plan.attach(token_dataset(4))
    renamed = Renamed(
        model=tiny_gpt2(), args=dp_config(tmp_path / "r"), train_dataset=data, data_collator=pad_collate
    )
    with pytest.raises(ValueError, match=r"Renamed .* has no _get_grad_norm"):
        GhostClippingCallback.attach(renamed, plan)
