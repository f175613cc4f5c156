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
