"""The protection plan: invariants, persistence, dataset columns, bad input."""

import datasets
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hush_hf.accounting import SecretGroups, posterior_bounds
from hush_hf.planning import (
    SAMPLING_PROB_COLUMN,
    WEIGHT_COLUMN,
    ProtectionPlan,
    membership_matrix,
    plan_protection,
)


def random_instance(seed: int, n: int = 60, m: int = 6, per_secret: tuple[int, int] = (3, 12)):
    rng = np.random.default_rng(seed)
    secret_ids = [[] for _ in range(n)]
    for j in range(m):
        for i in rng.choice(n, size=rng.integers(*per_secret), replace=False):
            secret_ids[i].append(j)
    priors = np.full(m, 1e-4)
    targets = rng.uniform(2e-3, 2e-2, size=m)
    return secret_ids, priors, targets


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    accountant=st.sampled_from(["kl", "rdp", "tight"]),
    lp_c=st.sampled_from([0.25, 1.0, 4.0]),
    batch=st.sampled_from([1.0, 4.0, 10.0]),
)
def test_plan_invariants(seed, accountant, lp_c, batch):
    secret_ids, priors, targets = random_instance(seed)
    plan = plan_protection(
        secret_ids, priors, targets, expected_batch_size=batch, steps=50, lp_c=lp_c, accountant=accountant
    )
    rho = plan.sampling_probs
    assert np.all((rho >= 0) & (rho <= 1))
    assert rho.sum() == pytest.approx(batch, rel=1e-9)
    assert np.all(plan.secrets.bound <= plan.secrets.target)
    assert plan.meets_targets
    # The plan's own numbers agree with an independent recomputation from its weights.
    groups = SecretGroups.from_membership(membership_matrix(secret_ids, priors.size), rho)
    np.testing.assert_allclose(plan.secrets.sum_rho, groups.sum_rho())
    recomputed = posterior_bounds(groups, priors, plan.noise_multiplier, 50, accountant=accountant)
    assert np.all(recomputed <= targets)
    # Secretless examples keep weight 1 by default.
    secretless = np.array([len(s) == 0 for s in secret_ids])
    assert np.all(plan.weights[secretless] == 1.0)


def test_smaller_c_retains_less_and_needs_less_noise():
    secret_ids, priors, targets = random_instance(3, n=200, m=10, per_secret=(20, 40))
    plans = [
        plan_protection(secret_ids, priors, targets, expected_batch_size=5, steps=100, lp_c=c)
        for c in (0.5, 16.0)
    ]
    assert plans[0].retained_weight_fraction < plans[1].retained_weight_fraction
    assert plans[0].noise_multiplier < plans[1].noise_multiplier


def test_drop_secretless_zeroes_examples_without_secrets():
    secret_ids, priors, targets = random_instance(5)
    plan = plan_protection(secret_ids, priors, targets, expected_batch_size=2, steps=10, drop_secretless=True)
    secretless = np.array([len(s) == 0 for s in secret_ids])
    assert secretless.any() and np.all(plan.weights[secretless] == 0)
    assert np.all(plan.sampling_probs[secretless] == 0)


def test_plan_round_trips_through_json(tmp_path):
    secret_ids, priors, targets = random_instance(7)
    plan = plan_protection(secret_ids, priors, targets, expected_batch_size=3, steps=20, accountant="kl")
    loaded = ProtectionPlan.load(plan.save(tmp_path / "plan.json"))
    np.testing.assert_array_equal(loaded.weights, plan.weights)
    np.testing.assert_array_equal(loaded.sampling_probs, plan.sampling_probs)
    np.testing.assert_array_equal(loaded.secrets.bound, plan.secrets.bound)
    assert loaded.summary() == plan.summary()


def test_plan_columns_attach_to_a_dataset():
    secret_ids, priors, targets = random_instance(11)
    ds = datasets.Dataset.from_dict(
        {"text": [f"doc {i}" for i in range(len(secret_ids))], "secret_ids": secret_ids}
    )
    plan = plan_protection(ds, priors, targets, expected_batch_size=3, steps=20)  # bound to ds's rows
    attached = plan.attach(ds)
    np.testing.assert_allclose(attached[WEIGHT_COLUMN], plan.weights)
    np.testing.assert_allclose(attached[SAMPLING_PROB_COLUMN], plan.sampling_probs)
    with pytest.raises(ValueError, match="dataset has 3 rows but the plan covers 60"):
        plan.attach(ds.select(range(3)))


def test_user_noise_below_calibration_is_reported_not_hidden():
    secret_ids, priors, targets = random_instance(13)
    calibrated = plan_protection(secret_ids, priors, targets, expected_batch_size=3, steps=50)
    weak = plan_protection(
        secret_ids,
        priors,
        targets,
        expected_batch_size=3,
        steps=50,
        noise_multiplier=calibrated.noise_multiplier / 4,
    )
    assert not weak.calibrated and not weak.meets_targets
    assert weak.summary()["bound_over_target_max"] > 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps": 0}, r"steps \(T\) must be an integer >= 1, got 0"),
        ({"steps": 2.5}, r"steps \(T\) must be an integer >= 1, got 2.5"),
        ({"expected_batch_size": -1}, r"expected_batch_size \(B\) must be a positive number, got -1"),
        ({"lp_c": 0.0}, r"lp_c must be a positive number, got 0.0"),
        ({"accountant": "moments"}, r"accountant must be one of .* got 'moments'"),
        ({"budget": "sqrt"}, r"budget must be one of .* got 'sqrt'"),
        ({"noise_multiplier": -0.5}, r"noise_multiplier must be None or a number >= 0, got -0.5"),
        ({"expected_batch_size": 1000}, r"expected_batch_size=1000 exceeds the sum of example weights"),
    ],
)
def test_bad_arguments_name_the_field_and_value(kwargs, message):
    secret_ids, priors, targets = random_instance(17)
    args = {"expected_batch_size": 2, "steps": 10} | kwargs
    with pytest.raises(ValueError, match=message):
        plan_protection(secret_ids, priors, targets, **args)


def test_unknown_secret_in_an_example_is_refused():
    with pytest.raises(ValueError, match="example 1 names unknown secret 3"):
        plan_protection(
            [[0], [3]], np.array([1e-3, 1e-3]), np.array([0.1, 0.1]), expected_batch_size=1, steps=1
        )


@pytest.mark.parametrize(
    "priors, targets", [([0.2], [0.1]), ([1e-3], [1.0]), ([0.0], [0.1]), ([np.nan], [0.1])]
)
def test_bad_targets_are_refused_before_solving(priors, targets):
    with pytest.raises(ValueError, match="prior|target"):
        plan_protection([[0]], np.array(priors), np.array(targets), expected_batch_size=1, steps=1)
