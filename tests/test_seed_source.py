"""The training record, card, report and `hush verify` say where the DP seed came from.

Whoever knows the seed reproduces the batches and subtracts the noise, so bounds certified for a seed the
user chose (``dp_seed=``) hold only against an attacker who does not know it. The record states
``dp_seed_source`` ("drawn" by hush_hf, or "user"); a record without it (written before it existed) is
stated as unknown, never as drawn."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml

from hush_hf.audit.card import write_protection_artifacts
from hush_hf.cli import main
from hush_hf.planning.plan import ProtectionPlan, content_digest
from hush_hf.planning.record import TrainingRecord
from hush_hf.trainer.seed_store import load_dp_seed_source, new_run_id, save_dp_seed, seed_path
from tests.test_trainer import SEED, build, files_holding
from tests.test_trainer_helpers import make_plan, single_thread  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")

DIGEST = "sha256:" + "ab" * 32
USER_WARNING = ("WARNING: the DP seed was set by the user (dp_seed), not drawn by hush_hf: every bound holds "
                "only against an attacker who does not know that seed")
UNKNOWN_WARNING = "WARNING: the DP seed is of unknown origin (the training record does not say"
CARD_BOUNDS_SENTENCE = "The bounds hold only against an attacker who does not know that seed"


def small_plan(steps=2):
    return make_plan(np.full(8, 0.5), steps=steps, noise_multiplier=1.0)


def published_run(folder, **overrides):
    """A 2-step run saved to ``folder`` (dp_seed: the tests' 1234 unless overridden)."""
    trainer = build(folder, plan=small_plan(), **overrides)
    trainer.train()
    trainer.save_model()
    return folder


def certificate_of(folder):
    """(the card's `hush_hf` metadata, privacy_report.json, the card's text)."""
    text = (folder / "README.md").read_text()
    metadata = yaml.safe_load(text.split("---")[1])
    return metadata["hush_hf"], json.loads((folder / "privacy_report.json").read_text()), text


def verify(capsys, *argv):
    code = main(["verify", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def redigested(data):
    data = {k: v for k, v in data.items() if k != "digest"}
    return {**data, "digest": content_digest(data)}


@pytest.mark.parametrize("source", ["drawn", "user", None])
def test_the_record_round_trips_the_source_and_the_digest_covers_it(source):
    record = TrainingRecord(1.0, 2, 1.0, weights={"model.safetensors": DIGEST}, dp_seed_source=source)
    data = record.to_json()
    assert ("dp_seed_source" in data) == (source is not None)  # unknown is no field: older records keep
    again = TrainingRecord.from_json(json.loads(json.dumps(data)))  # their digest
    assert again == record and again.stated_seed_source == (source or "unknown")
    plan = small_plan().with_training(record)
    saved = json.loads(json.dumps(plan.to_json()))
    assert ProtectionPlan.from_json(saved).training == record
    # An edited source is caught like any other edit of the record.
    for edit in ("drawn", "user", "remove"):
        if edit == source or (edit == "remove" and source is None):
            continue
        forged = json.loads(json.dumps(saved))
        if edit == "remove":
            del forged["training"]["dp_seed_source"]
        else:
            forged["training"]["dp_seed_source"] = edit
        with pytest.raises(ValueError, match="digest"):
            ProtectionPlan.from_json(forged)


@pytest.mark.parametrize("value", ["Drawn", None, 1, "system"])
def test_a_malformed_source_is_refused_naming_the_field(value):
    data = TrainingRecord(1.0, 2, 1.0).to_json()
    with pytest.raises(ValueError, match=r"training\.dp_seed_source must be one of \['drawn', 'user'\]"):
        TrainingRecord.from_json({**data, "dp_seed_source": value})
    if value is not None:
        with pytest.raises(ValueError, match=r"training\.dp_seed_source must be one of"):
            TrainingRecord(1.0, 2, 1.0, dp_seed_source=value)


def test_a_run_with_dp_seed_publishes_a_card_and_certificate_saying_user(tmp_path, capsys):
    folder = published_run(tmp_path / "user")  # dp_seed=1234
    block, report, card = certificate_of(folder)
    assert block["dp_seed_source"] == "user" and block["format_version"] == 2
    assert report["certificate"] == block and report["training"]["dp_seed_source"] == "user"
    assert json.loads((folder / "hush_plan.json").read_text())["training"]["dp_seed_source"] == "user"
    warning = ("**WARNING: the secret seed of the sampling and the noise was set by the user (`dp_seed`), "
               f"not drawn by hush_hf.** {CARD_BOUNDS_SENTENCE}")
    assert warning in card and warning in (folder / "privacy_report.md").read_text()
    assert "| DP seed | set by the user (dp_seed), not drawn by hush_hf |" in card
    code, out = verify(capsys, folder)
    assert code == 0, out  # a chosen seed kept secret is still secret: warned, not failed
    assert USER_WARNING in out and "DP seed set by the user (dp_seed)" in out
    verdict = [line for line in out.splitlines() if line.startswith("OK: ")]
    assert verdict[0].endswith("the bounds hold only against an attacker who does not know the DP seed "
                               "(WARNING above)")
    code, out = verify(capsys, folder, "--require-drawn-seed")
    failed = re.search(r"\nFAILED +DP seed: the training record says the seed was 'user'", out)
    assert code == 1 and failed, out


def test_a_run_without_dp_seed_states_drawn_and_verify_does_not_warn(tmp_path, capsys):
    folder = published_run(tmp_path / "drawn", dp_seed=None)
    block, report, card = certificate_of(folder)
    assert block["dp_seed_source"] == report["training"]["dp_seed_source"] == "drawn"
    assert "WARNING" not in card and CARD_BOUNDS_SENTENCE not in card
    assert "secret seed that hush_hf drew from the operating system at train start (128 bits)" in card
    assert "| DP seed | drawn by hush_hf (128 bits from the OS at train start) |" in card
    for argv in ((folder,), (folder, "--require-drawn-seed")):
        code, out = verify(capsys, *argv)
        assert code == 0 and "WARNING" not in out and "DP seed drawn by hush_hf" in out, out


@pytest.mark.parametrize("dp_seed", [None, SEED])
def test_a_resumed_run_keeps_its_first_runs_source(tmp_path, private_dp_state_dir, capsys, dp_seed):
    plan = make_plan(np.full(10, 0.4), steps=4, noise_multiplier=0.7)
    first = build(tmp_path / "out", 10, plan=plan, max_steps=4, dp_seed=dp_seed, save_strategy="steps",
                  save_steps=2)
    first.train()
    run_id = json.loads((tmp_path / "out" / "checkpoint-2" / "hush_state.json").read_text())["run_id"]
    source = "drawn" if dp_seed is None else "user"
    assert load_dp_seed_source(private_dp_state_dir, run_id) == source  # kept with the seed, privately
    resumed = build(tmp_path / "out", 10, plan=plan, max_steps=4, dp_seed=None)  # the seed from dp_state_dir
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    resumed.save_model(str(tmp_path / "model"))
    block, report, _ = certificate_of(tmp_path / "model")
    assert block["dp_seed_source"] == report["training"]["dp_seed_source"] == source
    assert verify(capsys, tmp_path / "model")[0] == 0
    assert files_holding(tmp_path / "out", SEED) == files_holding(tmp_path / "model", SEED) == []


def test_a_seed_file_without_a_source_resumes_as_unknown_or_user(tmp_path, private_dp_state_dir):
    plan = make_plan(np.full(10, 0.4), steps=4, noise_multiplier=0.7)
    build(tmp_path / "out", 10, plan=plan, max_steps=4, save_strategy="steps", save_steps=2).train()
    run_id = json.loads((tmp_path / "out" / "checkpoint-2" / "hush_state.json").read_text())["run_id"]
    path = seed_path(private_dp_state_dir, run_id)
    older = {k: v for k, v in json.loads(path.read_text()).items() if k != "dp_seed_source"}
    path.write_text(json.dumps(older))  # as a hush_hf before the field wrote it
    assert load_dp_seed_source(private_dp_state_dir, run_id) is None
    for dp_seed, stated in ((None, "unknown"), (1234, "user")):  # 1234: the tests' seed, the file's
        resumed = build(tmp_path / "out", 10, plan=plan, max_steps=4, dp_seed=dp_seed)
        resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
        resumed.save_model(str(tmp_path / stated))
        assert certificate_of(tmp_path / stated)[0]["dp_seed_source"] == stated


def test_the_seed_file_records_the_source_once(tmp_path):
    run_id = new_run_id()
    path = save_dp_seed(tmp_path, run_id, 7, source="user")
    assert json.loads(path.read_text())["dp_seed_source"] == "user"
    assert save_dp_seed(tmp_path, run_id, 7, source="drawn") == path  # written once: the first run's source
    assert load_dp_seed_source(tmp_path, run_id) == "user"
    with pytest.raises(ValueError, match="dp_seed_source must be one of"):
        save_dp_seed(tmp_path, new_run_id(), 7, source="chosen")
    path.write_text(json.dumps({**json.loads(path.read_text()), "dp_seed_source": "7"}))
    with pytest.raises(ValueError, match=f"DP seed file '{path}': dp_seed_source must be 'drawn' or 'user'"):
        load_dp_seed_source(tmp_path, run_id)


def test_an_old_plan_without_the_field_loads_and_is_reported_as_unknown(tmp_path, capsys):
    folder = published_run(tmp_path / "old", dp_seed=None)
    data = json.loads((folder / "hush_plan.json").read_text())
    del data["training"]["dp_seed_source"]  # as a hush_hf before the field wrote it
    (folder / "hush_plan.json").write_text(json.dumps(redigested(data)))
    plan = ProtectionPlan.load(folder / "hush_plan.json")
    assert plan.training.dp_seed_source is None and plan.training.stated_seed_source == "unknown"
    # Its card and report, as that hush_hf wrote them (certificate format 1, no source): refused, saying why.
    card = folder / "README.md"
    card.write_text(card.read_text().replace("  format_version: 2\n", "  format_version: 1\n")
                    .replace("  dp_seed_source: drawn\n", ""))
    report_file = folder / "privacy_report.json"
    report = json.loads(report_file.read_text())
    report["certificate"] = {**{k: v for k, v in report["certificate"].items() if k != "dp_seed_source"},
                             "format_version": 1}
    report_file.write_text(json.dumps(report))
    code, out = verify(capsys, folder)
    older = "format_version: found 1, expected 2 (a certificate of another hush_hf version"
    assert code == 1 and f"metadata hush_hf.{older}" in out and f"certificate.{older}" in out, out
    with pytest.raises(ValueError, match="dp_seed_source='drawn' contradicts the plan's training record"):
        write_protection_artifacts(folder, plan, clip_norm=1.0, dp_seed_source="drawn")  # never upgraded
    write_protection_artifacts(folder, plan, clip_norm=1.0)  # re-certified: the card and report say unknown
    block, report, card = certificate_of(folder)
    assert block["dp_seed_source"] == report["training"]["dp_seed_source"] == "unknown"
    assert "is of unknown origin: the training record does not say whether hush_hf drew it" in card
    assert CARD_BOUNDS_SENTENCE in card and "| DP seed | unknown (the training record does not say) |" in card
    assert "dp_seed_source" not in json.loads((folder / "hush_plan.json").read_text())["training"]
    code, out = verify(capsys, folder)
    assert code == 0 and UNKNOWN_WARNING in out and "DP seed unknown" in out, out
    assert verify(capsys, folder, "--require-drawn-seed")[0] == 1


def test_a_source_edited_in_a_published_plan_fails_verify(tmp_path, capsys):
    folder = published_run(tmp_path / "edited")  # user
    plan_file = folder / "hush_plan.json"
    data = json.loads(plan_file.read_text())
    data["training"]["dp_seed_source"] = "drawn"
    plan_file.write_text(json.dumps(data))
    code, out = verify(capsys, folder)
    assert code == 2 and "digest" in out, out  # the digest covers the record
    plan_file.write_text(json.dumps(redigested(data)))  # re-digested: the card and report disagree
    code, out = verify(capsys, folder)
    assert code == 1 and 'metadata hush_hf.dp_seed_source: found "user", expected "drawn"' in out, out
