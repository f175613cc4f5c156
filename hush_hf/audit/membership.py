"""Membership inference: loss and reference-calibrated loss attacks, scored by exact ROC statistics.

Scores are "higher means member". The loss attack (Yeom et al. 2018) scores an example by minus its
loss under the target model; the calibrated attack (Watson et al. 2021; Stock et al. 2022, Sec. 4.2)
by minus (loss under the target model - loss under a reference model not trained on it).

The ROC is computed exactly from the scores: the attacker predicts "member" when score >= t, for
every distinct t, so tied scores move TPR and FPR together (a diagonal step). The area under it is
the Mann-Whitney probability P(member score > non-member score) + P(tie)/2. TPR at a target FPR is
read on the segment between ROC vertices, which a randomised threshold achieves (the attacker's
best TPR at that FPR among threshold rules and their mixtures).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hush_hf.audit.scoring import encode, mean_token_losses

DEFAULT_FPRS = (1e-3, 1e-2)


def _scores(field: str, values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0:
        raise ValueError(f"{field} must hold at least one score, got none")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise ValueError(f"{field}[{bad[0]}]={array[bad[0]]!r} is not finite")
    return array


def roc_curve(member_scores: Any, nonmember_scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds): vertices of the exact ROC, from (0, 0) to (1, 1), for "member iff score >= t".

    thresholds[0] is +inf (nobody predicted member); then the distinct scores in decreasing order.
    """
    members = _scores("member_scores", member_scores)
    nonmembers = _scores("nonmember_scores", nonmember_scores)
    thresholds = np.unique(np.concatenate([members, nonmembers]))[::-1]
    # Counts of scores >= t for each distinct t, by binary search on the sorted scores.
    tp = members.size - np.searchsorted(np.sort(members), thresholds, side="left")
    fp = nonmembers.size - np.searchsorted(np.sort(nonmembers), thresholds, side="left")
    tpr = np.concatenate([[0.0], tp / members.size])
    fpr = np.concatenate([[0.0], fp / nonmembers.size])
    return fpr, tpr, np.concatenate([[np.inf], thresholds])


def roc_auc(member_scores: Any, nonmember_scores: Any) -> float:
    """Area under the exact ROC = P(member > non-member) + P(tie) / 2 (trapezoids over the vertices)."""
    fpr, tpr, _ = roc_curve(member_scores, nonmember_scores)
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target_fpr: float) -> float:
    """The ROC's TPR at ``target_fpr``: the highest vertex with FPR <= target, joined linearly to the next."""
    if not 0.0 <= target_fpr <= 1.0:
        raise ValueError(f"target_fpr must lie in [0, 1], got {target_fpr!r}")
    last = int(np.searchsorted(fpr, target_fpr, side="right")) - 1  # fpr is non-decreasing
    if last >= fpr.size - 1 or fpr[last] == target_fpr:
        return float(tpr[last])
    slope = (tpr[last + 1] - tpr[last]) / (fpr[last + 1] - fpr[last])
    return float(tpr[last] + slope * (target_fpr - fpr[last]))


@dataclass(frozen=True)
class MembershipResult:
    """AUC and TPR at fixed FPRs of one attack; counts so a reader can judge the resolution."""

    attack: str
    num_members: int
    num_nonmembers: int
    auc: float
    tpr_at_fpr: dict[float, float]
    member_score_mean: float
    nonmember_score_mean: float

    def to_json(self) -> dict[str, Any]:
        return {
            "attack": self.attack,
            "num_members": self.num_members,
            "num_nonmembers": self.num_nonmembers,
            "auc": self.auc,
            "tpr_at_fpr": {f"{k:g}": v for k, v in self.tpr_at_fpr.items()},
            # Below 1/num_nonmembers the ROC has no vertex: such TPRs are interpolated, not measured.
            "smallest_measured_fpr": 1.0 / self.num_nonmembers,
            "member_score_mean": self.member_score_mean,
            "nonmember_score_mean": self.nonmember_score_mean,
        }


def evaluate_scores(member_scores: Any, nonmember_scores: Any, *, attack: str = "scores",
                    fprs: Sequence[float] = DEFAULT_FPRS) -> MembershipResult:
    """AUC and TPR at each FPR in ``fprs`` for scores where higher means "member"."""
    members = _scores("member_scores", member_scores)
    nonmembers = _scores("nonmember_scores", nonmember_scores)
    for k, value in enumerate(fprs):
        if not 0.0 < float(value) < 1.0:
            raise ValueError(f"fprs[{k}]={value!r} must lie in (0, 1)")
    fpr, tpr, _ = roc_curve(members, nonmembers)
    return MembershipResult(
        attack=attack,
        num_members=members.size,
        num_nonmembers=nonmembers.size,
        auc=roc_auc(members, nonmembers),
        tpr_at_fpr={float(f): tpr_at_fpr(fpr, tpr, float(f)) for f in fprs},
        member_score_mean=float(members.mean()),
        nonmember_score_mean=float(nonmembers.mean()),
    )


def loss_scores(model: Any, sequences: Sequence[Sequence[int]], *, batch_size: int = 16) -> np.ndarray:
    """Minus the mean token loss of each sequence under ``model`` (Yeom et al. 2018)."""
    return -mean_token_losses(model, sequences, batch_size=batch_size)


def calibrated_scores(model: Any, reference_model: Any, sequences: Sequence[Sequence[int]], *,
                      batch_size: int = 16) -> np.ndarray:
    """Minus the calibrated loss, loss_target - loss_reference (Stock et al. 2022, Sec. 4.2)."""
    return -(mean_token_losses(model, sequences, batch_size=batch_size)
             - mean_token_losses(reference_model, sequences, batch_size=batch_size))


def membership_attacks(model: Any, tokenizer: Any, member_texts: Sequence[str],
                       nonmember_texts: Sequence[str], *, reference_model: Any = None,
                       fprs: Sequence[float] = DEFAULT_FPRS, max_length: int | None = None,
                       batch_size: int = 16) -> list[MembershipResult]:
    """The loss attack and, with a ``reference_model``, the calibrated attack, on texts of a causal LM.

    Texts are tokenized as in training and cut to ``max_length`` tokens; texts of fewer than 2 tokens
    have no next-token loss and are refused.
    """
    def sequences(field: str, texts: Sequence[str]) -> list[list[int]]:
        ids = [seq[:max_length] if max_length else seq for seq in encode(tokenizer, texts)]
        for k, seq in enumerate(ids):
            if len(seq) < 2:
                raise ValueError(f"{field}[{k}] has {len(seq)} token(s); a loss needs at least 2")
        return ids

    members = sequences("member_texts", member_texts)
    nonmembers = sequences("nonmember_texts", nonmember_texts)
    results = [evaluate_scores(loss_scores(model, members, batch_size=batch_size),
                               loss_scores(model, nonmembers, batch_size=batch_size),
                               attack="loss", fprs=fprs)]
    if reference_model is not None:
        results.append(evaluate_scores(
            calibrated_scores(model, reference_model, members, batch_size=batch_size),
            calibrated_scores(model, reference_model, nonmembers, batch_size=batch_size),
            attack="calibrated_loss", fprs=fprs))
    return results
