"""Canary exposure (Carlini et al. 2019, "The Secret Sharer", Sec. 4).

Candidates s[r], r in R, are ranked by log-perplexity Px(s[r]) = -log P(s[r]) under the model; the
canary's rank is 1 + the number of other candidates with a smaller log-perplexity, and

    exposure = log2 |R| - log2 rank            (Def. 4; a canary ranked 1st of 10^6 has 19.93 bits).

Ties count one half each: the rank is the expected rank when ties are broken at random, so a model
that knows nothing (all candidates tied) gets exposure log2(|R| / ((|R|+1)/2)) ~ 1 bit, not log2 |R|.
For an unmemorised canary the rank is uniform on 1..|R| and the exposure averages 1/ln 2 ~ 1.44 bits.

When |R| is too large to enumerate, the rank is extrapolated from a uniform sample of candidates
(Sec. 4.3, "Approximating exposure"): rank ~ 1 + (|R| - 1) F(Px(canary)), with F the distribution
function of the log-perplexity of a random candidate, either the sample's empirical CDF or a
skew-normal fitted to the sample (the paper's choice, which extrapolates into the tail).

A masked LM has no log-perplexity; its candidates are ranked by minus the fill-in log-likelihood
sum_i log P(token i of s[r]) with the template around one [MASK] per token of the value, all masks
filled at once (the masked LM's attack of :mod:`hush_hf.audit.reconstruction`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from hush_hf.audit.canaries import PLACEHOLDER, Canary, CanarySpace
from hush_hf.audit.reconstruction import masked_fill_scores
from hush_hf.audit.scoring import ModelKind, check_positive_int, encode, sequence_log_probs

ExposureMethod = Literal["exact", "empirical", "skewnorm"]
CHANCE_EXPOSURE_BITS = 1.0 / math.log(2.0)  # E[log2 N - log2 U{1..N}] -> 1/ln 2 as N grows


def exposure_from_rank(rank: float, space_size: int) -> float:
    """exposure = log2 |R| - log2 rank (Carlini et al. 2019, Def. 4), for 1 <= rank <= |R|."""
    if isinstance(space_size, bool) or not isinstance(space_size, numbers.Integral) or space_size < 1:
        raise ValueError(f"space_size must be a positive integer, got {space_size!r}")
    if not (isinstance(rank, numbers.Real) and 1.0 <= rank <= space_size):
        raise ValueError(f"rank must lie in [1, space_size={space_size}], got {rank!r}")
    return math.log2(space_size) - math.log2(rank)


def _finite(field: str, values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise ValueError(f"{field}[{bad[0]}]={array[bad[0]]!r} is not finite")
    return array


def rank_among(canary_score: float, other_scores: Any) -> float:
    """1 + #{others with a smaller log-perplexity} + #{ties} / 2: the expected rank, ties broken at random."""
    canary = float(_finite("canary_score", [canary_score])[0])
    others = _finite("other_scores", other_scores)
    return 1.0 + float(np.count_nonzero(others < canary)) + 0.5 * float(np.count_nonzero(others == canary))


def exact_exposure(canary_score: float, other_scores: Any) -> tuple[float, float]:
    """(exposure, rank) from the log-perplexities of the canary and of *all* |R| - 1 other candidates."""
    others = _finite("other_scores", other_scores)
    rank = rank_among(canary_score, others)
    return exposure_from_rank(rank, others.size + 1), rank


def estimated_exposure(canary_score: float, sampled_scores: Any, space_size: int,
                       method: Literal["empirical", "skewnorm"] = "skewnorm") -> tuple[float, float]:
    """(exposure, estimated rank) from log-perplexities of candidates drawn uniformly from R.

    rank = 1 + (|R| - 1) F(canary_score), F the empirical CDF of the sample (ties one half) or a
    skew-normal fitted to it by maximum likelihood (Carlini et al. 2019, Sec. 4.3). The estimate
    lies in [1, |R|], so the exposure lies in [0, log2 |R|].
    """
    return estimated_exposures([canary_score], sampled_scores, space_size, method)[0]


def estimated_exposures(canary_scores: Sequence[float], sampled_scores: Any, space_size: int,
                        method: Literal["empirical", "skewnorm"] = "skewnorm") -> list[tuple[float, float]]:
    """:func:`estimated_exposure` of several canaries against one shared sample: the skew-normal is
    fitted once (the fit, not the scoring, dominates when it is repeated per canary)."""
    sample = _finite("sampled_scores", sampled_scores)
    canaries = _finite("canary_score", canary_scores)
    if sample.size < 2:
        raise ValueError(f"sampled_scores must hold at least 2 scores, got {sample.size}")
    if method == "empirical":
        below = [np.count_nonzero(sample < c) + 0.5 * np.count_nonzero(sample == c) for c in canaries]
        fractions = np.asarray(below, dtype=np.float64) / sample.size
    elif method == "skewnorm":
        fractions = np.asarray(fit_skewnorm(sample).cdf(canaries), dtype=np.float64)
    else:
        raise ValueError(f"method must be 'empirical' or 'skewnorm', got {method!r}")
    ranks = 1.0 + (space_size - 1) * np.clip(fractions, 0.0, 1.0)
    return [(exposure_from_rank(float(rank), space_size), float(rank)) for rank in ranks]


def fit_skewnorm(sample: np.ndarray) -> Any:
    """A frozen ``scipy.stats.skewnorm`` fitted by maximum likelihood (scipy's fit, no hand-written MLE)."""
    from scipy import stats

    if np.ptp(sample) == 0.0:
        raise ValueError("sampled_scores are all equal: a skew-normal cannot be fitted "
                         "(use method='empirical')")
    shape, loc, scale = stats.skewnorm.fit(sample)
    return stats.skewnorm(shape, loc=loc, scale=scale)


@dataclass(frozen=True)
class CanaryExposure:
    """The exposure of canary ``index`` (identified by index only, never by value)."""

    index: int
    exposure: float
    rank: float
    space_size: int
    method: str
    num_candidates_scored: int
    repetitions: int

    @property
    def max_exposure(self) -> float:
        return math.log2(self.space_size)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "max_exposure": self.max_exposure}


def canary_exposures(model: Any, tokenizer: Any, canaries: Sequence[Canary], *,
                     method: ExposureMethod | Literal["auto"] = "auto", max_exact: int = 100_000,
                     num_samples: int = 5_000, batch_size: int = 64, seed: int = 0,
                     kind: ModelKind = "causal") -> list[CanaryExposure]:
    """The exposure of each canary under a causal LM, or a masked LM with ``kind="masked"`` (one shared
    scoring of the candidates).

    ``method="auto"`` enumerates R exactly when |R| <= ``max_exact`` and otherwise fits a skew-normal
    to ``num_samples`` candidates drawn uniformly from R without the canaries (seeded). Each candidate
    text is tokenized whole, as in training, and scored by its log-perplexity.
    """
    if not canaries:
        raise ValueError("canaries must hold at least one canary, got none")
    spaces = {c.space for c in canaries}
    if len(spaces) != 1:
        raise ValueError(f"canaries must share one canary space, got {len(spaces)}")
    space: CanarySpace = spaces.pop()
    batch_size = check_positive_int("batch_size", batch_size)
    if method == "auto":
        method = "exact" if space.size <= check_positive_int("max_exact", max_exact) else "skewnorm"
    if method not in ("exact", "empirical", "skewnorm"):
        raise ValueError(f"method must be 'auto', 'exact', 'empirical' or 'skewnorm', got {method!r}")

    if kind not in ("causal", "masked"):
        raise ValueError(f"kind must be 'causal' or 'masked', got {kind!r}")

    def log_perplexity(values: Sequence[str]) -> np.ndarray:
        if kind == "masked":
            before, after = space.template.split(PLACEHOLDER)
            return -masked_fill_scores(model, tokenizer, before, after, values, batch_size=batch_size)
        ids = encode(tokenizer, [space.text(v) for v in values])
        return -sequence_log_probs(model, ids, batch_size=batch_size)

    if method == "exact":
        scores = np.empty(space.size)
        chunk = 64 * batch_size
        for start in range(0, space.size, chunk):
            stop = min(start + chunk, space.size)
            scores[start:stop] = log_perplexity([space.value(i) for i in range(start, stop)])
        results = []
        for canary in canaries:
            position = space.index(canary.value)
            exposure, rank = exact_exposure(scores[position], np.delete(scores, position))
            results.append(CanaryExposure(canary.index, exposure, rank, space.size, method, space.size,
                                          canary.repetitions))
        return results
    canary_scores = log_perplexity([c.value for c in canaries])
    # The other candidates, uniform on R minus the canaries: a canary in its own reference sample would
    # rank it against itself, and make_canaries with the same seed draws exactly the first values here.
    rng, inserted = np.random.default_rng(seed), {c.value for c in canaries}
    if len(inserted) >= space.size:
        raise ValueError(f"the canaries take all {space.size} values of R: no other candidate to rank")
    others: list[str] = []
    while len(others) < check_positive_int("num_samples", num_samples):
        others += [v for v in space.random_values(num_samples - len(others), rng) if v not in inserted]
    sample = log_perplexity(others)
    estimates = estimated_exposures(canary_scores, sample, space.size, method)
    return [
        CanaryExposure(canary.index, exposure, rank, space.size, method, sample.size, canary.repetitions)
        for canary, (exposure, rank) in zip(canaries, estimates, strict=True)
    ]


def summarize_exposures(results: Sequence[CanaryExposure]) -> dict[str, Any]:
    """Max/mean exposure over canaries, split by whether they were inserted, next to chance (1.44 bits)."""
    def stats(group: Sequence[CanaryExposure]) -> dict[str, Any]:
        values = [r.exposure for r in group]
        return {"count": len(values), "max": max(values, default=None),
                "mean": float(np.mean(values)) if values else None}

    return {
        "inserted": stats([r for r in results if r.repetitions > 0]),
        "not_inserted": stats([r for r in results if r.repetitions == 0]),
        "max_possible": max((r.max_exposure for r in results), default=None),
        "chance_mean": CHANCE_EXPOSURE_BITS,
        "canaries": [r.to_json() for r in results],
    }
