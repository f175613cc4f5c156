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


def test_hush_plan_binds_the_rows_it_plans_and_verify_checks_them(corpus, tmp_path, capsys):
    """Text rows planned by `hush plan` bind the text; the tokenized rows (marks from the marking
    tokenizer, saved with save_to_disk) are planned as such, and `hush verify --dataset` with the local
    plan refuses a shuffled copy."""
    import datasets

    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer
    from hush_hf.secrets import SecretSet, mark_secrets

    data, secrets = corpus
    text_plan = tmp_path / "text_plan.json"
    args = f"--secrets {secrets} --batch-size 4 --steps 5"
    assert main(f"plan --dataset {data} {args} --output {text_plan}".split()) == 0
    assert ProtectionPlan.load(text_plan).rows.columns == ("text",)

    tokenizer = mark_secrets(gpt2_tokenizer(), SecretSet.load(secrets))
    texts = datasets.load_dataset("json", data_files=str(data), split="train")
    tokens = texts.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])
    tokens.save_to_disk(str(tmp_path / "tokens"))
    token_plan = tmp_path / "token_plan.json"
    assert main(f"plan --dataset {tmp_path / 'tokens'} {args} --output {token_plan}".split()) == 0
    planned = ProtectionPlan.load(token_plan)
    assert planned.rows.columns == ("attention_mask", "input_ids")
    text_counts = ProtectionPlan.load(text_plan).secrets.num_examples
    np.testing.assert_array_equal(planned.secrets.num_examples, text_counts)
    planned.attach(tokens)  # the saved rows, marks and all
    # The text plan with the tokenized rows, text kept: the tokens cannot be checked against the text.
    added = r"made from \(\['text'\]\): \[\] missing, \['attention_mask', 'input_ids'\] added"
    with pytest.raises(ValueError, match=added):
        ProtectionPlan.load(text_plan).check_rows(tokens.add_column("text", texts["text"]))

    tagged = tmp_path / "tagged"
    from hush_hf.secrets import tag_dataset, tagger_for

    tag_dataset(texts, tagger_for(SecretSet.load(secrets)), num_secrets=3).save_to_disk(str(tagged))
    capsys.readouterr()
    assert main(["verify", "--plan", str(text_plan), "--dataset", str(tagged)]) == 0
    shuffled = tmp_path / "shuffled"
    datasets.load_from_disk(str(tagged)).shuffle(seed=0).flatten_indices().save_to_disk(str(shuffled))
    assert main(["verify", "--plan", str(text_plan), "--dataset", str(shuffled)]) == 1  # a failed check
    out = capsys.readouterr().out
    assert "FAILED  rows: --dataset differs from the rows the plan was made from at" in out
    assert not any(word in out.lower() for word in SECRET_WORDS)
