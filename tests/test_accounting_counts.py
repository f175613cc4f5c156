"""Laws of S (examples of a secret in a batch): exact pmfs, tails, and the dominating laws."""

import numpy as np
import pytest
from scipy import stats

from hush_hf.accounting import SecretGroups, counts
from hush_hf.accounting.counts import (
    chernoff_survival,
    envelope,
    poisson_binomial,
    poisson_dominating_rate,
    segment_sums,
    truncated_poisson,
)
from hush_hf.accounting.dominance import envelope_cover, poisson_cover


def full_pmf(rhos: np.ndarray) -> np.ndarray:
    """Reference Poisson-binomial pmf by repeated convolution (no truncation)."""
    pmf = np.array([1.0])
    for q in rhos:
        pmf = np.convolve(pmf, [1.0 - q, q])
    return pmf


def random_groups(seed: int, num: int = 12) -> SecretGroups:
    rng = np.random.default_rng(seed)
    lists = [rng.uniform(0.0, rng.choice([0.01, 0.2, 0.9]), size=rng.integers(0, 60)) for _ in range(num)]
    return SecretGroups.from_lists(lists)


def survival(pmf: np.ndarray, length: int) -> np.ndarray:
    padded = np.zeros(length)
    padded[: min(length, pmf.size)] = pmf[:length]
    tail = np.cumsum(pmf[::-1])[::-1]
    out = np.zeros(length)
    out[: min(length, tail.size)] = tail[:length]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_poisson_binomial_matches_convolution(seed):
    groups = random_groups(seed)
    laws = poisson_binomial(groups)
    k = laws.max_count
    for j in range(groups.num_secrets):
        ref = full_pmf(groups.group(j))
        head = np.zeros(k + 1)
        head[: min(k + 1, ref.size)] = ref[: k + 1]
        np.testing.assert_allclose(laws.pmf[j], head, rtol=1e-11, atol=1e-15)
        assert laws.tail_mass[j] == pytest.approx(ref[k + 1 :].sum(), rel=1e-9, abs=1e-30)
        assert laws.tail_mass[j] <= 1e-20  # truncation point chosen for a negligible tail
        assert laws.support[j] == groups.sizes[j]


def test_chernoff_bounds_the_survival_function():
    rng = np.random.default_rng(3)
    for _ in range(20):
        rhos = rng.uniform(0, rng.uniform(0.01, 0.5), size=rng.integers(1, 80))
        pmf = full_pmf(rhos)
        lam = rhos.sum()
        s = np.arange(pmf.size + 3)
        exact = np.concatenate([np.cumsum(pmf[::-1])[::-1], np.zeros(3)])
        hoeffding = chernoff_survival(lam, s, rhos.size)  # n Bernoulli trials
        poisson = chernoff_survival(lam, s)  # the n -> inf form
        assert np.all(exact <= hoeffding * (1 + 1e-12) + 1e-300)
        assert np.all(hoeffding <= poisson * (1 + 1e-12))
        assert np.all(hoeffding[rhos.size + 1 :] == 0)
    # Poisson tails need the Poisson form.
    lam, s = 2.0, np.arange(30)
    assert np.all(stats.poisson.sf(s - 1, lam) <= chernoff_survival(lam, s) * (1 + 1e-12))


@pytest.mark.parametrize("seed", [4, 5])
def test_truncated_poisson_dominates_each_secret(seed):
    groups = random_groups(seed)
    rates = poisson_dominating_rate(groups)
    for j in range(groups.num_secrets):
        if groups.sizes[j] == 0:
            continue
        ref = full_pmf(groups.group(j))
        law = truncated_poisson(np.array([rates[j]]), np.array([float(groups.sizes[j])]), ref.size - 1)
        g_law = law.survival()[0][: ref.size]
        g_ref = np.cumsum(ref[::-1])[::-1]
        assert np.all(g_ref <= g_law * (1 + 1e-12) + 1e-300)


def test_segment_sums_and_rates():
    groups = SecretGroups.from_lists([[0.1, 0.2], [], [0.5], [1.0, 0.3]])
    np.testing.assert_allclose(segment_sums(groups, groups.rho), [0.3, 0.0, 0.5, 1.3])
    rates = poisson_dominating_rate(groups)
    assert rates[0] == pytest.approx(-np.log(0.9) - np.log(0.8), rel=1e-11)
    assert rates[0] >= -np.log(0.9) - np.log(0.8)
    assert rates[1] == 0.0 and np.isinf(rates[3])


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 18])
def test_rates_in_chunks_equal_one_pass(chunk, monkeypatch):
    # Runs of whole secrets, with empty secrets at the ends and a secret longer than the buffer.
    lists = [[], [0.1, 0.2, 0.3], [0.01] * 9, [], [0.5], [0.2, 1.0], [0.3, 0.4], []]
    groups = SecretGroups.from_lists(lists)
    monkeypatch.setattr(counts, "_CHUNK_ENTRIES", chunk)
    with np.errstate(divide="ignore"):
        one_pass = segment_sums(groups, -np.log1p(-groups.rho)) * (1 + 1e-12)
    np.testing.assert_array_equal(poisson_dominating_rate(groups), one_pass)


def test_envelope_dominates_members_and_covers_group_them():
    groups = random_groups(6, num=30)
    laws = poisson_binomial(groups)
    env = envelope(laws)
    g_env = env.survival()[0]
    slack = 1 + 1e-12  # envelopes are exact up to floating-point rounding
    assert np.all(laws.survival() <= g_env[None, :] * slack)
    assert env.pmf.sum() + env.tail_mass[0] == pytest.approx(1.0, abs=1e-12)
    for resolution in (0.0, 1e-3, 0.5):
        cover = envelope_cover(laws, resolution)
        assert cover.row_of.shape == (groups.num_secrets,)
        g_rows = cover.laws.survival()[cover.row_of]
        assert np.all(laws.survival() <= g_rows * slack)
    identical = poisson_binomial(SecretGroups.from_lists([[0.1, 0.2], [0.2, 0.1], [0.3]]))
    assert envelope_cover(identical, 0.0).laws.num_rows == 2  # same law, different order


def test_poisson_cover_dominates_and_shares_laws():
    rng = np.random.default_rng(7)
    lists = [rng.uniform(0.001, 0.01, size=rng.integers(50, 100)) for _ in range(200)] + [[1.0, 0.2]]
    groups = SecretGroups.from_lists(lists)
    rates = poisson_dominating_rate(groups)
    cover = poisson_cover(rates, groups.sizes, 1.05)
    assert cover.row_of[-1] == -1  # rho = 1: no Poisson law dominates it
    assert cover.laws.num_rows < 40
    laws = poisson_binomial(groups, np.arange(200))
    for j in range(200):
        law = cover.laws.rows([cover.row_of[j]])
        k = min(law.max_count, laws.max_count)
        assert np.all(laws.survival()[j][: k + 1] <= law.survival()[0][: k + 1] * (1 + 1e-12))
        assert law.tail_rate[0] >= rates[j] and law.support[0] >= groups.sizes[j]
