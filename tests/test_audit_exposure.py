"""Exposure: the closed form, exact enumeration on a fixed-logit LM, and extrapolation from samples."""

import itertools
import math

import numpy as np
import pytest

from hush_hf.audit.canaries import Canary, CanarySpace
from hush_hf.audit.exposure import (
    CHANCE_EXPOSURE_BITS,
    canary_exposures,
    estimated_exposure,
    exact_exposure,
    exposure_from_rank,
    rank_among,
    summarize_exposures,
)
from tests.test_audit_toys import (
    CHARS,
    BigramLM,
    char_ids,
    char_tokenizer,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    sequence_log_prob,
)

SPACE = CanarySpace(template="My ID is: {secret}", alphabet="0123456789", length=3)


def test_first_of_a_million_is_19_93_bits():
    assert round(exposure_from_rank(1, 10**6), 2) == 19.93
    assert exposure_from_rank(1, 10**6) == pytest.approx(6 * math.log2(10))
    assert exposure_from_rank(10**6, 10**6) == 0.0
    assert exposure_from_rank(2, 8) == pytest.approx(2.0)


@pytest.mark.parametrize(("rank", "size"), [(0, 10), (11, 10), (float("nan"), 10), (1, 0)])
def test_exposure_from_rank_refuses_bad_input(rank, size):
    with pytest.raises(ValueError, match="rank|space_size"):
        exposure_from_rank(rank, size)


def test_rank_counts_ties_one_half():
    assert rank_among(1.0, [0.5, 1.0, 1.0, 2.0]) == 1 + 1 + 1.0
    assert rank_among(0.0, [1.0, 2.0]) == 1.0
    with pytest.raises(ValueError, match=r"other_scores\[1\]"):
        rank_among(0.0, [1.0, float("inf")])


def digit_table(seed: int) -> np.ndarray:
    """Bigram logits: random digit-to-digit transitions, uniform elsewhere."""
    rng = np.random.default_rng(seed)
    table = np.zeros((len(CHARS), len(CHARS)))
    digits = [CHARS.index(d) for d in "0123456789"]
    table[np.ix_(digits, digits)] = rng.normal(0, 2, size=(10, 10))
    table[CHARS.index(" "), digits] = rng.normal(0, 2, size=10)
    return table


def reference_log_perplexities(table: np.ndarray) -> dict[str, float]:
    """-log P of every canary text of SPACE, by NumPy from the bigram table."""
    values = ["".join(v) for v in itertools.product("0123456789", repeat=3)]
    return {v: -sequence_log_prob(table, char_ids(SPACE.text(v))) for v in values}


def test_exact_exposure_on_a_fixed_logit_lm_matches_hand_computation():
    table = digit_table(seed=1)
    reference = reference_log_perplexities(table)
    ordered = sorted(reference, key=reference.get)
    best, middle, worst = ordered[0], ordered[499], ordered[-1]
    canaries = [Canary(k, v, 1, SPACE) for k, v in enumerate((best, middle, worst))]
    results = canary_exposures(BigramLM(table), char_tokenizer(), canaries, method="exact", batch_size=256)
    assert [r.method for r in results] == ["exact"] * 3
    assert results[0].rank == 1.0 and results[0].exposure == pytest.approx(math.log2(1000))
    assert results[1].rank == 500.0 and results[1].exposure == pytest.approx(math.log2(1000 / 500))
    assert results[2].rank == 1000.0 and results[2].exposure == pytest.approx(0.0, abs=1e-12)
    assert all(r.num_candidates_scored == 1000 for r in results)


def test_a_model_that_knows_nothing_gives_about_one_bit():
    table = np.zeros((len(CHARS), len(CHARS)))  # every candidate equally likely: all tied
    results = canary_exposures(BigramLM(table), char_tokenizer(), [Canary(0, "042", 1, SPACE)],
                               method="exact", batch_size=512)
    assert results[0].rank == pytest.approx(1 + 999 / 2)
    assert results[0].exposure == pytest.approx(math.log2(1000 / 500.5))


def test_sampled_exposure_on_the_model_tracks_exact():
    table = digit_table(seed=2)
    reference = reference_log_perplexities(table)
    ordered = sorted(reference, key=reference.get)
    canaries = [Canary(0, ordered[20], 1, SPACE), Canary(1, ordered[300], 0, SPACE)]
    exact = canary_exposures(BigramLM(table), char_tokenizer(), canaries, method="exact", batch_size=512)
    sampled = canary_exposures(BigramLM(table), char_tokenizer(), canaries, method="empirical",
                               num_samples=800, batch_size=512, seed=0)
    for e, s in zip(exact, sampled, strict=True):
        assert s.method == "empirical" and s.num_candidates_scored == 800
        assert s.exposure == pytest.approx(e.exposure, abs=0.4)
    summary = summarize_exposures(exact)
    assert summary["inserted"]["count"] == 1 and summary["not_inserted"]["count"] == 1
    assert summary["max_possible"] == pytest.approx(math.log2(1000))
    assert summary["chance_mean"] == pytest.approx(1 / math.log(2))


def digit_costs(seed: int) -> np.ndarray:
    """Log-perplexities of all 10^5 five-digit values: a sum of per-position costs (a discrete toy)."""
    rng = np.random.default_rng(seed)
    costs = rng.exponential(1.0, size=(5, 10))
    grid = np.indices((10,) * 5).reshape(5, -1)
    return sum(costs[k][grid[k]] for k in range(5))


def check_against_exact(scores: np.ndarray, sample: np.ndarray, method: str, ranks: tuple, tolerance: float):
    order = np.argsort(scores, kind="stable")
    for target_rank in ranks:
        position = order[target_rank - 1]
        exact, rank = exact_exposure(scores[position], np.delete(scores, position))
        assert rank == target_rank
        estimate, _ = estimated_exposure(scores[position], sample, scores.size, method)
        assert estimate == pytest.approx(exact, abs=tolerance), (method, target_rank)


def test_skewnorm_extrapolation_matches_exact_enumeration_into_the_tail():
    from scipy import stats

    scores = stats.skewnorm(-3.0, loc=20.0, scale=3.0).rvs(size=10**5, random_state=3)
    sample = scores[np.random.default_rng(4).integers(0, scores.size, size=10_000)]
    # Down to rank 30 of 10^5 (11.7 bits), where the 10^4 samples hold about 3 better candidates.
    check_against_exact(scores, sample, "skewnorm", (30, 100, 300, 3_000, 30_000), tolerance=0.5)


@pytest.mark.parametrize("method", ["empirical", "skewnorm"])
def test_sampled_estimates_match_exact_enumeration_in_the_bulk(method):
    scores = digit_costs(seed=3)
    sample = scores[np.random.default_rng(4).integers(0, scores.size, size=4_000)]
    check_against_exact(scores, sample, method, (3_000, 30_000), tolerance=0.2)


def test_estimated_exposure_stays_within_zero_and_log_size():
    sample = np.linspace(0.0, 1.0, 100)
    top, _ = estimated_exposure(-5.0, sample, 1000, "empirical")  # better than every sampled candidate
    bottom, _ = estimated_exposure(5.0, sample, 1000, "skewnorm")
    assert top == pytest.approx(math.log2(1000))
    assert bottom == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="method"):
        estimated_exposure(0.0, sample, 1000, "normal")
    with pytest.raises(ValueError, match="all equal"):
        estimated_exposure(0.0, np.ones(10), 1000, "skewnorm")


def test_chance_exposure_is_the_mean_over_uniform_ranks():
    size = 10**5
    mean = np.mean(math.log2(size) - np.log2(np.arange(1, size + 1)))
    assert mean == pytest.approx(CHANCE_EXPOSURE_BITS, abs=1e-3)


def test_canary_exposures_refuses_bad_input():
    model, tokenizer = BigramLM(np.zeros((len(CHARS), len(CHARS)))), char_tokenizer()
    with pytest.raises(ValueError, match="at least one canary"):
        canary_exposures(model, tokenizer, [])
    with pytest.raises(ValueError, match="method"):
        canary_exposures(model, tokenizer, [Canary(0, "123", 1, SPACE)], method="bogus")
    other = CanarySpace(length=2)
    with pytest.raises(ValueError, match="one canary space"):
        canary_exposures(model, tokenizer, [Canary(0, "123", 1, SPACE), Canary(1, "12", 1, other)])


def test_several_canaries_share_one_fit_and_get_the_single_canary_estimates(monkeypatch):
    from hush_hf.audit import exposure as module

    sample = np.random.default_rng(5).normal(10.0, 2.0, size=500)
    canaries = [4.0, 9.5, 13.0]
    expected = [estimated_exposure(c, sample, 10**6, "skewnorm") for c in canaries]
    fits = []
    real_fit = module.fit_skewnorm
    monkeypatch.setattr(module, "fit_skewnorm", lambda s: fits.append(1) or real_fit(s))
    shared = module.estimated_exposures(canaries, sample, 10**6, "skewnorm")
    assert len(fits) == 1
    for (exposure, rank), (want_exposure, want_rank) in zip(shared, expected, strict=True):
        assert exposure == pytest.approx(want_exposure, rel=1e-12)
        assert rank == pytest.approx(want_rank, rel=1e-12)
    assert module.estimated_exposures(canaries, sample, 10**6, "empirical") == [
        estimated_exposure(c, sample, 10**6, "empirical") for c in canaries
    ]


def test_masked_lm_exposure_ranks_candidates_by_their_fill_in_likelihood(tmp_path):
    """kind="masked": every value of a 100-candidate space scored by hand (one [MASK] per token of the
    value, all filled at once, log-softmax at the masks), ranked, and the exposure taken from the rank."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    digits = [str(d) for d in range(10)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "my", "pin", "is", ":", *digits]
    vocab += [f"##{d}" for d in digits]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab))
    tokenizer = BertTokenizerFast.from_pretrained(tmp_path)
    torch.manual_seed(3)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=24, max_position_embeddings=32)
    model = BertForMaskedLM(config).eval()
    space = CanarySpace(template="My PIN is: {secret}", alphabet="0123456789", length=2)
    canaries = [Canary(0, "47", 5, space), Canary(1, "90", 5, space)]

    def fill_in(value: str) -> float:
        value_ids = tokenizer(value, add_special_tokens=False)["input_ids"]
        assert len(value_ids) == 2  # "47" -> "4", "##7"
        ids = torch.tensor([tokenizer("My PIN is: [MASK] [MASK]")["input_ids"]])
        positions = (ids[0] == tokenizer.mask_token_id).nonzero().ravel()
        with torch.no_grad():
            log_p = torch.log_softmax(model(input_ids=ids).logits[0, positions].double(), dim=-1)
        return float(log_p[torch.arange(2), torch.tensor(value_ids)].sum())

    scores = {space.value(i): fill_in(space.value(i)) for i in range(space.size)}
    found = canary_exposures(model, tokenizer, canaries, kind="masked", method="exact", batch_size=7)
    for canary, result in zip(canaries, found, strict=True):
        mine = scores[canary.value]
        others = np.array([s for v, s in scores.items() if v != canary.value])
        rank = 1 + np.sum(others > mine + 1e-9) + 0.5 * np.sum(np.abs(others - mine) <= 1e-9)
        assert result.rank == rank and result.exposure == pytest.approx(math.log2(100 / rank))
    assert len({round(s, 6) for s in scores.values()}) > 50  # the model tells the candidates apart
    with pytest.raises(ValueError, match="kind must be 'causal' or 'masked', got 'seq2seq'"):
        canary_exposures(model, tokenizer, canaries, kind="seq2seq")


def test_sampled_candidates_leave_the_canaries_out_even_with_the_canaries_seed():
    """make_canaries(seed=s) draws the first values of default_rng(s); a sample drawn with the same seed
    would rank each canary against itself and its siblings. The candidates must be R minus the canaries."""
    from hush_hf.audit.canaries import make_canaries

    canaries = make_canaries(3, 1, space=SPACE, seed=11)
    scored: list[str] = []

    class Recording:
        def __init__(self):
            self.inner = char_tokenizer()

        def __call__(self, texts, **kwargs):
            scored.extend(texts)
            return self.inner(texts, **kwargs)

    table = np.zeros((len(CHARS), len(CHARS)))
    found = canary_exposures(BigramLM(table), Recording(), canaries, method="empirical", num_samples=40,
                             seed=11)
    texts = {c.text for c in canaries}
    assert scored[:3] == [c.text for c in canaries]  # the canaries first, then the candidates
    candidates = scored[3:]
    assert len(candidates) == 40 == found[0].num_candidates_scored and not texts & set(candidates)
    rng = np.random.default_rng(11)
    drawn = [SPACE.text(v) for v in SPACE.random_values(40, rng)]
    assert drawn[:3] == [c.text for c in canaries]  # what the same seed draws first: the canaries
    assert candidates[:37] == drawn[3:]  # the rest of that draw, then fresh draws to make up 40
