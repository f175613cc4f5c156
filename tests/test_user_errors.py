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


# ----------------------------------------------------------------------------------------- input hygiene
SECRET = "zanzibar"  # the secret string of these files: never in a message


@pytest.fixture
def quiet_datasets():
    """No progress bars on stderr (they would be lines besides the error line)."""
    import datasets

    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    yield
    if enabled:
        datasets.enable_progress_bars()


def plan_error(tmp_path, capsys, monkeypatch, secrets_file) -> str:
    """`hush plan` on ``secrets_file``: the one stderr line, checked to come before the data is read."""

    def no_reading(*args, **kwargs):
        raise AssertionError("the dataset was read before the secrets file was checked")

    monkeypatch.setattr("hush_hf.data.load_text_dataset", no_reading)
    argv = f"plan --dataset {tmp_path / 'd.jsonl'} --secrets {secrets_file} --batch-size 2 --steps 3"
    assert main(argv.split()) == 2
    line = error_line(capsys)
    assert SECRET not in line
    return line


def test_a_field_given_twice_in_a_secrets_file_is_an_error_with_the_line(tmp_path, capsys, monkeypatch):
    cases = {
        "dup.csv": (f"id,prior,target,terms,terms\n{SECRET},1e-4,0.05,{SECRET},other\n",
                    "line 1: the header names the field 'terms' twice"),
        "noheader.csv": (f"{SECRET},1e-4,0.05,{SECRET}\n",
                         "line 1: the header names the field (name not shown"),
        "dup.json": (f'[\n {{"id": "{SECRET}",\n  "prior": 1e-4,\n  "prior": 2e-4,\n  "target": 0.05}}\n]',
                     "line 4: one object has the field 'prior' twice; JSON would keep only the last value"),
        "keys.json": (f'{{"secrets": [], "{SECRET}": 1,\n "{SECRET}": 2}}',
                      "line 2: one object has the field (name not shown: it may be secret) twice"),
        "dup.jsonl": (f'{{"id": "a", "prior": 1e-4, "target": 0.05}}\n'
                      f'{{"id": "{SECRET}", "target": 0.05, "prior": 1e-4, "target": 0.1}}\n',
                      "line 2: one object has the field 'target' twice"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        line = plan_error(tmp_path, capsys, monkeypatch, path)
        assert line.startswith(f"hush plan: error: secrets file '{path}': {message}"), line


def test_a_secrets_file_that_is_not_utf8_names_the_file_and_line(tmp_path, capsys, monkeypatch):
    latin = f"café {SECRET}".encode("latin-1")
    cases = {
        "latin.csv": b"id,prior,target,terms\n" + latin + b",1e-4,0.05,x\n",
        "latin.json": b'[{"id": "ok", "prior": 1e-4, "target": 0.05},\n {"id": "' + latin + b'"}]',
        "latin.jsonl": b'{"id": "ok", "prior": 1e-4, "target": 0.05}\n{"id": "' + latin + b'"}\n',
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        offset = data.index(b"\xe9")
        assert plan_error(tmp_path, capsys, monkeypatch, path) == (
            f"hush plan: error: secrets file '{path}': line 2 is not UTF-8 text (byte {offset} of the file; "
            "Latin-1 or Windows encoding?): save the file as UTF-8"
        )


def test_a_regex_error_in_a_secrets_file_never_shows_group_names(tmp_path, capsys, monkeypatch):
    """re.error's own message quotes the group name ("redefinition of group name 'zanzibar' ..."): only
    the kind of error and its position are shown."""
    cases = [
        (f"(?P<{SECRET}>a)(?P<{SECRET}>b)", "redefinition of group name at position 19"),
        (f"(?P={SECRET})", "unknown group name at position 4"),
        (f"(?P<{SECRET}-x>a)", "bad character in group name at position 4"),
        (f"(?P<ok>a)(?({SECRET})b)", "unknown group name at position 12"),
    ]
    for pattern, kind in cases:
        path = tmp_path / "regex.json"
        path.write_text(json.dumps([{"id": "s", "prior": 1e-4, "target": 0.05, "pattern": pattern}]))
        assert plan_error(tmp_path, capsys, monkeypatch, path) == (
            f"hush plan: error: secret #0: pattern is not a valid regular expression: {kind}"
        )


@pytest.mark.usefixtures("quiet_datasets")
def test_a_malformed_jsonl_dataset_is_one_line_with_file_and_line_in_plan_and_redact(files, tmp_path, capsys):
    _, secrets, _ = files
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f'{{"text": "doc 0 {SECRET}"}}\n{{"text": "doc 1 {SECRET}\n{{"text": "doc 2"}}\n')
    expected = (f"dataset file '{bad}': line 2 is not valid JSON (column 10: Unterminated string starting "
                "at); JSON Lines holds one object per line")
    assert main(f"plan --dataset {bad} --secrets {secrets} --batch-size 2 --steps 3".split()) == 2
    assert error_line(capsys) == f"hush plan: error: {expected}"
    out = tmp_path / "redacted.jsonl"
    assert main(f"redact --dataset {bad} --output {out}".split()) == 2
    assert error_line(capsys) == f"hush redact: error: {expected}"
    assert not out.exists()


@pytest.mark.usefixtures("quiet_datasets")
def test_load_text_dataset_names_the_file_and_line_of_what_datasets_cannot_read(tmp_path):
    from hush_hf.data import load_text_dataset

    cases = {
        "trunc.json": (f'[{{"text": "{SECRET}"}},\n {{"text": "b"', "line 2, column 14: not valid JSON"),
        "rows.jsonl": (f'{{"text": "{SECRET}"}}\n[1, 2]\n', "line 2 is a JSON list, not an object"),
        "fields.csv": (f"text,label\n{SECRET},1\n{SECRET},2,3\n", "line 3: 3 fields but the header has 2"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError) as info:
            load_text_dataset(str(tmp_path / name))
        assert str(info.value).startswith(f"dataset file '{tmp_path / name}': {message}"), str(info.value)
        assert SECRET not in str(info.value)
    # Latin-1: pyarrow would load it into a string column unchecked and fail at the first read of the row.
    for name in ("latin.jsonl", "latin.txt", "latin.csv"):
        text = {"latin.jsonl": f'{{"text": "ok"}}\n{{"text": "café {SECRET}"}}\n',
                "latin.txt": f"ok\ncafé {SECRET}\n", "latin.csv": f"text\nok\ncafé {SECRET}\n"}[name]
        data = text.encode("latin-1")
        offset = data.index("é".encode("latin-1"))
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError) as info:
            load_text_dataset(str(tmp_path / name))
        assert str(info.value) == (
            f"dataset file '{tmp_path / name}': line {2 if name != 'latin.csv' else 3} is not UTF-8 text "
            f"(byte {offset} of the file; Latin-1 or Windows encoding?): save the file as UTF-8"
        )
    (tmp_path / "ok.jsonl").write_text(f'{{"text": "café {SECRET}"}}\n')  # UTF-8 with a BOM-less accent
    assert load_text_dataset(str(tmp_path / "ok.jsonl"))["text"] == [f"café {SECRET}"]


def test_a_malformed_canary_file_names_the_file(tmp_path, capsys):
    from hush_hf.audit.canaries import CanarySpace, make_canaries, save_canaries

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    good = save_canaries(tmp_path / "good.json", make_canaries(2, space=CanarySpace(length=6), seed=1))
    data = json.loads(good.read_text())
    values = [c["value"] for c in data["canaries"]]
    text = good.read_text()
    twice = text.replace('"repetitions": 1', '"repetitions": 1, "value": "000000"', 1)
    line = twice[: twice.index('"value": "000000"')].count("\n") + 1  # counted here, independently
    cases = [
        (text[:-3], " is not valid JSON at line"),
        (twice, f": line {line}: one object has the field 'value' twice"),
        (json.dumps({**data, "canaries": [{"index": 0, "value": values[0]}]}),
         ": canaries[0] must be an object with the keys index, value, repetitions"),
        (json.dumps({**data, "canaries": [{"index": "0", "value": values[0], "repetitions": 1}]}),
         ": canaries[0]: index must be an integer, got a str"),
        (json.dumps({**data, "canaries": [{"index": 0, "value": values[0] + "x", "repetitions": 1}]}),
         ": canaries[0]: value is not in this canary space"),
        (json.dumps({**data, "space": {"template": "{secret}"}}),
         ": 'space' must be an object with the keys"),
        (json.dumps({"canaries": []}), ": not a canary file"),
    ]
    bad = tmp_path / "canaries.json"
    for content, message in cases:
        bad.write_text(content)
        argv = ["audit", "--model-dir", str(model), "--canaries", str(bad), "--output-dir", str(tmp_path)]
        assert main(argv) == 2
        line = error_line(capsys)
        assert line.startswith(f"hush audit: error: canary file '{bad}'{message}"), (line, message)
        assert not any(value in line for value in values)


def test_a_run_without_secrets_file_names_the_flag():
    # README's run_clm.py line, run without --secrets_file: "got a NoneType" named nothing.
    from transformers import HfArgumentParser

    from hush_hf import SecretProtectionConfig, mark_secrets
    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer

    (config,) = HfArgumentParser(SecretProtectionConfig).parse_args_into_dataclasses(
        ["--output_dir", "unused", "--max_steps", "5", "--use_cpu", "--report_to", "none"]
    )
    with pytest.raises(ValueError, match=r"^mark_secrets got no secrets: give the secrets file \(--secrets_"):
        mark_secrets(gpt2_tokenizer(), config.secrets_file)
