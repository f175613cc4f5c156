"""CRT dedup, redaction policies, ``redact_dataset`` and ``hush redact``."""

from __future__ import annotations

import json
import math

import datasets
import mpmath
import pytest

from hush_hf.cli import main as hush_main
from hush_hf.crt import (
    DedupReport,
    Policy,
    bayesian_confidentiality,
    build_policies,
    check_mask_token,
    dedup_dataset,
    occurrence_counts,
    redact_dataset,
    secrets_policy,
    sentence_spans,
)
from hush_hf.secrets import Secret, SecretSet

SECRETS = SecretSet(
    [
        Secret("ProjectFalcon", 1e-6, 1e-3, terms=("project falcon",)),
        Secret("acct", 1e-6, 1e-3, pattern=r"ACCT-\d{4}"),
        Secret("zebra", 1e-6, 1e-3),
    ]
)


def ds(texts):
    return datasets.Dataset.from_dict({"text": list(texts)})


# ----------------------------------------------------------------------------------- dedup
def test_sentence_spans_split_on_terminators_and_lines():
    text = "A b. C d!\nE f? g h"
    assert [text[s:e] for s, e in sentence_spans(text)] == ["A b.", "C d!", "E f?", "g h"]


def test_dedup_removes_exact_rows_masks_repeated_sentences_when_asked_and_reports_indices():
    rows = [
        "My ID is: 123456. Hello there.",
        "My ID is: 123456. Hello there.",  # exact duplicate of row 0
        "Other words here. My ID is: 123456.",  # the ID sentence repeats
        "the quick brown fox jumps over the lazy dog again and again today",
        "the quick brown fox jumps over the lazy dog again and again today!",  # near duplicate of 3
        "x",
    ]
    out, report = dedup_dataset(ds(rows), near_threshold=0.7, sentences=True)
    assert out["text"] == [
        rows[0],
        "Other words here. <MASK>",
        rows[3],
        "x",
    ]
    assert isinstance(report, DedupReport)
    assert report.exact_duplicates == [(1, 0)]
    assert report.near_duplicates == [(4, 3)]
    assert (report.rows_in, report.rows_out, report.sentences_masked) == (6, 4, 1)
    assert "123456" not in json.dumps(report.to_dict())


def test_dedup_without_near_keeps_near_duplicates_and_keeps_other_columns():
    data = datasets.Dataset.from_dict(
        {"text": ["a b c d e f", "a b c d e f!", "a b c d e f"], "id": [0, 1, 2]}
    )
    out, report = dedup_dataset(data, sentences=False)
    assert out["id"] == [0, 1] and report.near_duplicates == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"near_threshold": 1.5}, "near_threshold"),
        ({"text_column": "body"}, "text_column 'body'"),
        ({"mask_token": " "}, "mask_token"),
    ],
)
def test_dedup_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dedup_dataset(ds(["a"]), **kwargs)


def test_dedup_non_string_row_is_named():
    with pytest.raises(ValueError, match="row 1: column 'text' must hold strings"):
        dedup_dataset(datasets.Dataset.from_dict({"text": ["a", None]}))


def test_occurrence_counts_unique_sentences():
    texts = ["Project Falcon ships. Project Falcon ships.", "zebra here. Project  Falcon ships."]
    counts = occurrence_counts(ds(texts), SECRETS)
    assert counts["rows"].tolist() == [2, 0, 1]
    assert counts["sentences"].tolist() == [3, 0, 1]
    assert counts["unique"].tolist() == [1, 0, 1]  # whitespace-normalised repeats count once


# ----------------------------------------------------------------------------------- policies
def test_secrets_policy_masks_terms_patterns_and_names_like_the_tagger():
    policy = secrets_policy(SECRETS)
    text = "The PROJECT-falcon plan, acct-1234 and a Zebra."
    spans = sorted((s.start, s.end) for s in policy(text))
    assert [text[s:e] for s, e in spans] == ["PROJECT-falcon", "acct-1234", "Zebra"]


def test_detectors_find_pii_and_credentials():
    text = (
        "Mail jane.doe@example.com or call +1 650-253-0000; card 4111 1111 1111 1111, "
        "IBAN GB82 WEST 1234 5698 7654 32, ip 192.168.1.20. The year 2024 and 4111 1111 1111 1112.\n"
        'aws_key = "AKIAIOSFODNN7EXAMPLE"\n'
        "token: ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"
    )
    found = {p.name: [text[s.start : s.end] for s in p(text)] for p in build_policies(["pii", "credentials"])}
    assert found["email"] == ["jane.doe@example.com"]
    assert found["phone"] == ["+1 650-253-0000"]
    assert found["credit_card"] == ["4111 1111 1111 1111"]  # the Luhn-invalid one is left
    assert found["iban"] == ["GB82 WEST 1234 5698 7654 32"]
    assert found["ip"] == ["192.168.1.20"]
    assert "AKIAIOSFODNN7EXAMPLE" in found["credentials"]
    assert "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789" in found["credentials"]  # widened from the prefix


def test_plain_prose_marks_nothing():
    text = "The cat sat on the mat in 2024, reading chapter 12 of a book."
    assert all(not p(text) for p in build_policies(["pii", "credentials"]))


@pytest.mark.parametrize(
    ("names", "kwargs", "message"),
    [
        (["nope"], {}, "unknown redaction policy 'nope'"),
        (["secrets"], {}, "needs a secrets file"),
        (["phone"], {"phone_regions": ["XX"]}, "unknown region code 'XX'"),
    ],
)
def test_build_policies_bad_input(names, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_policies(names, **kwargs)


# ----------------------------------------------------------------------------------- redact_dataset
def test_redact_dataset_masks_spans_and_splits_public_private():
    texts = [
        "Project Falcon launches; mail jane@example.com.",
        "Nothing to see here.",
        "A repeated sentence was <MASK> already.",  # holds a mask: private
        "call me maybe",
    ]
    policies = build_policies(["secrets", "email"], secret_set=SECRETS)
    conservative = [Policy("maybe", lambda t: [(0, len(t))] if "maybe" in t else [])]
    out, report = redact_dataset(ds(texts), policies, conservative_policies=conservative)
    assert out["text"] == ["<MASK> launches; mail <MASK>.", texts[1], texts[2], texts[3]]
    assert out["crt_public"] == [False, True, False, False]
    assert out["crt_masked_spans"] == [2, 0, 0, 0]
    assert (report.public_rows, report.private_rows) == (1, 3)
    assert report.policies["secrets"] == {"rows_marked": 1, "spans": 1}
    assert report.policies["maybe (conservative)"]["rows_marked"] == 1
    assert "Falcon" not in json.dumps(report.to_dict())


def test_soft_hyphenated_secret_is_masked_precisely():
    # The spans come from the tagger itself, so what it joins (zeb + soft hyphen + ra) is masked.
    out, report = redact_dataset(ds(["the zeb\u00adra ran"]), [secrets_policy(SECRETS)])
    assert out["text"] == ["the <MASK> ran"] and report.whole_rows_masked == 0


def test_redact_masks_whole_row_when_the_tagger_still_finds_a_secret(monkeypatch):
    # Should the span finder ever miss what the tagger finds, the row is masked whole.
    from hush_hf.crt import spans

    monkeypatch.setattr(spans.SecretSpanFinder, "__call__", lambda self, text: [])
    out, report = redact_dataset(ds(["the zebra ran"]), [secrets_policy(SECRETS)])
    assert out["text"] == ["<MASK>"] and report.whole_rows_masked == 1


def test_policy_that_raises_is_named_without_text():
    def broken(text):
        raise RuntimeError("boom " + text)

    with pytest.raises(ValueError, match="row 0: redaction policy 'mine' raised RuntimeError") as info:
        redact_dataset(ds(["secret stuff"]), [Policy("mine", broken)])
    assert "secret stuff" not in str(info.value)


def test_policy_with_bad_span_is_refused():
    with pytest.raises(ValueError, match=r"span 0 must satisfy 0 <= start < end <= len\(text\) = 3"):
        redact_dataset(ds(["abc"]), [Policy("bad", lambda t: [(2, 9)])])


def test_policy_marking_everything_is_allowed_and_said(caplog):
    out, report = redact_dataset(ds(["a", "b"]), [Policy("all", lambda t: [(0, len(t))])])
    assert out["text"] == ["<MASK>", "<MASK>"] and out["crt_public"] == [False, False]
    assert report.marks_everything == ["all"]
    assert "marks every one of the 2 rows" in caplog.text


def test_mask_token_unknown_to_tokenizer_errors_or_is_added():
    from transformers import BertTokenizerFast

    from hush_hf.assets.tokenizer_assets import bert_uncased_tokenizer

    tokenizer = bert_uncased_tokenizer()
    assert isinstance(tokenizer, BertTokenizerFast)
    assert check_mask_token("[MASK]", tokenizer) is False
    with pytest.raises(ValueError, match="mask_token '<MASK>' is not a token of the tokenizer"):
        redact_dataset(ds(["a"]), [Policy("p", lambda t: [])], tokenizer=tokenizer)
    size = len(tokenizer)
    _, report = redact_dataset(
        ds(["a"]), [Policy("p", lambda t: [])], tokenizer=tokenizer, add_mask_token=True
    )
    assert report.mask_token_added and len(tokenizer) == size + 1
    assert tokenizer.convert_tokens_to_ids(tokenizer.tokenize("x <MASK> y"))[1] == size


def test_redact_twice_is_refused():
    once, _ = redact_dataset(ds(["a"]), [Policy("p", lambda t: [])])
    with pytest.raises(ValueError, match="already has a 'crt_public' column"):
        redact_dataset(once, [Policy("p", lambda t: [])])


# ----------------------------------------------------------------------------------- confidentiality
@pytest.mark.parametrize(("eps", "delta", "recall"), [(1.0, 1e-5, 0.9), (8.0, 1e-6, 0.5), (0.1, 0.0, 1.0)])
def test_bayesian_confidentiality_matches_prop6_closed_form(eps, delta, recall):
    got_eps, got_delta = bayesian_confidentiality(eps, delta, recall=recall)
    gamma = mpmath.mpf(1) - mpmath.mpf(recall)
    assert got_eps == pytest.approx(float(mpmath.log(1 + gamma * (mpmath.e**eps - 1))), rel=1e-12, abs=1e-300)
    assert got_delta == pytest.approx(float(gamma * delta), rel=1e-12, abs=1e-300)


def test_bayesian_confidentiality_paper_example_and_conservative_recall():
    # CRT Sec. 5.4: eps' = 1.0, gamma = 0.1 gives about 0.16 by Prop. 6 (the paper reads 0.12 off Fig. 6).
    eps, _ = bayesian_confidentiality(1.0, 8e-5, recall=0.9)
    assert eps == pytest.approx(math.log(1 + 0.1 * (math.e - 1)))
    assert bayesian_confidentiality(1.0, 1e-5, recall=0.9, conservative_recall=0.99)[1] == pytest.approx(
        0.01 + 1e-6
    )
    with pytest.raises(ValueError, match="recall must be a number in"):
        bayesian_confidentiality(1.0, 1e-5, recall=1.2)


# ----------------------------------------------------------------------------------- CLI
def test_hush_redact_cli_end_to_end(tmp_path, capsys):
    source = tmp_path / "data.jsonl"
    rows = [
        {"text": "Project Falcon ships. Contact jane@example.com."},
        {"text": "Project Falcon ships. Contact jane@example.com."},
        {"text": "Plain words only."},
        {"text": "key = AKIAIOSFODNN7EXAMPLE"},
    ]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps([{"id": "Project Falcon", "prior": 1e-6, "target": 1e-3}]))
    out = tmp_path / "out.jsonl"
    assert (
        hush_main(["redact", "--dataset", str(source), "--output", str(out), "--secrets", str(secrets)]) == 0
    )
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in written] == [
        "<MASK> ships. Contact <MASK>.",
        "Plain words only.",
        "key = <MASK>",
    ]
    assert [r["crt_public"] for r in written] == [False, True, False]
    report = json.loads((tmp_path / "out.jsonl.redaction.json").read_text())
    assert report["dedup"]["exact_duplicates"] == [[1, 0]]
    assert report["redaction"]["public_rows"] == 1
    # CRT Prop. 7: the secret is in 2 rows, 2 sentences, 1 distinct sentence (indices and counts only).
    assert report["secret_occurrences"] == {"rows": [2], "sentences": [2], "unique": [1]}
    text = (tmp_path / "out.jsonl.redaction.json").read_text() + capsys.readouterr().out
    assert "Falcon" not in text and "jane" not in text


def test_hush_redact_cli_bad_input_is_one_line(tmp_path, capsys):
    source = tmp_path / "data.jsonl"
    source.write_text(json.dumps({"text": "a"}) + "\n")
    code = hush_main(
        ["redact", "--dataset", str(source), "--output", str(tmp_path / "o.jsonl"), "--policies", "secrets"]
    )
    assert code == 2
    assert capsys.readouterr().err.strip() == "hush redact: error: policy 'secrets' needs --secrets FILE"
