"""The Gaussian mechanism: (sum of clipped grads + N(0, sigma^2 C^2 I)) / B, seeded by (dp_seed, step)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import TrainerCallback

from hush_hf.trainer import SecretProtectionTrainer
from hush_hf.trainer.noise import noise_generator, privatize_gradients_
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


def zero_grad_params(*shapes: tuple[int, ...], dtype=torch.float32) -> list[torch.nn.Parameter]:
    params = [torch.nn.Parameter(torch.zeros(s, dtype=dtype)) for s in shapes]
    for p in params:
        p.grad = torch.zeros_like(p)
    return params


def assert_std(values: torch.Tensor, std: float, alpha: float = 1e-6) -> None:
    """Mean 0 and variance std^2: exact chi-square interval for the variance, z-test for the mean."""
    x = values.double().flatten().numpy()
    n = x.size
    assert abs(x.mean()) < stats.norm.ppf(1 - alpha / 2) * std / np.sqrt(n)
    chi2 = (x**2).sum() / std**2  # ~ chi2(n) when the mean is known to be 0
    assert stats.chi2.ppf(alpha / 2, n) < chi2 < stats.chi2.ppf(1 - alpha / 2, n)


def test_noise_std_is_sigma_c_over_b():
    sigma, clip, batch = 2.5, 0.4, 8.0
    params = zero_grad_params((300, 200), (1000,))
    privatize_gradients_(
        params, noise_multiplier=sigma, clip_norm=clip, expected_batch_size=batch, dp_seed=99, step=3
    )
    noise = torch.cat([p.grad.flatten() for p in params])
    assert_std(noise, sigma * clip / batch)
    # A wrong scale is rejected by the same test (it has power at this sample size).
    with pytest.raises(AssertionError):
        assert_std(noise, 1.03 * sigma * clip / batch)


def test_noise_is_independent_across_parameters_and_steps():
    a, b = zero_grad_params((40_000,), (40_000,))
    privatize_gradients_(
        [a, b], noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=1.0, dp_seed=5, step=0
    )
    (c,) = zero_grad_params((40_000,))
    privatize_gradients_([c], noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=1.0, dp_seed=5, step=1)
    for x, y in [(a.grad, b.grad), (a.grad, c.grad)]:
        r = np.corrcoef(x.numpy(), y.numpy())[0, 1]
        assert abs(r) < 5 / np.sqrt(x.numel())


def test_noise_is_reproducible_from_seed_and_step_only():
    def draw(seed, step):
        params = zero_grad_params((500,), (7, 3))
        privatize_gradients_(
            params, noise_multiplier=1.0, clip_norm=2.0, expected_batch_size=3.0, dp_seed=seed, step=step
        )
        return torch.cat([p.grad.flatten() for p in params])

    assert torch.equal(draw(1, 4), draw(1, 4))  # every rank, and a resumed run, draw the same noise
    assert not torch.equal(draw(1, 4), draw(1, 5))
    assert not torch.equal(draw(1, 4), draw(2, 4))


def test_one_draw_per_device_and_dtype_split_in_parameter_order():
    """All parameters of one device and dtype take consecutive draws of one ``randn`` (one kernel), in
    the given order; another dtype on the same device continues that device's stream."""
    params = zero_grad_params((500,), (7, 3)) + zero_grad_params((40,), dtype=torch.float64)
    params += zero_grad_params((2, 5))
    privatize_gradients_(
        params, noise_multiplier=1.0, clip_norm=2.0, expected_batch_size=4.0, dp_seed=6, step=9
    )
    generator = noise_generator(6, 9, torch.device("cpu"), 0)
    first = torch.randn(500 + 21 + 10, generator=generator) / 2.0
    second = torch.randn(40, generator=generator, dtype=torch.float64) / 2.0
    float32 = torch.cat([p.grad.flatten() for p in (params[0], params[1], params[3])])
    assert torch.equal(float32, first)
    assert torch.equal(params[2].grad.flatten(), second)


def test_devices_get_distinct_streams():
    g0 = noise_generator(3, 0, torch.device("cpu"), 0)
    g1 = noise_generator(3, 0, torch.device("cpu"), 1)
    assert not torch.equal(torch.randn(10, generator=g0), torch.randn(10, generator=g1))


def test_gradient_sum_is_divided_by_expected_batch_size_and_missing_grads_get_noise():
    grad = torch.randn(6, 5, dtype=torch.float64)
    (p,) = zero_grad_params((6, 5), dtype=torch.float64)
    p.grad = grad.clone()
    privatize_gradients_([p], noise_multiplier=0.0, clip_norm=1.0, expected_batch_size=4.0, dp_seed=1, step=0)
    torch.testing.assert_close(p.grad, grad / 4.0, rtol=0, atol=0)
    q = torch.nn.Parameter(torch.zeros(20_000))  # no gradient at all (e.g. an empty batch)
    privatize_gradients_([q], noise_multiplier=3.0, clip_norm=1.0, expected_batch_size=2.0, dp_seed=1, step=0)
    assert_std(q.grad, 1.5)


def test_low_precision_grads_get_the_noise_added_before_rounding():
    grad = torch.randn(1000).to(torch.bfloat16)
    (p,) = zero_grad_params((1000,), dtype=torch.bfloat16)
    p.grad = grad.clone()
    privatize_gradients_([p], noise_multiplier=1.0, clip_norm=0.5, expected_batch_size=2.0, dp_seed=8, step=2)
    generator = noise_generator(8, 2, torch.device("cpu"), 0)
    expected = ((grad.float() + 0.5 * torch.randn(1000, generator=generator)) / 2.0).to(torch.bfloat16)
    assert torch.equal(p.grad, expected)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"noise_multiplier": -1.0}, "noise_multiplier must be a finite number >= 0, got -1.0"),
        ({"noise_multiplier": float("nan")}, "noise_multiplier must be a finite number >= 0"),
        ({"clip_norm": 0.0}, "clip_norm must be a positive finite number, got 0.0"),
        ({"expected_batch_size": 0.0}, "expected_batch_size must be a positive finite number, got 0.0"),
    ],
)
def test_bad_parameters_are_refused_before_any_noise(kwargs, match):
    (p,) = zero_grad_params((3,))
    values = {"noise_multiplier": 1.0, "clip_norm": 1.0, "expected_batch_size": 1.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        privatize_gradients_([p], dp_seed=1, step=0, **values)
    assert torch.equal(p.grad, torch.zeros(3))


def test_noise_only_steps_in_training_have_std_sigma_c_over_b(tmp_path):
    """End to end: with a tiny rho the batch is empty and SGD(lr=1) moves every weight by the noise / B;
    other callbacks already see that noised gradient in on_pre_optimizer_step."""
    n, sigma, clip, batch = 4, 3.0, 0.5, 2.0
    model = tiny_gpt2(seed=0)
    seen: dict[str, torch.Tensor] = {}

    class GradientSpy(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            seen.update({k: p.grad.clone() for k, p in model.named_parameters()})

    plan = make_plan(
        np.full(n, 1e-12), steps=1, noise_multiplier=sigma, expected_batch_size=batch, rows=token_dataset(n)
    )
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(tmp_path, max_steps=1, per_example_clip_norm=clip),
        train_dataset=plan.attach(token_dataset(n)),
        data_collator=pad_collate,
        plan=plan,
        optimizers=sgd(model, lr=1.0),
        callbacks=[GradientSpy()],
    )
    before = parameters(model)
    trainer.train()
    after = parameters(model)
    assert trainer.state.log_history[0]["dp_batch_size"] == 0
    delta = torch.cat([(before[k] - after[k]).flatten() for k in before])
    assert_std(delta, sigma * clip / batch)
    for name, grad in seen.items():
        torch.testing.assert_close(grad, before[name] - after[name], rtol=1e-5, atol=1e-7)


def test_draws_are_cut_into_runs_of_whole_parameters_at_most_the_cap(monkeypatch):
    """Consecutive parameters share one draw up to ``NOISE_DRAW_MAX`` entries; a parameter larger than the
    cap is drawn alone: the next run continues the same stream."""
    import hush_hf.trainer.noise as noise

    monkeypatch.setattr(noise, "NOISE_DRAW_MAX", 30)
    params = zero_grad_params((10,), (4, 5), (40,), (3,), (25,))  # runs: [10, 20], [40], [3, 25]
    privatize_gradients_(
        params, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=1.0, dp_seed=6, step=9
    )
    generator = noise_generator(6, 9, torch.device("cpu"), 0)
    expected = torch.cat([torch.randn(n, generator=generator) for n in (30, 40, 28)])
    assert torch.equal(torch.cat([p.grad.flatten() for p in params]), expected)
