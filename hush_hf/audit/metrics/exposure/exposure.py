"""Canary exposure as an ``evaluate`` metric (Carlini et al. 2019, Def. 4 and Sec. 4.3)."""

import datasets
import evaluate
import numpy as np

from hush_hf.audit.exposure import estimated_exposure, exact_exposure

_DESCRIPTION = """exposure = log2|R| - log2 rank of a canary among the candidates of its randomness space R,
ranked by log-perplexity (lower = more likely; ties count one half). method="exact": candidate_scores
holds every other candidate of R; "empirical"/"skewnorm": a uniform sample of R, extrapolated to
space_size = |R|."""

_CITATION = """@inproceedings{carlini2019secret, title={The Secret Sharer: Evaluating and Testing Unintended
Memorization in Neural Networks}, author={Carlini, Nicholas and Liu, Chang and Erlingsson, {\\'U}lfar and
Kos, Jernej and Song, Dawn}, booktitle={USENIX Security}, year={2019}}"""

_INPUTS = """canary_scores: log-perplexity of each canary. candidate_scores: per canary, the
log-perplexities of the other candidates (all of them, or a sample). space_size: |R| (required
unless method="exact"). method: "exact" (default), "empirical" or "skewnorm".
Returns exposure (list), rank (list), max_exposure, mean_exposure."""


class Exposure(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=_CITATION, inputs_description=_INPUTS,
            features=datasets.Features({"canary_scores": datasets.Value("float64"),
                                        "candidate_scores": datasets.List(datasets.Value("float64"))}))

    def _compute(self, canary_scores, candidate_scores, space_size=None, method="exact"):
        if method == "exact":
            pairs = [exact_exposure(c, others)
                     for c, others in zip(canary_scores, candidate_scores, strict=True)]
        elif space_size is None:
            raise ValueError(f"space_size is required with method={method!r}")
        else:
            pairs = [estimated_exposure(c, sample, int(space_size), method)
                     for c, sample in zip(canary_scores, candidate_scores, strict=True)]
        exposures = [e for e, _ in pairs]
        return {"exposure": exposures, "rank": [r for _, r in pairs],
                "max_exposure": float(np.max(exposures)), "mean_exposure": float(np.mean(exposures))}
