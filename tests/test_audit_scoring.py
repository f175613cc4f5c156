"""Scoring primitives: padding, log-likelihoods on a fixed-logit LM, model kind, bad input."""

import numpy as np
import pytest
import torch

from hush_hf.audit.scoring import mean_token_losses, model_kind, pad, sequence_log_probs, token_log_probs
from tests.test_audit_toys import (
    CHARS,
    BigramLM,
    log_softmax_rows,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    tiny_gpt2,
)


def test_pad_left_and_right():
    ids, mask = pad([[5, 6, 7], [8]], side="left", pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = pad([[5, 6, 7], [8]], side="right", pad_id=9)
    assert ids.tolist() == [[5, 6, 7], [8, 9, 9]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_token_log_probs_match_the_table_whatever_the_batching():
    table = np.random.default_rng(0).normal(0, 2, size=(len(CHARS), len(CHARS)))
    sequences = [[3, 4, 5, 6], [7, 8], [9, 10, 11]]
    log_p = log_softmax_rows(table)
    for batch_size in (1, 2, 3):
        got = token_log_probs(BigramLM(table), sequences, batch_size=batch_size)
        for seq, values in zip(sequences, got, strict=True):
            expected = [log_p[a, b] for a, b in zip(seq[:-1], seq[1:], strict=True)]
            assert values == pytest.approx(expected, abs=1e-5)
    totals = sequence_log_probs(BigramLM(table), sequences)
    assert totals[1] == pytest.approx(log_p[7, 8], abs=1e-5)
    assert mean_token_losses(BigramLM(table), sequences)[0] == pytest.approx(-totals[0] / 3, abs=1e-5)


def test_padding_does_not_change_gpt2_scores():
    model = tiny_gpt2(vocab_size=32, seed=0)
    sequences = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10]]
    together = sequence_log_probs(model, sequences, batch_size=2)
    alone = [sequence_log_probs(model, [s], batch_size=1)[0] for s in sequences]
    assert together == pytest.approx(alone, abs=1e-4)
    with torch.no_grad():  # reference: torch's own log_softmax on the unpadded sequence
        logits = model(input_ids=torch.tensor([sequences[1]])).logits[0].double()
    reference = torch.log_softmax(logits, -1)[[0, 1], [9, 10]].sum().item()
    assert alone[1] == pytest.approx(reference, abs=1e-4)


def test_model_kind():
    from transformers import BertConfig, BertForMaskedLM

    assert model_kind(tiny_gpt2(vocab_size=16)) == "causal"
    config = BertConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=8)
    bert = BertForMaskedLM(config)
    assert model_kind(bert) == "masked"
    toy = BigramLM(np.zeros((4, 4)))
    assert model_kind(toy, "causal") == "causal"
    with pytest.raises(ValueError, match="'BigramLM'"):
        model_kind(toy)
    with pytest.raises(ValueError, match="kind must be"):
        model_kind(toy, "seq2seq")


@pytest.mark.parametrize(("sequences", "batch_size", "match"), [
    ([[1, 2], [3]], 4, r"sequences\[1\] has 1 tokens"),
    ([[1, 2]], 0, "batch_size"),
])
def test_bad_input_is_refused(sequences, batch_size, match):
    with pytest.raises(ValueError, match=match):
        token_log_probs(BigramLM(np.zeros((4, 4))), sequences, batch_size=batch_size)
