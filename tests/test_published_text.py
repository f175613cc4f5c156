"""No published text file spells a protected secret (hush_hf.trainer.published_text)."""

from __future__ import annotations

import json

import pytest

from hush_hf.secrets import Secret, SecretSet
from hush_hf.trainer.published_text import check_published_text, is_read
from tests.test_publishing import commits  # noqa: F401  (fixture: HfApi mocked, nothing leaves the machine)
from tests.test_review_findings_3 import secret_trainer
from tests.test_trainer_helpers import single_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")

SECRETS = SecretSet([Secret(name="s0", prior=1e-3, target_posterior=0.2, terms=("nightjar",))])


def tokenizer():
    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer

    tok = gpt2_tokenizer()
    tok.pad_token = tok.eos_token
    return tok


def refused(what, name):
    return rf"^{what}: {name} in '[^']+' spells protected secret 0, and would publish it verbatim"


def test_label_names_in_config_json_are_refused_on_save_and_push(tmp_path, commits):  # noqa: F811
    # A classifier's id2label made from the private data's labels was saved and pushed in config.json,
    # beside a card saying no secret's content is published.
    trainer = secret_trainer(tmp_path, tokenizer())
    trainer.model.config.id2label = {0: "weather", 1: "Project NightJar"}
    trainer.model.config.label2id = {"weather": 0, "Project NightJar": 1}
    trainer.train()
    with pytest.raises(ValueError, match=refused("save_model", r"config\.json")) as error:
        trainer.save_model()
    assert "ightjar" not in str(error.value).lower()
    with pytest.raises(ValueError, match=refused("push_to_hub", r"config\.json")):
        trainer.push_to_hub()
    assert commits == []


def test_a_chat_template_spelling_a_secret_is_refused(tmp_path):
    tok = tokenizer()
    tok.chat_template = "{% for m in messages %}NIGHT-JAR desk: {{ m['content'] }}{% endfor %}"
    trainer = secret_trainer(tmp_path, tok)
    trainer.train()
    template_file = r"(chat_template\.jinja|tokenizer_config\.json)"
    with pytest.raises(ValueError, match=refused("save_model", template_file)):
        trainer.save_model()


def test_a_card_naming_a_secret_and_an_extra_file_holding_one_are_refused(tmp_path, commits):  # noqa: F811
    trainer = secret_trainer(tmp_path, tokenizer())
    trainer.train()
    trainer.save_model()  # nothing spells the secret: saved
    with pytest.raises(ValueError, match=refused("create_model_card", r"README\.md")):
        trainer.create_model_card(dataset="nightjar incident logs")
    trainer.create_model_card(dataset="internal logs")
    out = tmp_path / "out"
    (out / "notes.md").write_text("Trained on the Nightjar tickets.\n")
    with pytest.raises(ValueError, match=refused("push_to_hub", r"notes\.md")):
        trainer.push_to_hub(extra_files=["notes.md"])
    assert commits == []
    trainer.push_to_hub()
    (paths, _), = commits
    assert "config.json" in paths and "notes.md" not in paths


def test_json_is_read_string_by_string_with_escapes_decoded(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"night": "jar", "labels": ["a", "b"]}))
    check_published_text(tmp_path, ["config.json"], SECRETS, "save_model")  # two strings, no secret
    (tmp_path / "config.json").write_text(json.dumps({"label": "NIGHT\u00adJAR"}))  # escaped soft hyphen
    assert "\\u00ad" in (tmp_path / "config.json").read_text()
    with pytest.raises(ValueError, match=refused("save_model", r"config\.json")):
        check_published_text(tmp_path, ["config.json"], SECRETS, "save_model")
    (tmp_path / "broken.json").write_text('{"label": "nightjar"')  # not JSON: read as text
    with pytest.raises(ValueError, match=refused("save_model", r"broken\.json")):
        check_published_text(tmp_path, ["broken.json"], SECRETS, "save_model")
    check_published_text(tmp_path, ["config.json"], None, "save_model")  # no secrets known: nothing read


@pytest.mark.parametrize(
    ("name", "read"),
    [("config.json", True), ("README.md", True), ("chat_template.jinja", True), ("sub/notes.txt", True),
     ("tokenizer.json", False), ("vocab.json", False), ("merges.txt", False), ("hush_plan.json", False),
     ("model.safetensors", False), ("spiece.model", False), ("targets.png", False)],
)
def test_which_files_are_read(name, read):
    assert is_read(name) is read


def test_write_protection_artifacts_called_directly_checks_what_the_saves_check(tmp_path):
    # Called by hand beside weights saved some other way, it certified them (sigma, steps, digests), and
    # wrote its card beside a config spelling a secret.
    import torch

    trainer = secret_trainer(tmp_path, tokenizer())
    trainer.train()
    out = tmp_path / "out"
    trainer.save_model()
    trainer.write_protection_artifacts(out)  # the weights save_model wrote: certified again
    with torch.no_grad():
        trainer.model.transformer.wte.weight.add_(1.0)
    trainer.model.save_pretrained(out)  # other weights, saved by hand
    with pytest.raises(ValueError, match=r"^write_protection_artifacts: output_dir '[^']+' holds the weight "
                                         r"file 'model\.safetensors', which no save_model or push_to_hub"):
        trainer.write_protection_artifacts(out)
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "config.json").write_text(json.dumps({"id2label": {"0": "nightjar"}}))
    with pytest.raises(ValueError, match=refused("write_protection_artifacts", r"config\.json")):
        trainer.write_protection_artifacts(clean)


def test_a_digest_whose_digits_happen_to_spell_a_short_secret_is_not_a_spelling(tmp_path):
    """The card's sha256 digests (plan, weights, seed commitment) are read as their prefix alone: a 3-digit
    canary matched a run of digits inside the weights' digest now and then (an end-to-end test failed so
    about once in a hundred runs). The same digits anywhere else in the card are still refused."""
    digits = SecretSet([Secret(name="c0", prior=1e-3, target_posterior=0.2, terms=("892",))])
    digest = "sha256:" + "ab892f" + "0" * 58
    card = tmp_path / "README.md"
    card.write_text(f"weights:\n  model.safetensors: {digest}\nseed_commitment: hmac-{digest}\n")
    check_published_text(tmp_path, ["README.md"], digits, "save_model")  # not refused
    card.write_text(f"weights:\n  model.safetensors: {digest}\ncode: 892\n")
    with pytest.raises(ValueError, match=refused("save_model", r"README\.md")):
        check_published_text(tmp_path, ["README.md"], digits, "save_model")
    card.write_text("model.safetensors: sha256:ab892f\n")  # not a whole digest: read as it is
    with pytest.raises(ValueError, match=refused("save_model", r"README\.md")):
        check_published_text(tmp_path, ["README.md"], digits, "save_model")
