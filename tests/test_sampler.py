"""WeightedPoissonSampler: inclusion frequencies, independence, statelessness, sharding, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from accelerate.data_loader import skip_first_batches
from scipy import stats
from torch.utils.data import DataLoader

from hush_hf.sampling import WeightedPoissonSampler, draw_dp_seed, step_seed_sequence
from hush_hf.sampling.seeds import NOISE_STREAM, SAMPLING_STREAM

RHO = np.array([0.0, 1.0, 0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.99] * 3)
STEPS = 4000
SEED = 20250101


@pytest.fixture(scope="module")
def inclusions() -> np.ndarray:
    """(STEPS, n) 0/1 matrix of which example was in which batch."""
    sampler = WeightedPoissonSampler(RHO, num_steps=STEPS, seed=SEED)
    hits = np.zeros((STEPS, RHO.size), dtype=bool)
    for t, batch in enumerate(sampler):
        hits[t, batch] = True
    return hits


def test_inclusion_frequencies_match_rho(inclusions):
    counts = inclusions.sum(axis=0)
    assert counts[RHO == 0].max() == 0 and counts[RHO == 1].min() == STEPS
    inner = (RHO > 0) & (RHO < 1)
    pvalues = [
        stats.binomtest(int(k), STEPS, p).pvalue for k, p in zip(counts[inner], RHO[inner], strict=True)
    ]
    # Two-sided binomial test per example, Bonferroni-corrected at 1e-3 overall.
    assert min(pvalues) > 1e-3 / inner.sum()


def test_batch_size_has_poisson_binomial_law(inclusions):
    sizes = inclusions.sum(axis=1)
    mean, var = RHO.sum(), (RHO * (1 - RHO)).sum()
    z = (sizes.mean() - mean) / np.sqrt(var / STEPS)
    assert abs(z) < 4
    # Sample variance against the Poisson-binomial variance (chi-square, 1e-4 two-sided).
    chi2 = (STEPS - 1) * sizes.var(ddof=1) / var
    assert stats.chi2.ppf(5e-5, STEPS - 1) < chi2 < stats.chi2.ppf(1 - 5e-5, STEPS - 1)


def test_inclusions_are_independent_across_examples_and_steps(inclusions):
    x = inclusions[:, (RHO > 0.04) & (RHO < 0.95)].astype(float)
    # Pairwise co-inclusion vs rho_i rho_j: correlations of independent Bernoulli columns are ~N(0, 1/T).
    corr = np.corrcoef(x, rowvar=False)[np.triu_indices(x.shape[1], k=1)]
    assert np.abs(corr).max() < 4.5 / np.sqrt(STEPS)
    # Consecutive steps: lag-1 autocorrelation of each example's indicator.
    lag = [np.corrcoef(col[:-1], col[1:])[0, 1] for col in x.T]
    assert np.abs(lag).max() < 4.5 / np.sqrt(STEPS)


def test_batches_are_a_function_of_seed_and_step():
    rho = np.full(50, 0.2)
    a = WeightedPoissonSampler(rho, num_steps=20, seed=7)
    b = WeightedPoissonSampler(rho, num_steps=20, seed=7)
    c = WeightedPoissonSampler(rho, num_steps=20, seed=8)
    batches = list(a)
    assert batches == list(b)
    assert batches == [a.batch(t).tolist() for t in range(20)]  # stateless: batch(t) alone
    assert batches != list(c)
    assert len({tuple(x) for x in batches}) > 15  # steps differ from each other
    assert len(a) == 20


def test_resume_by_skipping_batches_continues_the_same_sequence():
    """Trainer resumes by accelerate's skip_first_batches: batch t must still arrive at step t."""
    rho = np.full(30, 0.3)
    sampler = WeightedPoissonSampler(rho, num_steps=10, seed=11)
    loader = DataLoader(list(range(30)), batch_sampler=sampler, collate_fn=list)
    full = [list(b) for b in loader]
    resumed = [list(b) for b in skip_first_batches(loader, 4)]
    assert resumed == full[4:]


def test_empty_batches_are_yielded():
    sampler = WeightedPoissonSampler(np.full(10, 0.01), num_steps=50, seed=3)
    batches = list(sampler)
    assert len(batches) == 50 and any(b == [] for b in batches)


@pytest.mark.parametrize("world_size", [2, 3])
def test_rank_shares_are_disjoint_and_cover_the_batch(world_size):
    rho = np.linspace(0.05, 0.95, 40)
    shards = [
        WeightedPoissonSampler(rho, num_steps=30, seed=5, num_replicas=world_size, rank=r)
        for r in range(world_size)
    ]
    whole = WeightedPoissonSampler(rho, num_steps=30, seed=5)
    for t, shares in enumerate(zip(*shards, strict=True)):
        flat = [i for share in shares for i in share]
        assert sorted(flat) == whole.batch(t).tolist()  # union is the batch, nothing padded or repeated
        assert len(set(flat)) == len(flat)
        sizes = [len(s) for s in shares]
        assert max(sizes) - min(sizes) <= 1


def test_seed_is_secret_and_fresh():
    sampler = WeightedPoissonSampler(np.full(3, 0.5), num_steps=2, seed=987654321987654321)
    assert "987654321987654321" not in repr(sampler)
    seeds = {draw_dp_seed() for _ in range(4)}
    assert len(seeds) == 4 and all(0 <= s < 2**128 for s in seeds)
    assert max(seeds) >= 2**64  # 128 bits, not 64 (fails with probability 2^-256)


def test_streams_differ_between_sampling_and_noise():
    a = step_seed_sequence(5, 3, SAMPLING_STREAM).generate_state(4)
    b = step_seed_sequence(5, 3, NOISE_STREAM).generate_state(4)
    c = step_seed_sequence(5, 4, SAMPLING_STREAM).generate_state(4)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize(
    ("probs", "kwargs", "match"),
    [
        ([0.5, 1.5], {}, "example 1 has 1.5"),
        ([0.5, np.nan], {}, "example 1 has nan"),
        ([-0.1], {}, "example 0 has -0.1"),
        ([[0.5]], {}, "must be 1-D"),
        ([0.5], {"num_steps": 0}, "num_steps must be an integer >= 1, got 0"),
        ([0.5], {"num_replicas": 2, "rank": 2}, r"rank must be in \[0, num_replicas=2\), got 2"),
        ([0.5], {"seed": -1}, "seed must be an integer"),
        ([0.5], {"seed": 2**128}, "value not shown"),
        ([0.5], {"seed": 1.5}, "got a float"),
    ],
)
def test_bad_input_is_refused(probs, kwargs, match):
    args = {"num_steps": 3, "seed": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        WeightedPoissonSampler(probs, **args)


def test_seed_error_does_not_show_the_seed():
    with pytest.raises(ValueError) as error:
        WeightedPoissonSampler([0.5], num_steps=1, seed=2**128 + 12345)
    assert str(2**128 + 12345) not in str(error.value)
