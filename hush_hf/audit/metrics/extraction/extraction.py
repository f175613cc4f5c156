"""Exact-match extraction rate of greedy continuations, as an ``evaluate`` metric."""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """k-extractability (Carlini et al. 2023): predictions are the token ids greedy decoding
produced after a k-token prompt, references the true next tokens. A sequence is extracted when all of
them match. Returns fraction_extracted, num_extracted and mean_matched_tokens (leading tokens matched)."""

_CITATION = """@inproceedings{carlini2023quantifying, title={Quantifying Memorization Across Neural Language
Models}, author={Carlini, Nicholas and Ippolito, Daphne and Jagielski, Matthew and Lee, Katherine and
Tram{\\`e}r, Florian and Zhang, Chiyuan}, booktitle={ICLR}, year={2023}}"""

_INPUTS = """predictions: generated token ids per sequence. references: true continuation token ids (same
length as the prediction, else the sequence counts as not extracted)."""


def _leading_matches(generated, true):
    count = 0
    for a, b in zip(generated, true, strict=False):  # a shorter prediction stops the count
        if a != b:
            break
        count += 1
    return count


class Extraction(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=_CITATION, inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.List(datasets.Value("int64")),
                                        "references": datasets.List(datasets.Value("int64"))}))

    def _compute(self, predictions, references):
        leading = [_leading_matches(p, r) for p, r in zip(predictions, references, strict=True)]
        extracted = [len(p) == len(r) and n == len(r)
                     for p, r, n in zip(predictions, references, leading, strict=True)]
        return {"fraction_extracted": float(np.mean(extracted)), "num_extracted": int(sum(extracted)),
                "mean_matched_tokens": float(np.mean(leading))}
