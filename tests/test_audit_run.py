"""run_audit end to end on a tiny saved model: every attack runs, and no secret string leaks anywhere."""

import json
import logging
from types import SimpleNamespace

import datasets
import numpy as np
import pytest

from hush_hf.audit.canaries import CanarySpace, canary_secret_records, insert_canaries, make_canaries
from hush_hf.audit.card import write_protection_artifacts
from hush_hf.audit.report import AUDIT_JSON
from hush_hf.audit.run import run_audit
from hush_hf.planning.plan import plan_protection
from hush_hf.secrets import SecretSet, tag_dataset, tagger_for
from tests.test_audit_toys import (
    one_torch_thread,  # noqa: F401 (autouse fixture)
    save_tiny_causal_lm,
)

# Distinctive secret strings: none may appear in any file the audit writes, or in its logs.
SECRET_NAMES = ("zorblax-quuxington", "PROJECT_HUSHED_MARMOT", "acct-7")
SECRET_TERMS = ("vexillum obscura", "glimmerpond")
SPACE = CanarySpace(template="My code is: {secret}.", alphabet="abcdefghij", length=6)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(self.format(record))


@pytest.fixture
def audited(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    canaries = make_canaries(2, repetitions=[3, 0], space=SPACE, seed=5)
    records = [{"id": SECRET_NAMES[0], "prior": 1e-6, "target": 1e-3},
               {"id": SECRET_NAMES[1], "prior": 1e-6, "target": 1e-3},
               {"id": SECRET_NAMES[2], "prior": 1e-6, "target": 1e-3, "terms": list(SECRET_TERMS)},
               *canary_secret_records(canaries, target_posterior=1e-3)]
    secrets = SecretSet.from_records(records)
    texts = [f"note {i}: the plan for {SECRET_NAMES[i % 2]} is ready." for i in range(6)]
    texts += ["the vexillum obscura moved at dawn.", "meet at Glimmerpond tonight.",
              "nothing to see here, ok."]
    train, _ = insert_canaries(texts, canaries, seed=1)
    heldout = [f"another note {i} about the weather today." for i in range(8)]
    model_dir = root / "model"
    save_tiny_causal_lm(model_dir)
    logger = logging.getLogger("hush_hf")
    handler = _Collect()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        # The real planner: the plan (and everything written from it) derives from these secrets.
        tagged = tag_dataset(datasets.Dataset.from_dict({"text": train}), tagger_for(secrets),
                             num_secrets=len(secrets))
        plan = plan_protection(tagged["secret_ids"], secrets.priors, secrets.targets, expected_batch_size=4,
                               steps=100, drop_secretless=True, allow_unmatched=True)  # canary 1: 0 copies
        write_protection_artifacts(model_dir, plan, clip_norm=0.5, dp_steps=plan.steps)
        report = run_audit(model_dir, train, output_dir=root / "audit", secrets=secrets, canaries=canaries,
                           heldout=heldout, prefix_length=4, suffix_length=4, exposure_method="skewnorm",
                           num_samples=300, num_alternatives=10, batch_size=32, seed=0)
    finally:
        logger.removeHandler(handler)
    return SimpleNamespace(report=report, root=root, canaries=canaries, messages=handler.messages, plan=plan,
                           train=train)


def test_every_attack_runs_and_nothing_leaks(audited):
    """One test on one audit run (the run is the slow part): results first, then the leak check."""
    report, plan = audited.report, audited.plan
    attacks = report["attacks"]
    assert attacks["not_run"] == {}
    assert report["training"]["clip_norm"] == 0.5  # read back from the model's privacy_report.json
    assert report["secrets"]["count"] == 5 and report["secrets"]["meets_targets"]
    exposure = attacks["exposure"]
    assert exposure["inserted"]["count"] == 1 and exposure["not_inserted"]["count"] == 1
    assert all(0.0 <= c["exposure"] <= exposure["max_possible"] for c in exposure["canaries"])
    # Rows with weight 0 (at least the secretless one) are never sampled: not members, not extractable.
    trained = int(np.count_nonzero(plan.weights))
    assert plan.weights[audited.train.index("nothing to see here, ok.")] == 0.0 and trained < 12
    assert attacks["extraction"]["num_sequences"] == trained
    assert attacks["extraction"]["sequences_from"] == "examples with a non-zero plan weight"
    assert [m["attack"] for m in attacks["membership"]] == ["loss"]
    assert attacks["membership"][0]["num_members"] == trained
    reconstruction = attacks["reconstruction"]
    # The canary never inserted has no tagged example, but canaries are probed from their template.
    assert reconstruction["num_evaluated"] == 5 and reconstruction["not_evaluated"] == {}
    assert sorted(r["index"] for r in reconstruction["secrets"]) == [0, 1, 2, 3, 4]
    assert [r["bound"] for r in sorted(reconstruction["secrets"], key=lambda r: r["index"])] == \
        pytest.approx(plan.secrets.bound.tolist())
    audit = json.loads((audited.root / "audit" / AUDIT_JSON).read_text())
    assert audit["attacks"] == json.loads(json.dumps(attacks))
    assert_nothing_leaks(audited.root, audited.canaries, audited.messages)


def assert_nothing_leaks(root, canaries, messages):
    """Grep every written file (text and binary) and every log line for every secret string."""
    forbidden = [*SECRET_NAMES, *SECRET_TERMS, *(c.value for c in canaries)]
    written = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.suffix == ".png" for p in written) and any(p.name == "README.md" for p in written)
    assert any(p.name == "hush_plan.json" for p in written)
    for path in written:
        data = path.read_bytes().lower()
        for secret in forbidden:
            assert secret.lower().encode() not in data, f"{path.name} leaks a secret"
    assert messages  # planning and the audit logged their progress
    log = "\n".join(messages).lower()
    assert not [s for s in forbidden if s.lower() in log]


def test_attacks_that_cannot_run_say_why(tmp_path):
    model_dir = tmp_path / "model"
    save_tiny_causal_lm(model_dir)
    report = run_audit(model_dir, output_dir=tmp_path / "out")
    assert report["training"] is None
    assert report["attacks"]["not_run"] == {
        "exposure": "no canaries given", "extraction": "no training data given",
        "membership": "no training data given", "reconstruction": "no secrets given"}
    with pytest.raises(ValueError, match="max_examples"):
        run_audit(model_dir, output_dir=tmp_path / "out", max_examples=0)
    with pytest.raises(ValueError, match="exposure_method"):
        run_audit(model_dir, output_dir=tmp_path / "out", exposure_method="guess")
    with pytest.raises(ValueError, match="is not a directory"):
        run_audit(tmp_path / "missing", output_dir=tmp_path / "out")


def test_a_masked_lm_gets_reconstruction_only(tmp_path):
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "key", "is", "zorblax", "glim", "##mer",
             "."]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab))
    model_dir = tmp_path / "bert"
    BertTokenizerFast.from_pretrained(tmp_path).save_pretrained(model_dir)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=64)
    BertForMaskedLM(config).save_pretrained(model_dir)
    secrets = SecretSet.from_records([{"id": "zorblax", "prior": 1e-4, "target": 1e-2},
                                      {"id": "glimmer", "prior": 1e-4, "target": 1e-2}])
    train = ["the key is zorblax .", "the key is glimmer .", "the key is ."]
    report = run_audit(model_dir, train, output_dir=tmp_path / "out", secrets=secrets)
    needs_causal = "needs a causal LM"
    assert report["attacks"]["not_run"] == {"exposure": "no canaries given", "extraction": needs_causal,
                                            "membership": needs_causal}
    rows = report["attacks"]["reconstruction"]["secrets"]
    assert [(r["index"], r["num_contexts"], r["num_candidates"]) for r in rows] == [(0, 1, 2), (1, 1, 2)]
