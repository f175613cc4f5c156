"""Membership-inference AUC and TPR at fixed FPRs from attack scores, as an ``evaluate`` metric."""

import datasets
import evaluate

from hush_hf.audit.membership import DEFAULT_FPRS, evaluate_scores

_DESCRIPTION = """Exact ROC statistics of a membership-inference attack: predictions are scores
(higher = member, e.g. minus the loss, or minus the calibrated loss), references are 1 for members and 0
for non-members.
AUC = P(member > non-member) + P(tie)/2; TPR at each FPR in fprs is read on the exact ROC."""

_CITATION = """@inproceedings{carlini2022membership,
title={Membership Inference Attacks From First Principles},
author={Carlini, Nicholas and Chien, Steve and Nasr, Milad and Song, Shuang and Terzis, Andreas
and Tram{\\`e}r, Florian}, booktitle={IEEE S&P}, year={2022}}"""

_INPUTS = """predictions: attack scores (float). references: 1 member / 0 non-member. fprs: FPRs at which to
report the TPR (default 1e-3 and 1e-2). Returns auc and tpr_at_fpr (dict keyed by the FPR as text)."""


class Membership(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=_CITATION, inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value("float64"),
                                        "references": datasets.Value("int64")}))

    def _compute(self, predictions, references, fprs=DEFAULT_FPRS):
        labels = set(references)
        if not labels <= {0, 1}:
            raise ValueError(f"references must be 0 or 1, got {sorted(labels - {0, 1})[:3]}")
        members = [s for s, y in zip(predictions, references, strict=True) if y == 1]
        nonmembers = [s for s, y in zip(predictions, references, strict=True) if y == 0]
        result = evaluate_scores(members, nonmembers, attack="metric", fprs=fprs).to_json()
        return {"auc": result["auc"], "tpr_at_fpr": result["tpr_at_fpr"]}
