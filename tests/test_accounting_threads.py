"""Laws evaluated on several threads (the trainer's re-verification at train start): the same bounds,
bitwise, as one thread, by every route that reaches the ``tight`` accountant; and the pool is clean
(results in input order, the caller's numpy error state, exceptions re-raised, threads gone after)."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from hush_hf.accounting import SecretGroups, posterior_bounds, register_accountant
from hush_hf.accounting import accountants as registry
from hush_hf.accounting.blowup import tight_bounds
from hush_hf.accounting.counts import poisson_binomial
from hush_hf.accounting.threads import map_in_threads, validate_workers
from hush_hf.planning import plan_protection
from hush_hf.planning import verification as verification_module
from hush_hf.planning.verification import recompute_bounds

pytestmark = pytest.mark.filterwarnings("ignore:.*mark more than 5% of the examples")


def pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hush-laws")]


def test_results_come_back_in_input_order_and_the_pool_is_gone():
    def slow_first(i: int) -> int:
        if i == 0:
            threading.Event().wait(0.05)  # the first item finishes last
        return i * i

    assert map_in_threads(slow_first, list(range(7)), 3) == [i * i for i in range(7)]
    assert map_in_threads(slow_first, [], 4) == []
    assert not pool_threads()


def test_one_worker_runs_in_the_calling_thread():
    names = map_in_threads(lambda _: threading.current_thread().name, [0, 1], 1)
    assert names == [threading.current_thread().name] * 2


def test_a_failing_task_is_reraised_the_rest_dropped_and_the_pool_shut_down():
    ran = []

    def fails_on_one(i: int) -> int:
        ran.append(i)
        if i == 1:
            raise ArithmeticError("task 1")
        threading.Event().wait(0.01)
        return i

    with pytest.raises(ArithmeticError, match="task 1"):
        map_in_threads(fails_on_one, list(range(100)), 2)
    assert not pool_threads()
    assert len(ran) < 50  # not waited for: 100 tasks of 10 ms on 2 threads would take 0.5 s


def test_tasks_see_the_callers_numpy_error_state():
    def overflow(_: int) -> float:
        return float(np.exp(np.array([1000.0]))[0])

    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        map_in_threads(overflow, [0, 1], 2)
    with np.errstate(over="ignore"):
        assert map_in_threads(overflow, [0, 1], 2) == [np.inf, np.inf]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_a_thread_count_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        validate_workers(bad)
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        posterior_bounds(SecretGroups.from_lists([[0.1]]), [1e-3], 1.0, 4, workers=bad)


def test_tight_bounds_on_threads_are_bitwise_those_of_one_thread(monkeypatch):
    """Every branch of the per-law evaluation: an empty law, a law queried twice with two priors (one
    below PLD_FLOOR_PRIOR: the Renyi floor), a tiny sigma (UnresolvedLoss: the trivial bound), a rarely
    sampled example whose bound the tilted composition refines, with and without targets."""
    from hush_hf.accounting import blowup

    tilted = []
    original = blowup.tilted_increments
    monkeypatch.setattr(blowup, "tilted_increments", lambda *a: tilted.append(1) or original(*a))
    groups = SecretGroups.from_lists(
        [[0.0], [0.3, 0.2, 0.05], [0.02] * 6, [0.5, 0.5], [1e-4, 2e-3], [0.1] * 3, [1e-4]]
    )
    laws = poisson_binomial(groups, np.arange(groups.num_secrets))
    sigma = np.array([1.0, 0.9, 2.0, 1e-4, 5.0, 1.3, 3.0])
    rows = np.array([0, 1, 1, 2, 3, 4, 5, 5, 6])
    priors = np.array([1e-3, 1e-3, 1e-14, 1e-6, 1e-2, 1e-3, 1e-5, 2e-5, 1e-8])
    targets = priors * np.array([10.0, 1.5, 1e6, 3.0, 1.1, 1.0001, 2.0, 1.5, 1.0001])
    for given in (None, targets):
        serial = tight_bounds(laws, sigma, 20, priors, rows, given)
        threaded = tight_bounds(laws, sigma, 20, priors, rows, given, workers=3)
        assert np.array_equal(serial, threaded)
        assert serial[0] == priors[0] and serial[4] == 1.0  # the empty law, the unresolved one
    assert len(tilted) == 2  # once per run for the rarely sampled example, serial and threaded


def test_the_envelope_route_of_a_verification_is_bitwise_the_same_on_threads(monkeypatch):
    """Above EXACT_UP_TO (lowered here): envelopes first, then own laws for the secrets over target.
    Pairs of laws 1e-4 apart share an envelope; targets equal to the own-law bounds make the smaller
    law of each pair miss with the envelope, so both passes run."""
    rng = np.random.default_rng(3)
    base = [rng.uniform(0.01, 0.3, size=int(rng.integers(1, 4))) for _ in range(8)]
    groups = SecretGroups.from_lists([g for rho in base for g in (rho, rho * (1 - 1e-4))])
    priors = np.full(groups.num_secrets, 1e-4)
    targets = posterior_bounds(groups, priors, 1.5, 6)  # own laws
    monkeypatch.setattr(verification_module, "EXACT_UP_TO", 10)
    passes = []
    monkeypatch.setattr(verification_module, "posterior_bounds",
                        lambda *a, **k: passes.append(k.get("resolution", 0.0)) or posterior_bounds(*a, **k))
    serial = verification_module._bounds(groups, priors, targets, 1.5, 6, "tight", 1)
    threaded = verification_module._bounds(groups, priors, targets, 1.5, 6, "tight", 2)
    assert passes == [verification_module.ENVELOPE_RESOLUTION, 0.0] * 2  # envelopes, then own laws
    assert np.array_equal(serial, threaded)
    assert np.all(serial <= targets)  # the misses got their own law


def test_only_a_threaded_accountant_is_given_workers():
    calls = []

    def bounds_without_workers(laws, sigma, steps, priors, rows, targets):
        calls.append("plain")
        return np.asarray(priors, dtype=np.float64) * 2

    def bounds_with_workers(laws, sigma, steps, priors, rows, targets, *, workers=1):
        calls.append(workers)
        return np.asarray(priors, dtype=np.float64) * 2

    plain = dataclasses.replace(registry.REGISTRY["kl"], name="plain_test", bounds=bounds_without_workers)
    threaded = dataclasses.replace(plain, name="threaded_test", bounds=bounds_with_workers, threaded=True)
    groups = SecretGroups.from_lists([[0.1, 0.2]])
    try:
        register_accountant(plain)
        register_accountant(threaded)
        posterior_bounds(groups, [1e-3], 2.0, 4, "plain_test", workers=4)
        posterior_bounds(groups, [1e-3], 2.0, 4, "threaded_test", workers=4)
        posterior_bounds(groups, [1e-3], 2.0, 4, "threaded_test")
    finally:
        registry.REGISTRY.pop("plain_test", None)
        registry.REGISTRY.pop("threaded_test", None)
    assert calls == ["plain", 4, 1]
    assert registry.REGISTRY["tight"].threaded and not registry.REGISTRY["kl"].threaded


def test_an_accountant_whose_threaded_flag_is_not_a_bool_is_refused():
    entry = dataclasses.replace(registry.REGISTRY["kl"], name="flag_test", threaded="yes")
    with pytest.raises(ValueError, match="threaded must be True or False"):
        register_accountant(entry)
    assert "flag_test" not in registry.REGISTRY


def test_the_trainer_verifies_on_as_many_threads_as_torch_uses_up_to_a_cap(monkeypatch):
    import torch

    from hush_hf.trainer import plan_setup

    seen = {}

    def spy(plan, sigma, **kwargs):
        seen.update(kwargs)
        return recompute_bounds(plan, sigma, **kwargs)

    secret_ids = [[0], [0, 1], [], [1]]
    plan = plan_protection(secret_ids, [1e-3, 1e-3], [0.2, 0.2], expected_batch_size=1.0, steps=3)
    monkeypatch.setattr(plan_setup, "recompute_bounds", spy)
    sigma, verification = plan_setup.verify_plan_for_training(plan, None, secret_ids=secret_ids)
    assert seen["workers"] == min(torch.get_num_threads(), plan_setup.MAX_VERIFICATION_THREADS) >= 1
    assert verification.meets_targets and sigma == plan.noise_multiplier
    monkeypatch.setattr(torch, "get_num_threads", lambda: 64)  # a many-core machine: capped
    plan_setup.verify_plan_for_training(plan, None, secret_ids=secret_ids)
    assert seen["workers"] == plan_setup.MAX_VERIFICATION_THREADS == 8
