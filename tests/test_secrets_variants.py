"""Taggers find what a model can learn: every variant of the issue, spans in original offsets;
secrets files fail with line numbers; unmatched and over-tagging secrets are reported."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from hush_hf.cli import main
from hush_hf.planning import ProtectionPlan, plan_protection
from hush_hf.secrets import RegexTagger, SecretSet, TermTagger, secret_spans
from hush_hf.secrets.normalize import dehyphenate, normalize

FALCON = TermTagger({0: ["project falcon", "falcon"]})


@pytest.mark.parametrize(
    ("text", "occurrence"),
    [
        ("our ProjectFalcon launch", "ProjectFalcon"),
        ("our projectFalcon launch", "projectFalcon"),
        ("our project_falcon launch", "project_falcon"),
        ("PROJECT_FALCON = 1", "PROJECT_FALCON"),
        ("the Falcon9 rocket", "Falcon"),
        ("two falcons flew", "falcons"),
        ("the falcon's nest", "falcon's"),  # spells "falcons"
        ("see /wiki/project%20falcon here", "project%20falcon"),
        ("see /wiki/project+falcon here", "project+falcon"),
        ("the Fal-\ncon team", "Fal-\ncon"),
        ("the Fal-\r\n   con team", "Fal-\r\n   con"),
        ("the Fal&shy;con team", "Fal&shy;con"),
        ("the Fal\u00adcon team", "Fal\u00adcon"),
        ("the &#70;alcon team", "&#70;alcon"),
        ("the F\u0430lcon team", "F\u0430lcon"),  # Cyrillic a
        ("the \u0192alcon team", "\u0192alcon"),  # TR39: a hooked f is a confusable of f
        ("the f\u0101lcon team", "f\u0101lcon"),  # a macron is an accent
        ("the ＦＡＬＣＯＮ team", "ＦＡＬＣＯＮ"),  # full-width
        ("the Fälcon team", "Fälcon"),  # accents stripped
    ],
)
def test_each_listed_variant_is_tagged_with_its_original_span(text, occurrence):
    spans = FALCON.spans(text)
    if occurrence is None:
        assert spans == []
        return
    start = text.index(occurrence)
    assert spans and min(s for s, _, _ in spans) == start
    assert max(e for _, e, _ in spans) == start + len(occurrence)
    assert FALCON(text) == {0}


@pytest.mark.parametrize(
    ("term", "text", "occurrence"),
    [
        ("猎鹰", "这是猎鹰计划的文件", "猎鹰"),  # Chinese without spaces
        ("ファルコン", "これはファルコン計画です", "ファルコン"),  # Japanese
        ("ฟอลคอน", "โครงการฟอลคอนของเรา", "ฟอลคอน"),  # Thai
        ("팔콘", "우리의팔콘프로젝트", "팔콘"),  # Hangul written without spaces
    ],
)
def test_scripts_without_spaces_match_as_substrings(term, text, occurrence):
    tagger = TermTagger({0: [term]})
    start = text.index(occurrence)
    assert tagger.spans(text) == [(start, start + len(occurrence), 0)]
    assert tagger("unrelated text 计划") == set()


def test_identifier_terms_match_spaced_words_and_single_words_match_whole_identifiers():
    assert TermTagger({0: ["ProjectFalcon"]})("the project falcon plan") == {0}
    assert TermTagger({0: ["projectfalcon"]})("x = ProjectFalcon()") == {0}
    assert TermTagger({0: ["projectfalcon"]})("x = project_falcon") == {0}
    assert (
        TermTagger({0: ["falcon"]})("catalog of falconry") == set()
    )  # no substring match for spaced scripts
    assert TermTagger({0: ["company"]})("two companies") == {0}
    assert TermTagger({0: ["box"]})("the boxes") == {0}


def test_normalisation_maps_every_character_back_to_the_original():
    text = "a &amp; b%C3%A9 \ufb01ne Fal-\ncon \u00ad"
    normalized = normalize(text)
    assert normalized.text == "a & be fine Fal-\ncon "  # é decoded, then its accent stripped
    k = normalized.text.index("be") + 1
    assert text[slice(*normalized.original_span(k, k + 1))] == "%C3%A9"
    k = normalized.text.index("fi")
    assert text[slice(*normalized.original_span(k, k + 2))] == "\ufb01"
    joined = dehyphenate(normalized)
    k = joined.text.index("Falcon")
    assert text[slice(*joined.original_span(k, k + 6))] == "Fal-\ncon"


def test_regex_secrets_get_the_same_normalisation_unless_raw():
    pattern = {0: r"AKIA[0-9A-Z]{8}"}
    for text, occurrence in [
        ("key AKIA12345678 end", "AKIA12345678"),
        ("key akia12345678 end", "akia12345678"),
        ("key AKIA1234&shy;5678 end", "AKIA1234&shy;5678"),
        ("key %41KIA12345678 end", "%41KIA12345678"),
        ("key \u0410KIA12345678 end", "\u0410KIA12345678"),  # Cyrillic A
    ]:
        start = text.index(occurrence)
        assert RegexTagger(pattern, flags=re.IGNORECASE).spans(text) == [(start, start + len(occurrence), 0)]
    raw = RegexTagger(pattern, raw=True)
    assert raw("key AKIA12345678 end") == {0}
    assert raw("key AKIA1234&shy;5678 end") == set()
    secrets = SecretSet.from_records(
        [{"name": "k", "p": 0.01, "r": 0.1, "pattern": r"AKIA[0-9A-Z]{8}", "raw_pattern": True}]
    )
    assert secret_spans("key %41KIA12345678", secrets) == []
    assert secret_spans("key AKIA12345678", secrets) == [(4, 16, 0)]


def test_secret_spans_public_api_accepts_a_set_a_file_or_a_tagger(tmp_path):
    secrets = SecretSet.from_records([("falcon", 0.01, 0.1, ["falcon"]), ("kiwi", 0.01, 0.1, ["kiwi"])])
    text = "Kiwis & ProjectFalcon"
    expected = [(0, 5, 1), (15, 21, 0)]
    assert secret_spans(text, secrets) == expected
    secrets.to_json(tmp_path / "s.json")
    assert secret_spans(text, tmp_path / "s.json") == expected
    assert [tuple(s) for s in secret_spans(text, FALCON)] == [(8, 21, 0), (15, 21, 0)]  # phrase and word
    assert [text[s.start : s.end] for s in secret_spans(text, secrets)] == ["Kiwis", "Falcon"]


# -- secrets files --------------------------------------------------------------------------------

SECRET = "hunter2"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (f'id,p,r,terms\na,0.01,0.1,"{SECRET}\nb,0.01,0.1,other\n', r"line 2: .*(unterminated|runs over)"),
        (f"id,p,r,terms\na,0.01,0.1,{SECRET},extra\n", r"line 2: 5 fields but the header has 4"),
        ("id,p,r,terms\na,0.01,0.1,x\nb,0.01\n", r"line 3: 2 fields but the header has 4"),
        (f'id,p,r,terms\na,0.01,0.1,"{SECRET}, falcon"\n', r"line 2: the terms cell holds commas but no ';'"),
        (f"id,p,r,terms\n{SECRET},0.01,0.1,\n", r"line 2: terms is empty .* write @id"),
        (f"id,p,r,terms\nz,0.01,0.1,x\n{SECRET},0.01,nope,y\n", r"line 3: target_posterior is not a number"),
    ],
)
def test_secrets_csv_errors_give_the_line_and_never_the_row(tmp_path, body, message):
    path = tmp_path / "secrets.csv"
    path.write_text(body)
    with pytest.raises(ValueError, match=message) as info:
        SecretSet.load(path)
    assert SECRET not in str(info.value)


def test_secrets_csv_id_as_term_must_be_explicit(tmp_path):
    path = tmp_path / "secrets.csv"
    path.write_text("id,p,r,terms\nfalcon,0.01,0.1,@id\nkiwi,0.01,0.1,kiwi; kiwis\n")
    secrets = SecretSet.load(path)
    assert secrets[0].terms == () and secrets[1].terms == ("kiwi", "kiwis")
    assert secret_spans("a falcon", secrets) == [(2, 8, 0)]
    (tmp_path / "ids.csv").write_text("id,p,r\nfalcon,0.01,0.1\n")  # no terms column: ids are the terms
    assert SecretSet.load(tmp_path / "ids.csv")[0].terms == ()


def test_fingerprint_changes_with_any_field_and_is_stable():
    base = [("falcon", 0.01, 0.1, ["falcon"])]
    fingerprint = SecretSet.from_records(base).fingerprint
    assert re.fullmatch("[0-9a-f]{16}", fingerprint)
    assert SecretSet.from_records(base).fingerprint == fingerprint
    for changed in ([("falcon", 0.02, 0.1, ["falcon"])], [("falcon", 0.01, 0.1, ["falcons"])]):
        assert SecretSet.from_records(changed).fingerprint != fingerprint


# -- unmatched and over-tagging secrets -----------------------------------------------------------


def test_plan_refuses_unmatched_secrets_and_warns_on_over_tagging():
    ids = [[0, 1]] + [[0]] * 9 + [[]] * 30
    priors, targets = np.full(3, 1e-4), np.full(3, 1e-2)
    with pytest.raises(ValueError, match=r"1 secret\(s\) mark no example \(secret #2\)"):
        plan_protection(ids, priors, targets, expected_batch_size=2, steps=5)
    with pytest.warns(UserWarning, match=r"1 secret\(s\) each mark more than 5% .* secret #0 \(25.0%\)"):
        plan = plan_protection(
            ids,
            priors,
            targets,
            expected_batch_size=2,
            steps=5,
            allow_unmatched=True,
            secret_set_fingerprint="ab",
        )
    assert plan.unmatched_secrets == 1 and plan.summary()["unmatched_secrets"] == 1
    assert "secret_set_fingerprint" not in plan.to_json()  # published copies carry no hash of the secrets
    assert ProtectionPlan.from_json(plan.to_json(include_fingerprint=True)).secret_set_fingerprint == "ab"


def test_hush_plan_refuses_unmatched_unless_allowed_and_says_how_many(tmp_path, capsys):
    data = tmp_path / "docs.jsonl"
    rows = [{"text": f"the kiwi number {i}" if i % 3 else f"doc {i}"} for i in range(30)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    secrets = tmp_path / "secrets.csv"
    secrets.write_text("id,prior,target,terms\nkiwi,1e-4,0.05,kiwi\nfalcon,1e-4,0.05,falcon\n")
    args = (
        f"plan --dataset {data} --secrets {secrets} --batch-size 2 --steps 5 --output {tmp_path / 'p.json'}"
    )
    assert main(args.split()) == 2
    assert re.search(r"error: .*secret #1\).*--allow-unmatched", capsys.readouterr().err)
    assert main([*args.split(), "--allow-unmatched"]) == 0
    printed = capsys.readouterr().out
    assert "1 match NO example" in printed and "examples per matched secret min 20" in printed
    plan = ProtectionPlan.load(tmp_path / "p.json")
    assert plan.unmatched_secrets == 1
    assert plan.secret_set_fingerprint == SecretSet.load(secrets).fingerprint


def test_report_and_card_say_how_many_secrets_matched_nothing():
    from hush_hf.audit.card import protection_section
    from hush_hf.audit.report import build_privacy_report, report_markdown

    ids = [[0]] * 3 + [[]] * 37
    plan = plan_protection(
        ids, np.full(2, 1e-4), np.full(2, 1e-2), expected_batch_size=2, steps=5, allow_unmatched=True
    )
    report = build_privacy_report(plan, clip_norm=1.0)
    assert report["secrets"]["unmatched"] == 1
    assert "1 secret(s) matched no training example" in report_markdown(report)
    assert "**1 of them matched no training example**" in protection_section(report)
