"""Review round 4: rows whose model input spells a secret that the plan counted as holding none."""

from __future__ import annotations

import warnings

import datasets
import pytest

from hush_hf import mark_secrets, prepare_secret_ids
from hush_hf.assets.tokenizer_assets import bert_uncased_tokenizer, gpt2_tokenizer
from hush_hf.secrets import SecretSet, tag_dataset, tagger_for
from hush_hf.secrets.marks import find_marks_column
from tests.test_trainer_helpers import dp_config, single_thread, tiny_gpt2  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given", "ignore:.*mark more than")

SECRETS = SecretSet.from_records(
    [
        {"id": "s0", "prior": 1e-3, "target": 0.2, "terms": ["nightjar"]},
        {"id": "s1", "prior": 1e-3, "target": 0.2, "terms": ["falcon"]},
    ]
)
DOCUMENTS = ["the meeting moved to friday", "the code name changed again", "lunch is at noon", "nightjar"]
SUMMARIES = ["meeting moved", "the code name is nightjar", "soup", "a falcon"]


def _separately_tokenized_labels(marking, **kwargs):
    """The seq2seq preprocessing of scripts written before ``text_target``: the summary tokenized on its
    own, its ``input_ids`` kept as the labels (its marks column dropped with the rest of its output)."""
    raw = datasets.Dataset.from_dict({"document": DOCUMENTS, "summary": SUMMARIES})

    def preprocess(batch):
        model_inputs = marking(batch["document"], truncation=True, max_length=32)
        model_inputs["labels"] = marking(batch["summary"], truncation=True, max_length=16)["input_ids"]
        return model_inputs

    return raw.map(preprocess, batched=True, remove_columns=raw.column_names, **kwargs)


# ------------------------------------------------------------ 1. labels the marks never saw
@pytest.mark.parametrize("make", [gpt2_tokenizer, bert_uncased_tokenizer], ids=["gpt2", "bert-uncased"])
def test_labels_tokenized_apart_that_spell_a_secret_the_marks_lack_are_refused(make) -> None:
    # The model is trained to write row 1's summary ("... nightjar"), yet the marks follow the document
    # only: the row was counted as holding no secret, silently.
    plain = make()
    rows = _separately_tokenized_labels(mark_secrets(plain, SECRETS))
    refused = (r"^train_dataset row 1: its labels spell secret #0, which its secret marks do not hold "
               r".*text_target")
    with pytest.raises(ValueError, match=refused) as error:
        prepare_secret_ids(rows, secret_set=SECRETS, tokenizer=plain)
    assert "nightjar" not in str(error.value) and "falcon" not in str(error.value)


def test_the_trainer_refuses_labels_the_marks_never_saw(tmp_path) -> None:
    from hush_hf.trainer import SecretProtectionTrainer

    plain = gpt2_tokenizer()
    rows = _separately_tokenized_labels(mark_secrets(plain, SECRETS))
    with pytest.raises(ValueError, match=r"^train_dataset row 1: its labels spell secret #0"):
        SecretProtectionTrainer(model=tiny_gpt2(), args=dp_config(tmp_path), train_dataset=rows,
                                processing_class=plain, secrets=SECRETS)


def test_labels_of_one_call_with_text_target_pass_and_mark_what_the_truncated_labels_spell() -> None:
    # tokenizer(inputs, text_target=targets) marks the row with the targets' secrets, and also with what
    # the labels spell once truncated: " fal" + "con" (cut from "falconry", no secret) spells "falcon".
    plain = gpt2_tokenizer()
    marking = mark_secrets(plain, SECRETS)
    targets = ["a falconry trip", "the code name is nightjar", "soup", "none"]
    assert plain.decode(plain("a falconry trip")["input_ids"][:3]) == "a falcon"
    assert tagger_for(SECRETS)("a falconry trip") == set()
    expected_first = {3: [1]}  # "a" " fal" "con": spells "falcon"; every other cut (and the whole) does not
    for max_length in range(1, 9):
        encoded = marking(DOCUMENTS, text_target=targets, truncation=True, max_length=max_length)
        rows = datasets.Dataset.from_dict(dict(encoded))
        ids = prepare_secret_ids(rows, secret_set=SECRETS, tokenizer=plain)["secret_ids"]
        assert ids == [expected_first.get(max_length, []), [0], [], [0]], max_length
    column = find_marks_column(list(encoded.keys()))
    assert all(marks == [0] for marks in encoded[column][1])  # the target's secret on every input token


def test_labels_that_are_the_inputs_need_no_decoding_and_no_secret_set() -> None:
    # A causal LM's labels (a copy of input_ids, prompt masked with -100): the marks cover them.
    marking = mark_secrets(gpt2_tokenizer(), SECRETS)
    encoded = marking([f"{d} {s}" for d, s in zip(DOCUMENTS, SUMMARIES, strict=True)])
    encoded["labels"] = [[-100] * 2 + ids[2:] for ids in encoded["input_ids"]]
    rows = datasets.Dataset.from_dict(dict(encoded))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ids = prepare_secret_ids(rows)["secret_ids"]
    assert ids == [[], [0], [], [0, 1]]


def test_labels_beyond_the_inputs_without_a_tokenizer_or_secret_set_are_warned_loudly() -> None:
    plain = gpt2_tokenizer()
    rows = _separately_tokenized_labels(mark_secrets(plain, SECRETS))
    for kwargs in ({"secret_set": SECRETS}, {"tokenizer": plain}):
        with pytest.warns(UserWarning, match=r"train_dataset's labels are other tokens than its input_ids at "
                                             r"4 of 4 rows \(first: row 0\)") as record:
            prepare_secret_ids(rows, **kwargs)
        assert all("nightjar" not in str(w.message) for w in record)


# ------------------------------------------------------------ 3. every choice of a multiple-choice row
def test_every_choice_of_a_multiple_choice_row_must_spell_its_text_column() -> None:
    # run_swag-style rows: input_ids holds one sequence per choice. Only the first choice was checked
    # against the tagged text column, so a secret in a later choice's ending went untagged, silently.
    from hush_hf.trainer.text_tokens import check_tokens_spell_text

    tokenizer = gpt2_tokenizer()
    contexts = ["he opened the box", "she left"]
    endings = [["and smiled", "and it was nightjar"], ["early", "late"]]
    pairs = list(zip(contexts, endings, strict=True))
    text = [f"{c} {ends[0]}" for c, ends in pairs]  # the first choice only
    choices = [[tokenizer(f"{c} {e}")["input_ids"] for e in ends] for c, ends in pairs]
    rows = datasets.Dataset.from_dict({"text": text, "input_ids": choices})
    with pytest.raises(ValueError, match=r"^train_dataset row 0: its input_ids spell text that its 'text'"):
        check_tokens_spell_text(rows, tokenizer, text_column="text", name="train_dataset")
    whole = ["\n".join(f"{c} {e}" for e in ends) for c, ends in pairs]  # every choice
    every = rows.remove_columns("text").add_column("text", whole)
    check_tokens_spell_text(every, tokenizer, text_column="text", name="train_dataset")
    tagged = tag_dataset(datasets.Dataset.from_dict({"text": whole}), tagger_for(SECRETS), num_secrets=2)
    assert tagged["secret_ids"] == [[0], []]


# ------------------------------------------------------------ 2. plan_protection on rows it cannot check
TWO = SecretSet.from_records(
    [
        {"id": "s0", "prior": 1e-3, "target": 0.2, "terms": ["falcon"]},
        {"id": "s1", "prior": 1e-3, "target": 0.2, "terms": ["lunch"]},
    ]
)


PROMPTS = ["our project is called", "lunch is", "a falcon is", "dinner is"] * 2
COMPLETIONS = [" falcon", " soup", " fast", " lunch again"] * 2  # each secret: 2 prompts, 4 rows in all


def _plan(rows):
    from hush_hf.planning import plan_protection

    return plan_protection(rows, TWO.priors, TWO.targets, expected_batch_size=2, steps=2, accountant="tight")


def _prompt_completion_rows(tokenizer):
    """What TRL's SFTTrainer prepares from prompt/completion rows tagged on the prompt alone: the tagged
    columns kept, input_ids of prompt + completion (+ EOS) and labels a copy (the TRL tokenizing, here)."""
    data = datasets.Dataset.from_dict({"prompt": PROMPTS, "completion": COMPLETIONS})
    data = tag_dataset(data, tagger_for(TWO), text_column="prompt", num_secrets=2)  # the prompt only

    def tokenize(row):
        ids = tokenizer(row["prompt"] + row["completion"])["input_ids"] + [tokenizer.eos_token_id]
        return {"input_ids": ids, "labels": list(ids)}

    return data.map(tokenize)


def test_plan_protection_warns_that_tokens_beside_ids_tagged_from_text_are_unchecked() -> None:
    # The documented TRL path planned these rows with plan_protection: the plan counted no row holding
    # secret #0 while four rows train " falcon", and nothing was said.
    tokenizer = gpt2_tokenizer()
    rows = _prompt_completion_rows(tokenizer)
    unchecked = (r"the dataset's input_ids and labels are trusted to spell the text its 'secret_ids' were "
                 r"tagged from \(column 'prompt'\), unchecked: .*prepare_secret_ids")
    with pytest.warns(UserWarning, match=unchecked):
        plan = _plan(rows)
    assert plan.secrets.num_examples.tolist() == [2, 2]  # 4 and 4 rows train them: what the warning is about
    refused = r"^train_dataset row 0: its input_ids spell text that its 'prompt' column"
    with pytest.raises(ValueError, match=refused):
        prepare_secret_ids(rows, secret_set=TWO, tokenizer=tokenizer)


def test_plan_protection_warns_that_ids_it_cannot_check_are_trusted() -> None:
    tokenizer = gpt2_tokenizer()
    gone = _prompt_completion_rows(tokenizer).remove_columns("prompt")  # the tagged column dropped
    with pytest.warns(UserWarning, match=r"cannot be checked against the text they were tagged from \(column "
                                         r"'prompt' is gone\)"):
        _plan(gone)
    made_elsewhere = datasets.Dataset.from_dict({"text": ["falcon", "lunch"] * 4,
                                                 "secret_ids": [[0], [1]] * 4})
    with pytest.warns(UserWarning, match=r"record no text they were tagged from"):
        _plan(made_elsewhere)


def test_rows_prepare_secret_ids_checked_are_planned_without_a_second_warning() -> None:
    tokenizer = gpt2_tokenizer()
    whole = datasets.Dataset.from_dict({"prompt": PROMPTS, "completion": COMPLETIONS})
    whole = whole.map(lambda row: {"full_text": row["prompt"] + row["completion"]})
    rows = tag_dataset(whole, tagger_for(TWO), text_column="full_text", num_secrets=2)
    eos = [tokenizer.eos_token_id]
    rows = rows.map(lambda row: {"input_ids": tokenizer(row["full_text"])["input_ids"] + eos})
    checked = prepare_secret_ids(rows, secret_set=TWO, tokenizer=tokenizer)
    encoded = mark_secrets(tokenizer, TWO)(list(whole["full_text"]))
    marked = prepare_secret_ids(datasets.Dataset.from_dict(dict(encoded)), secret_set=TWO)
    for ready in (checked, marked):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            assert _plan(ready).secrets.num_examples.tolist() == [4, 4]
        assert not [w for w in record if "trusted" in str(w.message)]


# ------------------------------------------------ 4. untokenized rows: the collator may read every column
def test_untokenized_rows_are_tagged_from_every_text_column_the_collator_can_read() -> None:
    # The data collator tokenizes the rows (remove_unused_columns=False: every column reaches it), so a
    # "title" it prepends is read by the model; only "text" was tagged, silently.
    rows = datasets.Dataset.from_dict({
        "title": ["nightjar notes", "falcon", "weather", "lunch"],
        "text": ["the meeting moved", "a falcon flew", "rain today", "soup and bread"],
        "year": [2020, 2021, 2022, 2023],
    })
    tagged = prepare_secret_ids(rows, secret_set=SECRETS)
    assert tagged["secret_ids"] == [[0], [1], [], []]
    from hush_hf.secrets.tagging import check_secret_ids_current, tagged_text_columns

    assert sorted(tagged_text_columns(tagged.column_names, "secret_ids")) == ["text", "title"]
    assert check_secret_ids_current(tagged) is None  # both sources recorded and current
    edited = tagged.map(lambda row: {"title": row["title"].replace("weather", "nightjar")})
    with pytest.raises(ValueError, match=r"other text than column 'title' holds now, at 1 of 4 rows"):
        check_secret_ids_current(edited)
    tokenized = rows.add_column("input_ids", [[1, 2]] * 4)  # tokens: the tokens-spell-text check decides
    assert prepare_secret_ids(tokenized, secret_set=SECRETS)["secret_ids"] == [[], [1], [], []]


def test_verify_recomputes_the_memberships_from_the_same_columns(tmp_path) -> None:
    import argparse
    import json

    from hush_hf.cli.verify import dataset_memberships
    from hush_hf.planning.consistency import check_memberships
    from hush_hf.trainer.plan_setup import plan_for_dataset

    pairs = [("nightjar notes", "the meeting moved"), ("falcon", "a bird"), ("weather", "a falcon flew"),
             ("lunch", "soup")]
    records = [{"title": title, "text": text} for title, text in pairs] * 2
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = datasets.Dataset.from_list(records)
    plan = plan_for_dataset(prepare_secret_ids(rows, secret_set=SECRETS), SECRETS, expected_batch_size=2,
                            steps=2, lp_c=1.0, accountant="tight")
    assert plan.secrets.num_examples.tolist() == [2, 4]
    args = argparse.Namespace(dataset=str(tmp_path / "data.jsonl"), split="train", text_column="text")
    checks, membership, _, source = dataset_memberships(args, plan, SECRETS)
    assert source == "--dataset (its columns 'text', 'title' tagged with --secrets)"
    assert check_memberships(plan, membership).passed, check_memberships(plan, membership).detail


def test_ids_tagged_from_one_column_of_an_untokenized_dataset_must_hold_the_other_columns_secrets() -> None:
    # tag_dataset on "text" by the user, then the trainer: the collator may read "title" too.
    rows = datasets.Dataset.from_dict({"title": ["nightjar notes", "plain", "weather", "id-4"],
                                       "text": ["the meeting moved", "a falcon flew", "rain today", "soup"]})
    tagged = tag_dataset(rows, tagger_for(SECRETS), text_column="text", num_secrets=2)
    refused = r"^train_dataset row 0: its column 'title' spells secret #0, which its 'secret_ids' \(tagged"
    with pytest.raises(ValueError, match=refused + r" from 'text'\) lack"):
        prepare_secret_ids(tagged, secret_set=SECRETS)
    with pytest.warns(UserWarning, match=r"train_dataset is not tokenized, and its text column 'title' was"):
        prepare_secret_ids(tagged)
    harmless = tag_dataset(rows.map(lambda row: {"title": "x"}), tagger_for(SECRETS), num_secrets=2)
    assert prepare_secret_ids(harmless, secret_set=SECRETS)["secret_ids"] == [[], [1], [], []]


def test_eval_rows_whose_labels_spell_a_secret_beyond_their_marks_are_counted() -> None:
    from hush_hf.trainer.evaluation import secret_rows

    plain = gpt2_tokenizer()
    rows = _separately_tokenized_labels(mark_secrets(plain, SECRETS))  # row 1: labels only; row 3: both
    assert secret_rows(rows, secrets=SECRETS, tokenizer=plain) == 2
    assert secret_rows(rows, secrets=SECRETS) is None  # the labels cannot be read: unknown, never 1


# ------------------------------------------------ 5. TRL conversations: the chat template's text is read
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|endoftext|>system\nYou are Nova, a helpful assistant.\n"
    "{% endif %}"
    "{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}"
)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
def test_trl_conversations_are_tagged_from_the_rendered_chat_template(tmp_path) -> None:
    # docs/trl.md: tagging the messages' contents misses the template's own text (a default system prompt
    # naming secret #1 in every row); prepare_secret_ids refuses it, the rendered template passes.
    from trl import SFTConfig, SFTTrainer

    from tests.test_trl import tiny_gpt2 as tiny_double_gpt2

    secrets = SecretSet.from_records([{"id": "s0", "prior": 1e-3, "target": 0.2, "terms": ["falcon"]},
                                      {"id": "s1", "prior": 1e-3, "target": 0.2, "terms": ["nova"]}])
    tokenizer = gpt2_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    chats = [[{"role": "user", "content": "name the project"}, {"role": "assistant", "content": "falcon"}],
             [{"role": "user", "content": "lunch?"}, {"role": "assistant", "content": "soup"}]] * 2
    joins = {
        "contents": lambda row: " ".join(m["content"] for m in row["messages"]),
        "rendered": lambda row: tokenizer.apply_chat_template(row["messages"], tokenize=False),
    }
    prepared = {}
    for how, join in joins.items():
        data = datasets.Dataset.from_dict({"messages": chats})
        data = data.map(lambda row, join=join: {"full_text": join(row)})
        data = tag_dataset(data, tagger_for(secrets), text_column="full_text", num_secrets=2)
        args = SFTConfig(output_dir=str(tmp_path / how), max_steps=1, per_device_train_batch_size=2,
                         max_grad_norm=0.0, report_to=[], use_cpu=True, bf16=False,
                         activation_checkpointing=False)
        trainer = SFTTrainer(model=tiny_double_gpt2(len(tokenizer)), args=args, train_dataset=data,
                             processing_class=tokenizer)
        prepared[how] = trainer.train_dataset
    with pytest.raises(ValueError, match=r"^train_dataset row 0: its input_ids spell text that its 'full"):
        prepare_secret_ids(prepared["contents"], secret_set=secrets, tokenizer=tokenizer)
    rows = prepare_secret_ids(prepared["rendered"], secret_set=secrets, tokenizer=tokenizer)
    assert rows["secret_ids"] == [[0, 1], [1], [0, 1], [1]]


def test_attach_checks_the_tokens_against_the_tagged_text_with_the_trainers_tokenizer(tmp_path) -> None:
    # A plain Trainer given attach() trained these rows after plan_protection's warning alone: the plan's
    # memberships came from the prompt, and the completions' " falcon" trained unmarked.
    from transformers import Trainer

    from hush_hf.trainer import GhostClippingCallback
    from tests.test_trainer_helpers import pad_collate

    tokenizer = gpt2_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    rows = _prompt_completion_rows(tokenizer)
    with pytest.warns(UserWarning, match="unchecked"):
        plan = _plan(rows)
    args = dp_config(tmp_path, remove_unused_columns=False)
    trainer = Trainer(model=tiny_gpt2(vocab=len(tokenizer)), args=args, train_dataset=plan.attach(rows),
                      data_collator=pad_collate, processing_class=tokenizer)
    with pytest.raises(ValueError, match=r"^train_dataset row 0: its input_ids spell text that its 'prompt'"):
        GhostClippingCallback.attach(trainer, plan)
