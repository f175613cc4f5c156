"""Each secret's mechanism as dp_accounting events (issue 29): the events are the right mechanism
(brute force), and dp_accounting's own PLD accountant on them gives an upper bound consistent with
the bound the project states."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from hush_hf.accounting import SecretGroups, calibrate_noise
from hush_hf.accounting.events import count_pmf, dp_accounting_bound, plan_dp_events, secret_dp_event
from tests.test_accounting_extremes import sum_test_power


def brute_force_pmf(rho: list[float]) -> np.ndarray:
    """Pr[S = s] summed over all 2^n inclusion patterns."""
    pmf = np.zeros(len(rho) + 1)
    for pattern in itertools.product((0, 1), repeat=len(rho)):
        pmf[sum(pattern)] += np.prod([r if x else 1 - r for r, x in zip(rho, pattern, strict=True)])
    return pmf


def test_the_count_law_is_the_poisson_binomial():
    rho = [0.3, 0.01, 0.5, 0.9, 0.07, 0.2, 0.66, 0.001]
    np.testing.assert_allclose(count_pmf(rho), brute_force_pmf(rho), rtol=1e-12, atol=1e-300)


def test_the_event_is_the_mixture_step_composed_t_times():
    event = secret_dp_event([0.25, 0.5], 3.0, 40)
    assert event.count == 40
    step = event.event
    assert step.standard_deviation == 3.0 and list(step.sensitivities) == [0.0, 1.0, 2.0]
    np.testing.assert_allclose(step.sampling_probs, [0.375, 0.5, 0.125], rtol=1e-15)


@pytest.mark.filterwarnings("ignore:.*mark more than")
def test_a_plans_events_follow_its_memberships_and_training_record():
    from hush_hf.planning import plan_protection
    from hush_hf.planning.record import TrainingRecord

    secret_ids = [[0], [0, 1], [1], [], [0]] * 8
    plan = plan_protection(secret_ids, [1e-3, 1e-3], [1e-2, 1e-2], expected_batch_size=2, steps=30)
    events = plan_dp_events(plan)
    rho = np.asarray(plan.sampling_probs)
    for j, event in enumerate(events):
        mine = [rho[i] for i, ids in enumerate(secret_ids) if j in ids]
        np.testing.assert_allclose(event.event.sampling_probs, count_pmf(mine), rtol=1e-12)
        assert event.count == 30 and event.event.standard_deviation == plan.noise_multiplier
    record = TrainingRecord(noise_multiplier=7.5, dp_steps=12, clip_norm=1.0)
    trained = plan_dp_events(dataclasses.replace(plan, training=record))
    assert trained[0].count == 12 and trained[0].event.standard_deviation == 7.5


def test_dp_accounting_alone_rechecks_the_stated_bound():
    # The reference instance (docs/design.md): 75 examples at rho = 0.004, p = 1e-10, r = 5e-4, T = 2000.
    groups, prior, target, steps = SecretGroups.from_lists([[0.004] * 75]), 1e-10, 5e-4, 2000
    stated = calibrate_noise(groups, [prior], [target], steps, "tight")
    theirs = dp_accounting_bound(secret_dp_event([0.004] * 75, stated.sigma, steps), prior)
    assert sum_test_power(75, 0.004, steps, stated.sigma, prior) <= theirs  # an upper bound, by a valid test
    assert theirs == pytest.approx(stated.bounds[0], rel=1e-3)  # and ours agrees (measured: 2e-6)
    assert theirs <= target * (1 + 1e-3)
