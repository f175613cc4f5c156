"""k-extractability: known answers on a fixed-logit LM, and agreement with real greedy decoding."""

import numpy as np
import pytest
import torch

from hush_hf.audit.extraction import extraction_attack, greedy_decode, matched_tokens
from tests.test_audit_toys import (
    BigramLM,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    tiny_gpt2,
)

V = 12


def chain_table() -> np.ndarray:
    """Greedy successor of token t is (t + 1) mod V (by a margin of 3 nats)."""
    table = np.zeros((V, V))
    table[np.arange(V), (np.arange(V) + 1) % V] = 3.0
    return table


def chain(start: int, length: int) -> list[int]:
    return [(start + k) % V for k in range(length)]


def test_greedy_decode_follows_the_argmax_chain_with_left_padding():
    prompts = [[3], [5, 6, 7], [1, 2]]
    decoded = greedy_decode(BigramLM(chain_table()), prompts, 4, batch_size=2)
    assert decoded == [chain(4, 4), chain(8, 4), chain(3, 4)]


def test_extraction_counts_known_answers():
    n, m = 3, 4
    extractable = chain(2, n + m)
    off_at_2 = chain(5, n + m)
    off_at_2[n + 2] = (off_at_2[n + 2] + 5) % V  # greedy reproduces 2 suffix tokens, then misses
    off_at_0 = chain(0, n) + chain(7, m)
    short = chain(0, n + m - 1)
    longer = chain(9, n + m + 3)  # cut to its first n + m tokens: extractable
    result = extraction_attack(BigramLM(chain_table()), [extractable, off_at_2, short, off_at_0, longer],
                               prefix_length=n, suffix_length=m, batch_size=2)
    assert result.num_sequences == 4 and result.skipped_too_short == (2,)
    assert result.extracted_indices == (0, 4) and result.num_extracted == 2
    assert result.fraction_extracted == pytest.approx(0.5)
    # Leading tokens reproduced: 4, 2, 0, 4; suffix tokens whose argmax is right: 4, 2, 3, 4.
    assert result.mean_matched_tokens == pytest.approx((4 + 2 + 0 + 4) / 4)
    assert result.token_accuracy == pytest.approx((4 + 2 + 3 + 4) / 16)
    assert result.to_json()["num_skipped_too_short"] == 1


def test_teacher_forcing_agrees_with_greedy_decoding_on_gpt2():
    model = tiny_gpt2(vocab_size=64, seed=0)
    rng = np.random.default_rng(0)
    n, m = 6, 5
    prompts = [rng.integers(1, 64, size=n).tolist() for _ in range(6)]
    continuations = greedy_decode(model, prompts, m, batch_size=4)
    sequences = [p + c for p, c in zip(prompts, continuations, strict=True)]
    sequences[1][n + 3] = (sequences[1][n + 3] + 1) % 64  # break the 4th suffix token of sequence 1
    leading, _ = matched_tokens(model, sequences, n, m, batch_size=4)
    assert leading.tolist() == [m, 3, m, m, m, m]
    result = extraction_attack(model, sequences, prefix_length=n, suffix_length=m)
    assert result.extracted_indices == (0, 2, 3, 4, 5)


def test_greedy_decode_matches_transformers_generate_with_padding():
    model = tiny_gpt2(vocab_size=64, seed=1)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 64, size=k).tolist() for k in (2, 7, 4, 5)]
    ours = greedy_decode(model, prompts, 6, batch_size=4)
    for prompt, decoded in zip(prompts, ours, strict=True):  # one prompt at a time: no padding at all
        alone = model.generate(torch.tensor([prompt]),
                               attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=6,
                               do_sample=False, pad_token_id=0)
        assert alone[0, len(prompt):].tolist() == decoded


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"prefix_length": 0}, "prefix_length"),
    ({"suffix_length": -1}, "suffix_length"),
    ({"batch_size": 0}, "batch_size"),
])
def test_extraction_refuses_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        extraction_attack(BigramLM(chain_table()), [chain(0, 10)], **{"prefix_length": 3, "suffix_length": 3,
                                                                       **kwargs})


def test_greedy_decode_refuses_empty_prompts():
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        greedy_decode(BigramLM(chain_table()), [[1], []], 2)
