"""Secret reconstruction rank and posterior among candidates, as an ``evaluate`` metric."""

import datasets
import evaluate
import numpy as np

from hush_hf.audit.reconstruction import reconstruct

_DESCRIPTION = """For each secret: the true value's score (log-likelihood in its contexts, summed) and the
alternatives' scores. Returns per secret the rank (ties one half) and the softmax posterior of the true value
under a uniform prior over the candidates, the fraction ranked first, and the mean posterior (to set next to
the certified bound of the Hush plan)."""

_CITATION = """@article{ganesh2025hush, title={Hush! Protecting Secrets During Model Training},
author={Ganesh, Arun and others}, year={2025}}"""

_INPUTS = """secret_scores: the true value's score per secret. candidate_scores: the alternatives' scores per
secret (higher = more likely)."""


class Reconstruction(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=_CITATION, inputs_description=_INPUTS,
            features=datasets.Features({"secret_scores": datasets.Value("float64"),
                                        "candidate_scores": datasets.List(datasets.Value("float64"))}))

    def _compute(self, secret_scores, candidate_scores):
        rows = [reconstruct(j, np.array([[s, *alternatives]]))
                for j, (s, alternatives) in enumerate(zip(secret_scores, candidate_scores, strict=True))]
        return {"rank": [r.rank for r in rows], "probability": [r.probability for r in rows],
                "fraction_ranked_first": float(np.mean([r.ranked_first for r in rows])),
                "mean_probability": float(np.mean([r.probability for r in rows]))}
