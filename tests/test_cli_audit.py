"""`hush audit` and `hush report` from the command line on a tiny saved model."""

import json

import datasets

from hush_hf.audit.card import write_protection_artifacts
from hush_hf.cli import main
from hush_hf.planning.plan import plan_protection
from hush_hf.secrets import SecretSet, tag_dataset, tagger_for
from tests.test_audit_toys import (
    one_torch_thread,  # noqa: F401 (autouse fixture)
    save_tiny_causal_lm,
)

SECRET = "quasarmoth"


def saved_audit_inputs(tmp_path, secrets: SecretSet, texts: list[str], heldout_texts: list[str]):
    """A tiny saved causal LM with its protection plan over ``texts``, the data, held-out and secrets
    files beside it: the ``hush audit`` arguments for them (without ``--output-dir``) and the model dir."""
    data, heldout = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"
    data.write_text("\n".join(json.dumps({"text": t}) for t in texts))
    heldout.write_text("\n".join(json.dumps({"text": t}) for t in heldout_texts))
    secrets_file = tmp_path / "secrets.json"
    secrets.to_json(secrets_file)
    model_dir = tmp_path / "model"
    save_tiny_causal_lm(model_dir)
    tagger = tagger_for(secrets)
    tagged = tag_dataset(datasets.Dataset.from_dict({"text": texts}), tagger, num_secrets=len(secrets.priors))
    plan = plan_protection(
        tagged["secret_ids"], secrets.priors, secrets.targets, expected_batch_size=2, steps=20
    )
    write_protection_artifacts(model_dir, plan, clip_norm=1.0, dp_steps=plan.steps)
    args = ["audit", "--model-dir", str(model_dir), "--dataset", str(data), "--heldout", str(heldout)]
    args += ["--secrets", str(secrets_file), "--prefix-length", "3", "--suffix-length", "3"]
    return [*args, "--max-examples", "8"], model_dir


def test_hush_audit_then_hush_report(tmp_path, capsys):
    secrets = SecretSet.from_records([{"id": SECRET, "prior": 1e-6, "target": 1e-3}])
    texts = [
        f"entry {i}: the {SECRET} ledger is closed." if i % 2 else f"entry {i}: all quiet." for i in range(8)
    ]
    args, model_dir = saved_audit_inputs(tmp_path, secrets, texts, [f"other entry {i}." for i in range(8)])
    audit_dir = tmp_path / "audit"
    code = main([*args, "--output-dir", str(audit_dir)])
    assert code == 0
    audit = json.loads((audit_dir / "audit.json").read_text())
    assert "membership" in json.dumps(audit["attacks"])

    report_dir = tmp_path / "report"
    code = main(
        [
            "report",
            "--plan",
            str(model_dir / "hush_plan.json"),
            "--audit",
            str(audit_dir / "audit.json"),
            "--output-dir",
            str(report_dir),
        ]
    )
    assert code == 0
    markdown = (report_dir / "privacy_report.md").read_text()
    assert "noise" in markdown.lower() and list(report_dir.glob("*.png"))
    printed = capsys.readouterr()
    for text in [printed.out, printed.err, markdown, (audit_dir / "audit.json").read_text()]:
        assert SECRET not in text
