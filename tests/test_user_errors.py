"""User errors of `hush plan/audit/report/verify` and the trainer: one line on stderr, exit 2, naming the
field or file, checked before any data is read; secrets never echoed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hush_hf.cli import main
from hush_hf.cli.plan import format_summary
from hush_hf.planning import plan_protection
from hush_hf.planning.plan import content_digest
from hush_hf.secrets.taggers import RegexTagger


@pytest.fixture
def files(tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"doc {i} zanzibar"}) for i in range(6)))
    secrets = tmp_path / "secrets.csv"
    secrets.write_text("id,prior,target\nzanzibar,1e-4,0.05\n")
    plan = plan_protection([[0], [0], [], [0], [], []], np.array([1e-4]), np.array([0.05]),
                           expected_batch_size=2.0, steps=3)
    return data, secrets, plan.save(tmp_path / "plan.json")


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_hush_plan_checks_arguments_before_reading_data(files, tmp_path, capsys, monkeypatch):
    data, secrets, _ = files

    def no_reading(*args, **kwargs):
        raise AssertionError("the dataset was read before the arguments were checked")

    monkeypatch.setattr("hush_hf.data.load_text_dataset", no_reading)
    cases = [
        ("--steps 0", "steps (T) must be an integer >= 1, got 0"),
        ("--steps 3 --batch-size -1", "expected_batch_size (B) must be a positive number, got -1.0"),
        ("--steps 3 --c 0", "lp_c must be a positive number, got 0.0"),
        ("--steps 3 --time-limit -5", "--time-limit must be a positive number of seconds, got -5.0"),
    ]
    for extra, message in cases:
        argv = f"plan --dataset {data} --secrets {secrets} --batch-size 2 --output {tmp_path / 'p.json'} "
        assert main((argv + extra).split()) == 2
        assert error_line(capsys) == f"hush plan: error: {message}"
    missing = tmp_path / "nope.csv"
    assert main(f"plan --dataset {data} --secrets {missing} --batch-size 2 --steps 3".split()) == 2
    assert error_line(capsys) == f"hush plan: error: --secrets file '{missing}' does not exist"


def test_hush_plan_on_an_empty_or_missing_dataset_names_the_file(files, tmp_path, capsys):
    _, secrets, _ = files
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(f"plan --dataset {empty} --secrets {secrets} --batch-size 2 --steps 3".split()) == 2
    assert error_line(capsys) == f"hush plan: error: dataset file '{empty}' is empty: it has no rows"
    gone = tmp_path / "gone.jsonl"
    assert main(f"plan --dataset {gone} --secrets {secrets} --batch-size 2 --steps 3".split()) == 2
    assert error_line(capsys) == f"hush plan: error: dataset file '{gone}' does not exist"


def test_bad_plan_files_are_one_line_naming_the_file(files, tmp_path, capsys):
    _, _, plan_path = files
    truncated = tmp_path / "truncated.json"
    truncated.write_text(plan_path.read_text()[:200])
    out = tmp_path / "report"
    assert main(["report", "--plan", str(truncated), "--output-dir", str(out)]) == 2
    line = error_line(capsys)
    assert line.startswith(f"hush report: error: plan file '{truncated}' is not valid JSON at line 1")
    assert line.endswith("(the file ends early: truncated?)")
    data = json.loads(plan_path.read_text())
    del data["weights"]
    data["digest"] = content_digest(data)
    keyless = tmp_path / "keyless.json"
    keyless.write_text(json.dumps(data))
    assert main(["verify", "--plan", str(keyless)]) == 2
    assert error_line(capsys) == f"hush verify: error: plan file '{keyless}': missing field 'weights'"
    assert main(["report", "--plan", str(tmp_path / "none.json"), "--output-dir", str(out)]) == 2
    assert error_line(capsys) == f"hush report: error: --plan file '{tmp_path / 'none.json'}' does not exist"
    bad_audit = tmp_path / "audit.json"
    bad_audit.write_text("{")
    argv = ["report", "--plan", str(plan_path), "--audit", str(bad_audit), "--output-dir", str(out)]
    assert main(argv) == 2
    assert f"audit file '{bad_audit}' is not valid JSON" in error_line(capsys)
    assert not out.exists()


def test_verify_and_audit_arguments(files, tmp_path, capsys):
    assert main(["verify"]) == 2
    assert error_line(capsys) == "hush verify: error: give MODEL_DIR or --plan"
    assert main(["verify", str(tmp_path / "nowhere")]) == 2
    assert error_line(capsys) == f"hush verify: error: MODEL_DIR '{tmp_path / 'nowhere'}' is not a folder"
    assert main(["verify", str(tmp_path)]) == 2
    plan_file = tmp_path / "hush_plan.json"
    assert error_line(capsys) == f"hush verify: error: plan file '{plan_file}' does not exist"
    assert main(["audit", "--model-dir", str(tmp_path), "--output-dir", str(tmp_path / "a")]) == 2
    message = f"--model-dir '{tmp_path}' has no config.json: not a saved model"
    assert error_line(capsys) == f"hush audit: error: {message}"


def test_argument_syntax_errors_are_one_line_with_status_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "--steps", "3"])
    assert info.value.code == 2
    assert error_line(capsys).startswith("hush plan: error: the following arguments are required: --dataset")


def test_a_bad_regex_names_the_kind_of_error_without_quoting_the_secret():
    for pattern, kind in [
        ("(?P<zanzibar>a)(?P<zanzibar>b)", "redefinition of group name"),
        ("(?P=zanzibar)", "unknown group name"),
        ("zanzibar\\q", "bad escape"),
        ("[z-a]anzibar", "bad character range"),
    ]:
        with pytest.raises(ValueError) as info:
            RegexTagger({3: pattern})
        message = str(info.value)
        prefix = "RegexTagger: pattern of secret #3 is not a valid regular expression: "
        assert message.startswith(prefix + kind)
        assert "zanzibar" not in message and "\\q" not in message and "z-a" not in message


def test_plan_summary_states_the_real_minimum():
    plan = plan_protection([[0], [0], [1], [0, 1], [1], [1], []], np.full(2, 1e-4), np.full(2, 0.05),
                           expected_batch_size=2.0, steps=3)
    assert "examples per matched secret min 3 / median 3.5 / max 4" in format_summary(plan)


def test_the_trainer_on_a_zero_row_dataset_says_so(tmp_path):
    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import dp_config, make_plan, tiny_gpt2, token_dataset

    with pytest.raises(ValueError, match="train_dataset has 0 rows"):
        SecretProtectionTrainer(model=tiny_gpt2(), args=dp_config(tmp_path), train_dataset=token_dataset(0),
                                plan=make_plan([0.5], steps=2, noise_multiplier=1.0))
