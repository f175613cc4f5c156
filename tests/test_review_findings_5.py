"""Review round 5: bad input a user hands hush_hf (secrets files, config fields, CLI flags, plan files edited
by hand) is refused in one line naming the field or the file and line and the value, before any work, and
never quotes a secret."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest

from hush_hf.cli import main
from hush_hf.planning import ProtectionPlan, plan_protection
from hush_hf.planning.plan import content_digest
from hush_hf.trainer.config import SecretProtectionConfig

SECRET = "nightjar"
pytestmark = pytest.mark.filterwarnings("ignore:.*mark more than", "ignore:the dataset's 'secret_ids' record")


def one_line(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and SECRET not in message.lower(), message
    return message


# -- plan files edited by hand ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory):
    rows = datasets.Dataset.from_dict({"text": ["a", "b", "c", "d", "e", "f"],
                                       "secret_ids": [[0], [0], [], [1], [], [1]]})
    plan = plan_protection(rows, np.array([1e-4, 1e-4]), np.array([0.05, 0.1]), expected_batch_size=2.0,
                           steps=3)
    return plan.to_json(include_fingerprint=True)


def _set(path: str, value):
    def edit(data):
        *parents, last = path.split(".")
        for key in parents:
            data = data[key]
        data[last] = value
    return edit


def _delete(path: str):
    def edit(data):
        *parents, last = path.split(".")
        for key in parents:
            data = data[key]
        del data[last]
    return edit


def _set_item(path: str, index: int, value):
    def edit(data):
        for key in path.split("."):
            data = data[key]
        data[index] = value
    return edit


NAN = float("nan")
PLAN_EDITS = [
    (_delete("noise_multiplier"), "missing field 'noise_multiplier'"),
    (_delete("secrets.target"), "missing field 'secrets.target'"),
    (_delete("memberships.indices"), "missing field 'memberships.indices'"),
    (_delete("rows.key"), "missing field 'rows.key'"),
    (_set("steps", 20.7), "steps must be an integer >= 1, got 20.7"),
    (_set("steps", "3"), "steps must be an integer >= 1, got '3'"),
    (_set("noise_multiplier", NAN), "noise_multiplier must be a finite number >= 0, got nan"),
    (_set("noise_multiplier", "1.5"), "noise_multiplier must be a finite number >= 0, got '1.5'"),
    (_set("noise_multiplier", True), "noise_multiplier must be a finite number >= 0, got True"),
    (_set("expected_batch_size", -2), "expected_batch_size must be a finite number > 0, got -2"),
    (_set("lp_c", 0), "lp_c must be a finite number > 0, got 0"),
    (_set("accountant", "nope"), "accountant must be one of ('tight', 'rdp', 'kl'), got 'nope'"),
    (_set("calibrated", "false"), "calibrated must be true or false, got 'false'"),
    (_set("lp", [1, 2]), "lp must be an object, got a list"),
    (_set("secrets", [1]), "secrets must be an object, got a list"),
    (_set("extra", 1), "unknown field 'extra'"),
    (_set_item("weights", 2, NAN), "weights[2] must be a finite number >= 0, got nan"),
    (_set_item("weights", 0, None), "weights[0] must be a number, got None"),
    (_set_item("sampling_probs", 1, 1.5), "sampling_probs[1] must be a finite number in [0, 1], got 1.5"),
    (_set_item("secrets.num_examples", 0, 2.5), "secrets.num_examples[0] must be an integer, got 2.5"),
    (_set_item("secrets.prior", 1, 0.5), "secrets.prior[1]=0.5 and secrets.target[1]=0.1 must satisfy"),
    (_set_item("memberships.indices", 0, 1.5), "memberships.indices[0] must be an integer, got 1.5"),
    (_set("rows.key", "zz"), "rows.key must be a string of hexadecimal digits"),
]


@pytest.mark.parametrize("redigest", [False, True], ids=["as edited", "digest recomputed"])
@pytest.mark.parametrize(("edit", "message"), PLAN_EDITS, ids=[m[:40] for _, m in PLAN_EDITS])
def test_a_hand_edited_plan_names_the_file_and_the_field(plan_json, tmp_path, capsys, edit, message,
                                                         redigest):
    data = json.loads(json.dumps(plan_json))
    edit(data)
    if redigest:
        data["digest"] = content_digest(json.loads(json.dumps(data)))
    path = tmp_path / "hush_plan.json"
    path.write_text(json.dumps(data))  # NaN is written as the bare token NaN
    source = f"plan file '{path}'"
    assert one_line(lambda: ProtectionPlan.load(path)).startswith(f"{source}: {message}")
    assert main(["verify", "--plan", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hush verify: error: {source}: {message}"), err


def test_an_unedited_plan_still_loads_and_an_edited_number_is_still_caught_by_the_digest(plan_json, tmp_path):
    path = tmp_path / "hush_plan.json"
    path.write_text(json.dumps(plan_json))
    assert ProtectionPlan.load(path).steps == 3
    path.write_text(json.dumps({**plan_json, "noise_multiplier": plan_json["noise_multiplier"] / 2}))
    assert "was edited after hush_hf wrote it" in one_line(lambda: ProtectionPlan.load(path))


# -- SecretProtectionConfig ------------------------------------------------------------------------------


CONFIG_CASES = [
    ("allow_unmatched_secrets", "false", "allow_unmatched_secrets must be True or False, got 'false'"),
    ("allow_unmatched_secrets", 1, "allow_unmatched_secrets must be True or False, got 1"),
    ("dp_state_dir", "", "dp_state_dir must be None or a non-empty path, got ''"),
    ("dp_state_dir", 5, "dp_state_dir must be None or a non-empty path, got a int"),
    ("secrets_file", "", "secrets_file must be None or a non-empty path, got ''"),
    ("plan_file", 7, "plan_file must be None or a non-empty path, got a int"),
    ("secrets_text_column", "", "secrets_text_column must be a non-empty column name, got ''"),
    ("crt_public_column", None, "crt_public_column must be a non-empty column name, got None"),
    ("per_example_clip_norm", NAN, "per_example_clip_norm must be a positive finite number, got nan"),
    ("per_example_clip_norm", True, "per_example_clip_norm must be a positive finite number, got True"),
    ("expected_batch_size", float("inf"), "expected_batch_size must be a positive finite number, got inf"),
    ("noise_multiplier", -1.0, "noise_multiplier must be None or a finite number >= 0, got -1.0"),
    ("lp_c", 0, "lp_c must be a positive finite number, got 0"),
    ("accountant", "TIGHT", "accountant must be one of ('tight', 'rdp', 'kl'), got 'TIGHT'"),
    ("dp_seed", -1, "dp_seed must be an integer in [0, 2**128) (value not shown: it is secret)"),
    ("crt_public_batch_size", 1.5, "crt_public_batch_size must be None or an integer >= 1, got 1.5"),
    ("crt_recall", NAN, "crt_recall must be None or a number in [0, 1], got nan"),
]


@pytest.mark.parametrize(("field", "value", "message"), CONFIG_CASES,
                         ids=[f"{f}={v!r}" for f, v, _ in CONFIG_CASES])
def test_a_bad_config_field_is_refused_when_the_config_is_built(tmp_path, field, value, message):
    def build():
        SecretProtectionConfig(output_dir=str(tmp_path), max_steps=2, report_to=[], **{field: value})

    assert one_line(build) == message


# -- secrets files ---------------------------------------------------------------------------------------


def _record(**fields) -> dict:
    return {"id": SECRET, "prior": 1e-6, "target": 1e-3, "terms": [f"project {SECRET}"], **fields}


SECRETS_FILES = [
    ("blank_id.json", json.dumps([_record(id="   ")]),
     "secret #0: name must hold a character other than spaces, got only spaces"),
    ("shared_term.json", json.dumps([_record(terms=["Falcon"]), _record(id="b", terms=["falcon"])]),
     "secret #1: terms[0] is the same term as terms[0] of secret #0 (case and spacing aside)"),
    ("term_is_other_name.json",
     json.dumps([{"id": SECRET, "p": 1e-6, "r": 1e-3}, _record(id="b", terms=[SECRET])]),
     "secret #1: terms[0] is the same term as its name (its only term) of secret #0"),
    ("shared_pattern.json", json.dumps([_record(terms=[], pattern=f"{SECRET}\\d+"),
                                        _record(id="b", terms=[], pattern=f"{SECRET}\\d+")]),
     "secret #1: pattern is the same as the pattern of secret #0"),
    ("unmatchable_name.json", json.dumps([{"id": "?!", "p": 1e-6, "r": 1e-3}]),
     "secret #0: name is the secret's only term (no terms or pattern) but contains no word characters"),
    ("empty_list.json", "[]", "holds no secrets (an empty list)"),
    ("empty.jsonl", "\n\n", "holds no secrets: it has no lines"),
    ("list_line.jsonl", json.dumps(_record()) + "\n" + json.dumps([SECRET, 0.1]) + "\n",
     "line 2: a tuple record is (name, prior, target_posterior[, terms[, pattern]]), got 2 items"),
    ("nan.jsonl", '{"id": "nightjar", "prior": NaN, "target": 0.1}\n', "line 1: prior=nan must be finite"),
    ("header_only.csv", "id,prior,target,terms\n", "holds no secrets: it is empty or has a header row only"),
    ("empty.csv", "", "holds no secrets: it is empty or has a header row only"),
    ("spaced_ids.csv", f"id,prior,target,terms\n{SECRET} ,1e-6,1e-3,a\n{SECRET},1e-6,1e-3,b\n",
     "line 3: name duplicates the name of the secret on line 2 (apart from spaces around it)"),
    ("blank_id.csv", "id,prior,target,terms\n  ,1e-6,1e-3,a\n",
     "line 2: name must hold a character other than spaces"),
    ("shared_term.csv", f"id,prior,target,terms\na,1e-6,1e-3,{SECRET}\nb,1e-6,1e-3,x;{SECRET.upper()}\n",
     "line 3: terms[1] is the same term as terms[0] of the secret on line 2"),
    ("semicolons.csv", "id,prior,target,terms\nnightjar,1e-6,1e-3, ; \n",
     "line 2: terms is empty (only ';' and spaces) and there is no pattern; leave terms out (or write @id"),
    ("semicolons.json", json.dumps([_record(terms=" ; ")]),
     "secret #0: terms is empty (only ';' and spaces) and there is no pattern"),
    ("unknown_column.csv", f"id,prior,target,{SECRET}\na,1e-6,1e-3,x\n",
     "line 1: the header has 1 unrecognised field name(s) (not shown"),
    ("no_header.csv", f"{SECRET},1e-6,1e-3,x\n", "line 1: the header has 4 unrecognised field name(s)"),
    ("capitals.csv", "ID,Prior,Target\nnightjar,1e-6,1e-3\n", "field names are lower case"),
    ("semicolon_separated.csv", "id;prior;target\nnightjar;1e-6;1e-3\n",
     "fields are separated by commas, not ';'"),
]


@pytest.mark.parametrize(("name", "text", "message"), SECRETS_FILES,
                         ids=[name for name, _, _ in SECRETS_FILES])
def test_a_bad_secrets_file_is_one_line_with_the_file_or_position_and_no_secret(tmp_path, name, text,
                                                                                message):
    from hush_hf.secrets import SecretSet

    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    error = one_line(lambda: SecretSet.load(path))
    assert message in error, error
    if name.endswith((".csv", ".jsonl")) or "holds no secrets" in message:
        assert error.startswith(f"secrets file '{path}'"), error


def test_a_folder_given_as_secrets_file_says_so(tmp_path):
    from hush_hf.secrets import SecretSet

    folder = tmp_path / "secrets.json"
    folder.mkdir()
    message = f"secrets file '{folder}' is a folder; give the secrets file in it"
    assert one_line(lambda: SecretSet.load(folder)) == message


def test_a_saved_dataset_dict_folder_is_read_and_an_unknown_split_named(cli_files, capsys):
    from hush_hf.data import load_text_dataset

    folder = cli_files / "saved"
    rows = datasets.Dataset.from_dict({"text": ["a", "b"]})
    datasets.DatasetDict({"train": rows}).save_to_disk(str(folder))
    assert len(load_text_dataset(str(folder), split="train")) == 2  # was "dataset file ... does not exist"
    message = f"dataset folder '{folder}' has no split 'test'; its splits: ['train']"
    assert one_line(lambda: load_text_dataset(str(folder), split="test")) == message


def test_distinct_secrets_still_load_and_a_term_repeated_within_one_secret_is_fine(tmp_path):
    from hush_hf.secrets import SecretSet

    path = tmp_path / "ok.csv"
    path.write_text(f"id,prior,target,terms\n{SECRET},1e-6,1e-3,{SECRET};{SECRET}\nb,1e-6,1e-3,@id\n"
                    "c,1e-6,1e-3,fa1con\nd,1e-6,1e-3,falcon\ne,1e-6,1e-3,foo_bar\nf,1e-6,1e-3,foobar\n")
    assert len(SecretSet.load(path)) == 6  # different words that match alike: as the df selection makes


def test_document_frequency_selection_keeps_words_that_match_alike():
    from hush_hf.secrets import select_by_document_frequency

    texts = ["fa1con foo_bar", "falcon foobar", "fa1con foobar", "falcon foo_bar"]
    chosen = select_by_document_frequency(texts, df_range=(2, 2))
    assert sorted(s.name for s in chosen) == ["fa1con", "falcon", "foo_bar", "foobar"]


# -- the hush command line ---------------------------------------------------------------------------------


@pytest.fixture
def cli_files(tmp_path, plan_json):
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": f"doc {i}"}) for i in range(6)))
    (tmp_path / "secrets.csv").write_text(f"id,prior,target\n{SECRET},1e-4,0.05\n")
    (tmp_path / "plan.json").write_text(json.dumps(plan_json))
    (tmp_path / "folder").mkdir()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return tmp_path


PLAN = "plan --dataset {d}/docs.jsonl --secrets {d}/secrets.csv --batch-size 2 --steps 3"
REDACT = "redact --dataset {d}/docs.jsonl --output {d}/out.jsonl"
REPORT = "report --plan {d}/plan.json --output-dir {d}/report"
CLI_CASES = [
    (PLAN + " --prior 0.5", "--prior: for the document-frequency selection (--df-ranks/--df-range) only"),
    (PLAN + " --seed 3 --target-range 0.1 0.2",
     "--target-range, --seed: for the document-frequency selection"),
    (PLAN + " --output {d}/docs.jsonl/plan.json",
     "--output '{d}/docs.jsonl/plan.json' cannot be written: '{d}/docs.jsonl' is a file, not a folder"),
    ("plan --dataset {d}/docs.jsonl --secrets {d}/folder --batch-size 2 --steps 3",
     "--secrets file '{d}/folder' is a folder; give a file"),
    ("plan --dataset {d}/docs.jsonl --df-range 1 3 --seed -1 --batch-size 2 --steps 3",
     "--seed must be >= 0, got -1"),
    ("verify --plan {d}/folder", "plan file '{d}/folder' is a folder; give a file"),
    ("audit --model-dir {d}/model --output-dir {d}/a --seed -1", "--seed must be >= 0, got -1"),
    ("audit --model-dir {d}/model --output-dir {d}/a --canaries {d}/folder",
     "--canaries file '{d}/folder' is a folder; give a file"),
    (REPORT + " --crt-conservative-recall 0.5", "--crt-conservative-recall needs --crt-recall"),
    (REPORT + " --crt-recall nan", "--crt-recall must be a number in [0, 1], got nan"),
    (REPORT + " --crt-recall 0.9 --crt-delta 0", "--crt-delta must be a number in (0, 1), got 0.0"),
    (REPORT + " --crt-recall 0.9 --crt-occurrences {d}/none.json",
     "--crt-occurrences file '{d}/none.json' does not exist"),
    (REPORT + " --output-dir {d}/docs.jsonl/r", "--output-dir '{d}/docs.jsonl/r' cannot be written"),
    (REDACT + " --near-dup nan", "--near-dup must be a Jaccard similarity in (0, 1], got nan"),
    (REDACT + " --num-proc 0", "--num-proc must be >= 1, got 0"),
    (REDACT + " --mask-token=", "--mask-token must be a non-empty string, got ''"),
    (REDACT + " --tokenizer {d}/none", "--tokenizer '{d}/none' is not a folder"),
    (REDACT + " --report {d}/folder", "--report '{d}/folder' is a folder; give the file's path"),
    (REDACT + " --secrets {d}/folder", "--secrets file '{d}/folder' is a folder; give a file"),
    ("redact --dataset {d}/docs.jsonl --output {d}/docs.jsonl/out.jsonl",
     "--output '{d}/docs.jsonl/out.jsonl' cannot be written: '{d}/docs.jsonl' is a file"),
]


@pytest.mark.parametrize(("argv", "message"), CLI_CASES, ids=[m[:40] for _, m in CLI_CASES])
def test_bad_cli_arguments_are_one_line_before_any_data_is_read(cli_files, capsys, monkeypatch, argv,
                                                                message):
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr("hush_hf.data.load_text_dataset", no_work)
    monkeypatch.setattr("hush_hf.audit.render_report", no_work)
    monkeypatch.setattr("hush_hf.audit.run_audit", no_work)
    command = argv.format(d=cli_files).split()
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    expected = f"hush {command[0]}: error: {message.format(d=cli_files)}"
    assert len(err) == 1 and err[0].startswith(expected), err


def test_df_selection_still_takes_its_defaults_when_the_flags_are_not_given(cli_files, capsys):
    out = cli_files / "df.json"
    argv = f"plan --dataset {cli_files}/docs.jsonl --df-range 1 7 --batch-size 2 --steps 3 --output {out}"
    assert main(argv.split()) == 0
    plan = ProtectionPlan.load(out)
    targets = plan.secrets.target
    assert np.all(plan.secrets.prior == 1e-10) and np.all((targets >= 2e-4) & (targets <= 1e-3))
