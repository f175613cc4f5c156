"""`hush plan` end to end on local files: plan JSON, sweep plot, no secret strings anywhere."""

import json

import numpy as np
import pytest

from hush_hf.cli import main
from hush_hf.planning import ProtectionPlan

SECRET_WORDS = ["zanzibarquux", "plutoniumfizz", "orchidvault"]


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(0)
    filler = ["the", "model", "learns", "from", "many", "documents", "about", "science", "and", "code"]
    rows = []
    for i in range(120):
        words = list(rng.choice(filler, size=12))
        for j, secret in enumerate(SECRET_WORDS):
            if rng.random() < (0.3 if j == 0 else 0.12):
                words.insert(int(rng.integers(len(words))), secret.upper() if i % 2 else secret)
        rows.append({"text": " ".join(words)})
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    secrets = tmp_path / "secrets.csv"
    secrets.write_text(
        "id,prior,target\n"
        + "\n".join(f"{w},1e-4,{t}" for w, t in zip(SECRET_WORDS, (0.01, 0.02, 0.05), strict=True))
    )
    return data, secrets


def test_hush_plan_writes_a_plan_and_never_prints_secrets(corpus, tmp_path, capsys):
    data, secrets = corpus
    out = tmp_path / "out" / "plan.json"
    code = main(
        f"plan --dataset {data} --secrets {secrets} --batch-size 4 --steps 30 --c 0.5 --accountant kl "
        f"--output {out} --sweep-c".split()
    )
    assert code == 0
    printed = capsys.readouterr()
    plan = ProtectionPlan.load(out)
    assert plan.num_examples == 120 and plan.num_secrets == 3
    assert plan.meets_targets and plan.noise_multiplier > 0
    # Case-insensitive tagging found every occurrence: the first secret is the most frequent.
    assert plan.secrets.num_examples[0] == max(plan.secrets.num_examples)
    assert "noise multiplier" in printed.out
    sweep = json.loads((out.parent / "sweep_c.json").read_text())
    assert [r["lp_c"] for r in sweep] == [2.0**k for k in range(-6, 5)]
    assert (out.parent / "sweep_c.png").stat().st_size > 10_000
    for text in [printed.out, printed.err, out.read_text(), (out.parent / "sweep_c.json").read_text()]:
        for word in SECRET_WORDS:
            assert word not in text.lower()


def test_hush_plan_document_frequency_selection(corpus, tmp_path, capsys):
    data, _ = corpus
    out = tmp_path / "plan.json"
    code = main(
        f"plan --dataset {data} --df-range 10 60 --accountant tight --prior 1e-6 --target-range 1e-3 5e-3 "
        f"--batch-size 4 --steps 20 --output {out}".split()
    )
    assert code == 0
    plan = ProtectionPlan.load(out)
    assert plan.num_secrets >= 1
    assert np.all((plan.secrets.num_examples >= 10) & (plan.secrets.num_examples <= 60))
    assert np.all((plan.secrets.target >= 1e-3) & (plan.secrets.target <= 5e-3))


def test_hush_plan_bad_input_is_one_clear_line(corpus, tmp_path, capsys):
    data, secrets = corpus
    out = tmp_path / "p.json"
    code = main(f"plan --dataset {data} --secrets {secrets} --batch-size 4 --steps 0 --output {out}".split())
    assert code == 2
    assert "steps (T) must be an integer >= 1, got 0" in capsys.readouterr().err
