"""`hush audit` on texts longer than the model's positions, and an audit that stops part-way (issue 29).

The tiny GPT-2 has 128 positions and a character tokenizer (one token per character), so the
reference for every length is the number of characters.
"""

from __future__ import annotations

import json

import pytest

from hush_hf.audit import run as audit_run
from hush_hf.audit.reconstruction import SecretProbe, fit_probe
from hush_hf.cli import main
from hush_hf.secrets import SecretSet
from tests.test_audit_toys import (
    char_tokenizer,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    tiny_gpt2,
)
from tests.test_cli_audit import saved_audit_inputs

SECRET = "quasarmoth"
POSITIONS = 128


def test_the_model_max_length_is_the_models_positions():
    assert audit_run.model_max_length(tiny_gpt2(vocab_size=97), char_tokenizer()) == POSITIONS


def test_a_probe_is_cut_around_the_secret_to_fit_the_positions():
    before, after = "a" * 150 + "left side ", " right side" + "b" * 150
    probe = SecretProbe(0, ((before, SECRET, after),), ("mothquasar", "longer alternative"))
    fitted = fit_probe(probe, char_tokenizer(), POSITIONS, "causal")
    ((cut_before, written, cut_after),) = fitted.contexts
    assert written == SECRET and fitted.alternatives == probe.alternatives
    assert before.endswith(cut_before) and after.startswith(cut_after)  # the nearest characters kept
    longest = max(len(v) for v in (SECRET, *probe.alternatives))
    assert len(cut_before) + longest + len(cut_after) <= POSITIONS  # every candidate fits
    assert len(cut_before) + longest + len(cut_after) >= POSITIONS // 2  # and not much more was cut
    assert fit_probe(probe, char_tokenizer(), 12, "causal") is None  # "longer alternative" alone: 18


@pytest.fixture
def long_audit_inputs(tmp_path):
    words = [SECRET, "lanternfig", "cobaltwren"]
    secrets = SecretSet.from_records([{"id": w, "prior": 1e-6, "target": 1e-3} for w in words])
    filler = "the ledger row lists nothing of note. " * 6  # 228 characters: past the 128 positions
    texts = [f"entry {i}: {filler}the {words[i % 3]} ledger. {filler}" for i in range(9)]
    heldout = [f"other {i}: {filler}" for i in range(8)]
    return saved_audit_inputs(tmp_path, secrets, texts, heldout)


def test_texts_longer_than_the_positions_are_cut_not_an_index_error(long_audit_inputs, tmp_path):
    args, _ = long_audit_inputs
    assert main([*args, "--output-dir", str(tmp_path / "audit")]) == 0
    audit = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert audit["complete"] is True and audit["max_length"] == POSITIONS
    attacks = audit["attacks"]
    assert attacks["reconstruction"]["num_evaluated"] == 3 and attacks["membership"]
    assert set(attacks["not_run"]) == {"exposure"}  # no canaries given


def test_a_smaller_max_length_skips_what_cannot_be_cut(long_audit_inputs, tmp_path):
    args, _ = long_audit_inputs
    assert main([*args, "--output-dir", str(tmp_path / "audit"), "--max-length", "5"]) == 0
    attacks = json.loads((tmp_path / "audit" / "audit.json").read_text())["attacks"]
    assert "prefix_length + suffix_length = 6 is longer than max_length=5" in attacks["not_run"]["extraction"]
    assert attacks["reconstruction"]["num_evaluated"] == 0  # a candidate alone has 10 characters
    assert list(attacks["reconstruction"]["not_evaluated"]) == [
        "a candidate alone exceeds max_length=5 tokens"
    ]


def test_a_failing_attack_leaves_the_others_and_report_names_what_is_missing(
    long_audit_inputs, tmp_path, monkeypatch, capsys
):
    args, model_dir = long_audit_inputs

    def broken(*_args, **_kwargs):
        raise IndexError("index out of range in self")

    monkeypatch.setattr(audit_run, "reconstruction_attack", broken)
    with pytest.raises(IndexError):
        main([*args, "--output-dir", str(tmp_path / "audit")])
    audit = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert audit["complete"] is False
    assert audit["attacks"]["extraction"]["num_sequences"] >= 1 and audit["attacks"]["membership"]
    stopped = "not finished: the audit stopped during reconstruction (IndexError)"
    assert audit["attacks"]["not_run"] == {"exposure": "no canaries given", "reconstruction": stopped}
    report_args = ["report", "--plan", str(model_dir / "hush_plan.json"), "--output-dir", str(tmp_path / "r")]
    assert main([*report_args, "--audit", str(tmp_path / "audit" / "audit.json")]) == 0
    assert f"- reconstruction: not run ({stopped})" in (tmp_path / "r" / "privacy_report.md").read_text()
    assert main([*report_args, "--audit", str(tmp_path / "missing.json")]) == 2
    assert "`hush audit --output-dir DIR` writes DIR/audit.json" in capsys.readouterr().err
