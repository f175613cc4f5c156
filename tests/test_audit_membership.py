"""Membership inference: exact ROC/AUC/TPR against closed forms, and the loss attacks on a toy LM."""

import itertools

import numpy as np
import pytest
from scipy.stats import norm

from hush_hf.audit.membership import (
    calibrated_scores,
    evaluate_scores,
    loss_scores,
    membership_attacks,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)
from tests.test_audit_toys import (
    CHARS,
    BigramLM,
    char_ids,
    char_tokenizer,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    sequence_log_prob,
)


def mann_whitney(members, nonmembers) -> float:
    """P(member > non-member) + P(tie) / 2 over all pairs (the AUC's definition)."""
    pairs = list(itertools.product(members, nonmembers))
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)


def test_roc_vertices_by_hand():
    fpr, tpr, thresholds = roc_curve([2.0, 1.0], [1.5, 0.0])
    assert thresholds.tolist() == [np.inf, 2.0, 1.5, 1.0, 0.0]
    assert fpr.tolist() == [0.0, 0.0, 0.5, 0.5, 1.0]
    assert tpr.tolist() == [0.0, 0.5, 0.5, 1.0, 1.0]
    assert tpr_at_fpr(fpr, tpr, 0.25) == 0.5
    assert tpr_at_fpr(fpr, tpr, 0.5) == 1.0
    assert tpr_at_fpr(fpr, tpr, 0.0) == 0.5
    assert roc_auc([2.0, 1.0], [1.5, 0.0]) == pytest.approx(0.75)


def test_ties_make_a_diagonal_step():
    # Every score tied: the ROC is the diagonal, AUC 1/2 and TPR = FPR at every FPR.
    fpr, tpr, _ = roc_curve([1.0] * 3, [1.0] * 5)
    assert fpr.tolist() == [0.0, 1.0] and tpr.tolist() == [0.0, 1.0]
    assert roc_auc([1.0] * 3, [1.0] * 5) == 0.5
    assert tpr_at_fpr(fpr, tpr, 1e-2) == pytest.approx(1e-2)


@pytest.mark.parametrize("seed", range(5))
def test_auc_equals_mann_whitney_with_ties(seed):
    rng = np.random.default_rng(seed)
    members = rng.integers(0, 6, size=rng.integers(1, 30)).astype(float)
    nonmembers = rng.integers(0, 5, size=rng.integers(1, 30)).astype(float)
    assert roc_auc(members, nonmembers) == pytest.approx(mann_whitney(members, nonmembers), abs=1e-12)


def test_perfect_separation():
    result = evaluate_scores([5.0, 6.0, 7.0], [1.0, 2.0], fprs=(1e-3, 1e-2))
    assert result.auc == 1.0
    assert result.tpr_at_fpr == {1e-3: 1.0, 1e-2: 1.0}


def test_gaussian_scores_match_the_binormal_closed_form():
    # Members ~ N(d, 1), non-members ~ N(0, 1): AUC = Phi(d / sqrt 2), TPR(f) = Phi(d - Phi^-1(1 - f)).
    d, n = 1.5, 40_000
    rng = np.random.default_rng(0)
    members, nonmembers = rng.normal(d, 1.0, n), rng.normal(0.0, 1.0, n)
    result = evaluate_scores(members, nonmembers, fprs=(1e-3, 1e-2))
    assert result.auc == pytest.approx(norm.cdf(d / np.sqrt(2)), abs=5e-3)
    for fpr in (1e-3, 1e-2):
        assert result.tpr_at_fpr[fpr] == pytest.approx(norm.cdf(d - norm.ppf(1 - fpr)), abs=0.02)
    assert result.to_json()["smallest_measured_fpr"] == pytest.approx(1 / n)


@pytest.mark.parametrize(("members", "nonmembers", "fprs", "match"), [
    ([], [1.0], (1e-2,), "member_scores"),
    ([1.0], [np.nan], (1e-2,), r"nonmember_scores\[0\]"),
    ([1.0], [0.0], (0.0,), r"fprs\[0\]"),
    ([1.0], [0.0], (1e-2, 2.0), r"fprs\[1\]"),
])
def test_bad_scores_are_refused(members, nonmembers, fprs, match):
    with pytest.raises(ValueError, match=match):
        evaluate_scores(members, nonmembers, fprs=fprs)


def test_loss_and_calibrated_attacks_on_a_toy_lm():
    rng = np.random.default_rng(0)
    table = rng.normal(0, 1, size=(len(CHARS), len(CHARS)))
    # "Members" are texts the target model likes better: raise the logits of their transitions.
    members = ["abcabc", "abcab", "cabca"]
    nonmembers = ["xyzxyz", "zyxzy", "yxzyx"]
    target = table.copy()
    for text in members:
        ids = char_ids(text)
        target[ids[:-1], ids[1:]] += 2.0
    model, reference = BigramLM(target), BigramLM(table)
    ids = [char_ids(t) for t in members]
    expected = [sequence_log_prob(target, s) / (len(s) - 1) for s in ids]
    assert loss_scores(model, ids, batch_size=2) == pytest.approx(expected, abs=1e-6)  # float32 logits
    expected_calibrated = [(sequence_log_prob(target, s) - sequence_log_prob(table, s)) / (len(s) - 1)
                           for s in ids]
    assert calibrated_scores(model, reference, ids) == pytest.approx(expected_calibrated, abs=1e-6)
    assert np.all(calibrated_scores(model, model, ids) == 0.0)

    results = membership_attacks(model, char_tokenizer(), members, nonmembers, reference_model=reference)
    assert [r.attack for r in results] == ["loss", "calibrated_loss"]
    assert results[1].auc == 1.0  # calibration removes the reference's preferences entirely here
    with pytest.raises(ValueError, match=r"nonmember_texts\[0\]"):
        membership_attacks(model, char_tokenizer(), members, ["x"])
