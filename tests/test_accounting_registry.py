"""The accountant registry (issue 29): one table, read by every place that names accountants, and a
registration that lacks what those places need is refused."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

from hush_hf.accounting import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    LP_BUDGET_KINDS,
    SecretGroups,
    get_accountant,
    posterior_bounds,
    register_accountant,
)
from hush_hf.accounting import accountants as registry


@pytest.fixture
def dummy():
    """A registered copy of ``kl`` under another name, with the ``tight`` LP budget; removed after."""
    entry = dataclasses.replace(
        registry.REGISTRY["kl"], name="dummy", lp_budget="tight", description="a test"
    )
    register_accountant(entry)
    yield entry
    del registry.REGISTRY["dummy"]


def test_the_names_are_the_table_default_first():
    assert list(ACCOUNTANTS) == ["tight", "rdp", "kl"] == list(registry.REGISTRY)
    assert ACCOUNTANTS[0] == DEFAULT_ACCOUNTANT and len(ACCOUNTANTS) == 3
    assert "kl" in ACCOUNTANTS and "KL" not in ACCOUNTANTS and 3 not in ACCOUNTANTS


@pytest.mark.parametrize("name", list(registry.REGISTRY))
def test_every_registered_accountant_has_what_the_rest_needs(name):
    from hush_hf.audit.card import _accountant_words

    entry = get_accountant(name)
    assert entry.lp_budget in LP_BUDGET_KINDS and entry.description.strip()
    assert entry.description in _accountant_words(name)  # the model card reads the table
    groups = SecretGroups.from_lists([[0.05] * 4])
    bound = posterior_bounds(groups, [1e-4], 3.0, 100, name)[0]
    assert 1e-4 < bound < 1.0  # its bound function resolves and gives a bound above the prior
    assert entry.estimate_sigma(np.array([0.2]), np.array([1e-4]), np.array([1e-2]), 100)[0] > 0


def test_the_plan_command_offers_the_table(dummy):
    from hush_hf.cli import plan as plan_command

    parser = argparse.ArgumentParser()
    plan_command.add_arguments(parser)
    base = ["--dataset", "d", "--batch-size", "4", "--steps", "10", "--secrets", "s.json"]
    assert parser.parse_args(base).accountant == DEFAULT_ACCOUNTANT
    assert parser.parse_args([*base, "--accountant", "dummy"]).accountant == "dummy"
    assert parser.parse_args([*base, "--budget", "paper"]).budget == "paper"


@pytest.mark.filterwarnings("ignore:.*mark more than")
def test_a_plan_takes_its_default_budget_from_the_table(dummy):
    from hush_hf.planning import plan_protection

    secret_ids = [[i % 2] for i in range(40)] + [[]] * 60
    args = {"expected_batch_size": 0.5, "steps": 10, "noise_multiplier": 5.0}
    plan = plan_protection(secret_ids, [1e-3, 1e-3], [1e-2, 1e-2], accountant="dummy", **args)
    assert plan.accountant == "dummy" and plan.budget == "tight"
    assert plan_protection(secret_ids, [1e-3, 1e-3], [1e-2, 1e-2], accountant="kl", **args).budget == "kl"


def test_an_unknown_accountant_is_refused_with_the_names():
    with pytest.raises(ValueError, match=r"accountant must be one of \('tight', 'rdp', 'kl'\), got 'KL'"):
        get_accountant("KL")
    groups = SecretGroups.from_lists([[0.05]])
    with pytest.raises(ValueError, match=r"accountant must be one of .* got 'nope'"):
        posterior_bounds(groups, [1e-4], 3.0, 10, "nope")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"name": "tight"}, "already registered"),
        ({"name": "two words"}, "identifier-like"),
        ({"lp_budget": "nope"}, "lp_budget must be one of"),
        ({"description": " "}, "description"),
        ({"sigma_factor": 0.0}, "sigma_factor must be a positive number"),
        ({"sigma_factor": float("inf")}, "sigma_factor must be a positive number"),
        ({"bounds": None}, "bounds must be callable or 'module:function'"),
        ({"bounds": "no_colon"}, "bounds must be callable or 'module:function'"),
        ({"gap": None}, "gap must be callable"),
    ],
)
def test_a_registration_without_what_the_rest_needs_is_refused(change, message):
    entry = dataclasses.replace(registry.REGISTRY["kl"], **({"name": "other"} | change))
    with pytest.raises(ValueError, match=message):
        register_accountant(entry)
    assert list(registry.REGISTRY) == ["tight", "rdp", "kl"]


def test_a_registered_accountant_is_used_by_the_bounds(dummy):
    groups = SecretGroups.from_lists([[0.05] * 4])
    ours = posterior_bounds(groups, [1e-4], 3.0, 100, "dummy")
    np.testing.assert_array_equal(ours, posterior_bounds(groups, [1e-4], 3.0, 100, "kl"))
    assert "dummy" in ACCOUNTANTS and ACCOUNTANTS[0] == DEFAULT_ACCOUNTANT
