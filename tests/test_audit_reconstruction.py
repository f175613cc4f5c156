"""Secret reconstruction: candidate scores against hand computations (causal and masked LMs)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hush_hf.audit.canaries import Canary, CanarySpace
from hush_hf.audit.reconstruction import (
    SecretProbe,
    bound_at_prior,
    canary_probes,
    candidate_scores,
    locate_contexts,
    probes_for_secrets,
    reconstruct,
    reconstruction_attack,
    summarize_reconstructions,
    term_pattern,
)
from hush_hf.secrets import Secret
from tests.test_audit_toys import (
    CHARS,
    BigramLM,
    char_ids,
    char_tokenizer,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    sequence_log_prob,
)


def test_causal_scores_are_the_log_likelihood_of_each_filled_text():
    table = np.random.default_rng(0).normal(0, 1, size=(len(CHARS), len(CHARS)))
    probe = SecretProbe(3, (("key is ", "k9", "."), ("use ", "K9", " now")), ("x1", "ab", "k"))
    scores = candidate_scores(BigramLM(table), char_tokenizer(), probe, kind="causal", batch_size=2)
    assert scores.shape == (2, 4)
    for k, (before, written, after) in enumerate(probe.contexts):
        for c, value in enumerate((written, *probe.alternatives)):
            expected = sequence_log_prob(table, char_ids(before + value + after))
            assert scores[k, c] == pytest.approx(expected, abs=1e-4)


def test_rank_and_posterior_of_the_true_value():
    scores = np.array([[-1.0, -2.0, -1.0, 0.0], [-1.0, -1.0, -1.0, -3.0]])  # totals -2, -3, -2, -3
    result = reconstruct(5, scores)
    assert result.rank == 1.5 and not result.ranked_first
    totals = scores.sum(axis=0)
    assert result.probability == pytest.approx(np.exp(totals[0]) / np.exp(totals).sum())
    assert result.num_contexts == 2 and result.num_candidates == 4 and result.candidate_prior == 0.25
    plan = SimpleNamespace(secrets=SimpleNamespace(prior=np.full(6, 1e-6), target=np.full(6, 1e-3),
                                                   bound=np.linspace(1e-4, 6e-4, 6)))
    with_plan = reconstruct(5, scores, plan)
    assert (with_plan.prior, with_plan.target, with_plan.bound) == (1e-6, 1e-3, pytest.approx(6e-4))
    with pytest.raises(ValueError, match="secret index 9"):
        reconstruct(9, scores, plan)


def test_a_memorised_canary_is_ranked_first():
    space = CanarySpace(template="PIN: {secret}", alphabet="0123456789", length=4)
    canary = Canary(0, "4711", 5, space)
    table = np.zeros((len(CHARS), len(CHARS)))
    ids = char_ids(canary.text)
    table[ids[-5:-1], ids[-4:]] += 6.0  # the model has learnt the canary's digit transitions
    probes = canary_probes([canary], [7], num_alternatives=200, seed=0)
    assert probes[0].index == 7 and probes[0].contexts == (("PIN: ", "4711", ""),)
    assert "4711" not in probes[0].alternatives
    [result] = reconstruction_attack(BigramLM(table), char_tokenizer(), probes, kind="causal")
    assert result.ranked_first and result.probability > 0.9
    [blind] = reconstruction_attack(BigramLM(np.zeros_like(table)), char_tokenizer(), probes, kind="causal")
    assert blind.rank == pytest.approx(1 + (result.num_candidates - 1) / 2)
    assert blind.probability == pytest.approx(1 / result.num_candidates)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    folder = tmp_path_factory.mktemp("bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "code", "is", "ab", "##c", "##d", "x", "y",
             "."]
    (folder / "vocab.txt").write_text("\n".join(vocab))
    tokenizer = BertTokenizerFast.from_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=64)
    return BertForMaskedLM(config).eval(), tokenizer


def test_masked_scores_match_one_forward_pass_per_candidate(tiny_bert):
    model, tokenizer = tiny_bert
    probe = SecretProbe(0, (("the code is ", "abc", " ."), ("", "abc", " is x")), ("y", "abd", "x y", "abcd"))
    scores = candidate_scores(model, tokenizer, probe, batch_size=2)  # kind from the class: masked
    assert scores.shape == (2, 5)
    for k, (before, written, after) in enumerate(probe.contexts):
        for c, value in enumerate((written, *probe.alternatives)):
            value_ids = tokenizer(value, add_special_tokens=False)["input_ids"]
            masked = before + " ".join([tokenizer.mask_token] * len(value_ids)) + after
            ids = torch.tensor([tokenizer(masked)["input_ids"]])
            positions = (ids[0] == tokenizer.mask_token_id).nonzero().ravel()
            with torch.no_grad():
                log_p = torch.log_softmax(model(input_ids=ids).logits[0, positions].double(), dim=-1)
            expected = float(log_p[torch.arange(len(value_ids)), torch.tensor(value_ids)].sum())
            assert scores[k, c] == pytest.approx(expected, abs=1e-4), (k, value)


def test_term_pattern_matches_whole_words_like_the_tagger():
    pattern = term_pattern("new york")
    assert pattern.search("I love New-York!") and pattern.search("in new,  york")
    assert not pattern.search("newyork") and not pattern.search("new yorker")
    contexts = locate_contexts(["a Code9 b", "x code9 y code9 z"], [term_pattern("code9")], window=2,
                               max_contexts=2)
    assert contexts == [("a ", "Code9", " b"), ("x ", "code9", " y")]
    with pytest.raises(ValueError, match="no word characters"):
        term_pattern("--")


def test_probes_from_tagged_texts_and_reasons_for_the_rest():
    secrets = [Secret("alpha", 1e-6, 1e-3), Secret("s1", 1e-6, 1e-3, terms=("bravo",)),
               Secret("s2", 1e-6, 1e-3, terms=("charlie",)), Secret("s3", 1e-6, 1e-3, pattern=r"K-\d+"),
               Secret("s4", 1e-6, 1e-3, terms=("delta",))]
    texts = ["alpha and Bravo", "bravo again", "no secret here", "key K-42 end", "tagged but absent"]
    secret_ids = [[0, 1], [1], [], [3], [4]]
    probes, skipped = probes_for_secrets(secrets, texts, secret_ids, num_alternatives=2, window=7, seed=0)
    by_index = {p.index: p for p in probes}
    assert sorted(by_index) == [0, 1, 3]
    assert by_index[1].contexts == (("ha and ", "Bravo", ""), ("", "bravo", " again"))
    assert by_index[3].contexts[0][1] == "K-42"
    assert all(len(p.alternatives) == 2 for p in probes)
    assert "bravo" not in by_index[1].alternatives and "alpha" not in by_index[0].alternatives
    assert skipped == {2: "no tagged examples", 4: "secret not found verbatim in its tagged examples"}
    assert "alpha" not in repr(by_index[0]) and "Bravo" not in str(by_index[1])
    with pytest.raises(ValueError, match="indices holds 7"):
        probes_for_secrets(secrets, texts, secret_ids, indices=[7])
    with pytest.raises(ValueError, match="texts has 5 rows"):
        probes_for_secrets(secrets, texts, secret_ids[:2])


def test_summary_counts_and_reasons():
    rows = [reconstruct(0, np.array([[0.0, -1.0]])), reconstruct(1, np.array([[-1.0, 0.0, -2.0]]))]
    summary = summarize_reconstructions(rows, {4: "no tagged examples", 5: "no tagged examples"})
    assert summary["num_evaluated"] == 2 and summary["num_ranked_first"] == 1
    assert summary["fraction_ranked_first"] == 0.5
    assert summary["not_evaluated"] == {"no tagged examples": 2}
    assert summary["mean_bound"] is None
    assert [r["index"] for r in summary["secrets"]] == [0, 1]


def test_bound_at_a_larger_prior_scales_linearly_and_caps_at_one():
    assert bound_at_prior(0.25, 1e-2, 2e-2) == pytest.approx(0.5)
    assert bound_at_prior(0.5, 1e-2, 5e-2) == 1.0
    assert bound_at_prior(1e-6, 1e-2, 2e-2) == 2e-2  # a smaller prior: B is non-decreasing


@pytest.mark.parametrize("mu", [0.5, 2.0, 4.0])
def test_the_premise_blow_up_over_prior_does_not_increase(mu):
    # The Gaussian trade-off's blow-up function B(x) = Phi(Phi^-1(x) + mu) (closed form) is concave, so
    # B(q) <= q B(p) / p for q >= p: the inequality bound_at_prior relies on.
    from scipy.stats import norm

    grid = np.logspace(-9, -0.01, 400)
    blow_up = norm.cdf(norm.ppf(grid) + mu)
    ratio = blow_up / grid
    assert np.all(np.diff(ratio) <= 1e-12 * ratio[1:])
    for p, q in [(1e-9, 1e-3), (1e-6, 0.05), (1e-3, 0.5)]:
        b_p = norm.cdf(norm.ppf(p) + mu)
        assert norm.cdf(norm.ppf(q) + mu) <= bound_at_prior(q, p, b_p) + 1e-15
