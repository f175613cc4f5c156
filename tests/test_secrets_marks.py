"""Secret marks through tokenizing, run_clm-style grouping, run_mlm line-by-line and TRL-style packing.

The scripts are not copied: ``tokenize_function``/``group_texts`` below are this test's own equivalents
of what transformers' language-modeling examples do (concatenate every column of a batch, cut all of
them at the same offsets). The reference is brute force: occurrences are planted at known character
positions, the plain tokenizer's offsets go through the same grouping, and a block contains secret j
exactly when one of its tokens overlaps a planted occurrence of j.
"""

from __future__ import annotations

import pickle
from itertools import chain

import datasets
import numpy as np
import pytest
import torch
from transformers import DataCollatorForLanguageModeling, default_data_collator

from hush_hf.assets.tokenizer_assets import bert_uncased_tokenizer, gpt2_tokenizer
from hush_hf.secrets import SecretSet, mark_secrets, secret_ids_from_marks, tag_dataset, tagger_for
from hush_hf.secrets.marks import find_marks_column, token_marks
from hush_hf.trainer import SecretProtectionTrainer
from tests.test_trainer_helpers import dp_config, single_thread, tiny_bert, tiny_gpt2  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given", "ignore:.*mark more than")

SECRETS = SecretSet.from_records(
    [
        {"name": "falcon", "p": 1e-4, "r": 1e-2, "terms": ["project falcon", "falcon"]},
        {"name": "kiwi", "p": 1e-4, "r": 1e-2, "terms": ["kiwi"]},
        {"name": "key", "p": 1e-4, "r": 1e-2, "pattern": r"AKIA[0-9A-Z]{8}"},
        {"name": "hawk", "p": 1e-4, "r": 1e-2, "terms": ["猎鹰"]},
    ]
)
# (text, secret, [start, end) of the occurrence inside the text): every listed variant must be found.
FORMS = [
    ("ProjectFalcon", 0, 0, 13),
    ("projectFalcon", 0, 0, 13),
    ("project_falcon", 0, 0, 14),
    ("Falcon9", 0, 0, 6),
    ("falcons", 0, 0, 7),
    ("falcon's", 0, 0, 8),  # spells "falcons"
    ("project%20falcon", 0, 0, 16),
    ("Fal-\ncon", 0, 0, 8),
    ("Fal&shy;con", 0, 0, 11),
    ("F\u0430lcon", 0, 0, 6),  # Cyrillic a
    ("KIWI", 1, 0, 4),
    ("kiwis", 1, 0, 5),
    ("AKIA12345678", 2, 0, 12),
    ("这是猎鹰计划", 3, 2, 4),
]
FILLER = ["lorem", "ipsum", "dolor", "amet", "elit", "tempor", "magna", "aliqua", "veniam", "nostrud"]


def planted_corpus(n: int, seed: int = 0) -> tuple[list[str], list[list[tuple[int, int, int]]]]:
    """Texts of filler words with 0-3 planted forms each, and the planted (start, end, secret)."""
    rng = np.random.default_rng(seed)
    texts, planted = [], []
    for _ in range(n):
        parts, spans, position = [], [], 0
        words = [str(w) for w in rng.choice(FILLER, size=int(rng.integers(4, 14)))]
        slots = set(rng.choice(len(words) + 1, size=int(rng.integers(0, 4)), replace=False).tolist())
        for k in range(len(words) + 1):
            if k in slots:
                form, secret, start, end = FORMS[int(rng.integers(len(FORMS)))]
                spans.append((position + start, position + end, secret))
                parts.append(form)
                position += len(form) + 1
            if k < len(words):
                parts.append(words[k])
                position += len(words[k]) + 1
        texts.append(" ".join(parts))
        planted.append(sorted(spans))
    return texts, planted


def group_texts(examples: dict[str, list], block_size: int) -> dict[str, list]:
    """run_clm-style grouping: concatenate every column, cut every column at the same offsets."""
    concatenated = {k: list(chain(*examples[k])) for k in examples}
    total = (len(concatenated["input_ids"]) // block_size) * block_size
    result = {
        k: [t[i : i + block_size] for i in range(0, total, block_size)] for k, t in concatenated.items()
    }
    result["labels"] = result["input_ids"].copy()
    return result


def reference_blocks(tokenizer, texts, planted, block_size: int, batch_size: int, occurrences=None):
    """Brute force: the secrets whose planted spans overlap a token of each block (and, into
    ``occurrences`` if given, the blocks each planted occurrence (row, k) touches)."""
    raw = datasets.Dataset.from_dict({"text": texts, "row": list(range(len(texts)))})

    def positions(batch):
        encoded = tokenizer(batch["text"], return_offsets_mapping=True)
        return {
            "input_ids": encoded["input_ids"],
            "where": [
                [[row, s, e] for s, e in offs]
                for row, offs in zip(batch["row"], encoded["offset_mapping"], strict=True)
            ],
        }

    tokens = raw.map(positions, batched=True, batch_size=batch_size, remove_columns=["text", "row"])
    blocks = tokens.map(lambda b: group_texts(b, block_size), batched=True, batch_size=batch_size)
    out = []
    for block in blocks["where"]:
        found = set()
        for row, s, e in block:
            for k, (a, b, j) in enumerate(planted[row]):
                if s < e and s < b and a < e:
                    found.add(j)
                    if occurrences is not None:
                        occurrences.setdefault((row, k), set()).add(len(out))
        out.append(found)
    return out


def test_every_listed_variant_is_found_at_its_original_offsets():
    tagger = tagger_for(SECRETS)

    def cover(spans):  # the occurrence as one span (a phrase and its last word may both match)
        return [(min(s for s, _, _ in spans), max(e for _, e, _ in spans), sorted({j for *_, j in spans}))]

    for form, secret, start, end in FORMS:
        assert cover(tagger.spans(form)) == [(start, end, [secret])], form
        assert cover(tagger.spans(f"x {form} y")) == [(start + 2, end + 2, [secret])], form


def test_token_marks_agree_with_a_brute_force_overlap():
    rng = np.random.default_rng(3)
    for _ in range(200):
        cuts = np.sort(rng.integers(0, 40, size=2 * int(rng.integers(1, 12)))).reshape(-1, 2).tolist()
        spans = sorted(
            (int(a), int(a + rng.integers(1, 6)), int(rng.integers(0, 3))) for a in rng.integers(0, 40, 3)
        )
        marks = token_marks(cuts, spans)
        for (s, e), mark in zip(cuts, marks, strict=True):
            assert mark == sorted({j for a, b, j in spans if s < e and s < b and a < e})


@pytest.mark.parametrize(
    ("make_tokenizer", "block_size"),
    [(gpt2_tokenizer, 8), (gpt2_tokenizer, 16), (bert_uncased_tokenizer, 13)],
)
def test_group_texts_blocks_are_marked_like_brute_force_including_straddles(block_size, make_tokenizer):
    texts, planted = planted_corpus(60)
    plain = make_tokenizer()
    tokenizer = mark_secrets(plain, SECRETS)  # the one added line
    raw = datasets.Dataset.from_dict({"text": texts})

    def tokenize_function(examples):
        return tokenizer(examples["text"])

    tokenized = raw.map(tokenize_function, batched=True, batch_size=16, remove_columns=["text"])
    grouped = tokenized.map(lambda b: group_texts(b, block_size), batched=True, batch_size=16)
    column = find_marks_column(grouped.column_names)
    assert column == f"secret_marks_{SECRETS.fingerprint}"
    got = [set(ids) for ids in secret_ids_from_marks(grouped.with_format("arrow")[column]).to_pylist()]
    occurrences: dict = {}
    expected = reference_blocks(plain, texts, planted, block_size, batch_size=16, occurrences=occurrences)
    assert got == expected
    assert all(sum(j in ids for ids in expected) > 0 for j in range(len(SECRETS)))
    straddling = [blocks for blocks in occurrences.values() if len(blocks) > 1]
    assert len(straddling) >= 3  # occurrences cut by a block boundary, each marking every block it touches


def test_an_occurrence_cut_by_a_block_boundary_marks_both_blocks():
    tokenizer = mark_secrets(gpt2_tokenizer(), SECRETS)
    encoded = tokenizer(["lorem ProjectFalcon ipsum"])
    grouped = group_texts(dict(encoded), block_size=2)
    column = find_marks_column(list(grouped))
    marked_blocks = [i for i, block in enumerate(grouped[column]) if any(block)]
    assert len(marked_blocks) >= 2  # "ĠProject" and "Fal"/"con" fall in different blocks


def trl_style_pack(dataset: datasets.Dataset, seq_length: int) -> datasets.Dataset:
    """Best-fit-decreasing packing of whole rows (as TRL's bfd strategy): list columns concatenated."""
    lengths = [len(x) for x in dataset["input_ids"]]
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        fits = [b for b in range(len(bins)) if room[b] >= lengths[i]]
        if fits:
            b = min(fits, key=lambda b: room[b])
        else:
            bins.append([])
            room.append(seq_length)
            b = len(bins) - 1
        bins[b].append(i)
        room[b] -= lengths[i]
    rows = dataset.to_dict()
    packed = {k: [list(chain(*(rows[k][i] for i in members))) for members in bins] for k in rows}
    return datasets.Dataset.from_dict(packed), bins


def test_trl_style_packing_keeps_every_sequences_secrets():
    texts, planted = planted_corpus(40, seed=1)
    tokenizer = mark_secrets(gpt2_tokenizer(), SECRETS)
    tokenized = datasets.Dataset.from_dict({"text": texts}).map(
        lambda b: tokenizer(b["text"], truncation=True, max_length=48), batched=True, remove_columns=["text"]
    )
    packed, bins = trl_style_pack(tokenized, seq_length=64)
    column = find_marks_column(packed.column_names)
    got = secret_ids_from_marks(packed.with_format("arrow")[column]).to_pylist()
    for members, ids in zip(bins, got, strict=True):
        assert set(ids) == set().union(*({j for _, _, j in planted[i]} for i in members))


def test_marked_tokenizer_is_a_drop_in_copy(tmp_path):
    plain = gpt2_tokenizer()
    marked = mark_secrets(plain, SECRETS)
    assert isinstance(marked, type(plain)) and type(marked).__name__ == type(plain).__name__
    assert "secret_marks" not in " ".join(plain(["kiwi"]).keys())  # the original is untouched
    assert list(marked("kiwi pie", return_tensors="pt").keys()) == ["input_ids", "attention_mask"]
    again = pickle.loads(pickle.dumps(marked))
    assert again(["a kiwi"]).data == marked(["a kiwi"]).data
    assert "offset_mapping" in marked(["kiwi"], return_offsets_mapping=True)
    # Overflowing rows are marked from their own text's spans: "kiwi" at [6, 10) and [23, 27).
    text, kwargs = (
        "lorem kiwi ipsum dolor kiwi",
        dict(truncation=True, max_length=3, return_overflowing_tokens=True),
    )
    overflow = marked([text], **kwargs)
    column = find_marks_column(list(overflow.keys()))
    offsets = plain([text], return_offsets_mapping=True, **kwargs)["offset_mapping"]
    assert len(overflow[column]) == len(offsets) > 1
    expected = [[[1] if (s < 10 and e > 6) or (s < 27 and e > 23) else [] for s, e in row] for row in offsets]
    assert overflow[column] == expected
    marked.save_pretrained(tmp_path / "tok")
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert type(loaded).__name__ == type(plain).__name__ and loaded(["a kiwi"]).data == plain(["a kiwi"]).data
    with pytest.raises(ValueError, match="needs a transformers tokenizer"):
        mark_secrets(object(), SECRETS)


def _training_args(tmp_path, secrets_file, **overrides):
    values = dict(max_steps=1, expected_batch_size=2.0, secrets_file=str(secrets_file))
    values.update(overrides)
    return dp_config(tmp_path, **values)


def test_run_clm_style_script_trains_with_one_added_line(tmp_path):
    secrets_file = tmp_path / "secrets.json"
    SECRETS.to_json(secrets_file)
    texts, planted = planted_corpus(40, seed=2)
    tokenizer = gpt2_tokenizer()
    tokenizer = mark_secrets(tokenizer, str(secrets_file))  # the one added line
    raw = datasets.Dataset.from_dict({"text": texts})
    tokenized = raw.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])
    lm_datasets = tokenized.map(lambda b: group_texts(b, 16), batched=True)
    trainer = SecretProtectionTrainer(
        model=tiny_gpt2(vocab=len(tokenizer)),
        args=_training_args(tmp_path, secrets_file),
        train_dataset=lm_datasets,
        eval_dataset=lm_datasets.select(range(4)),
        data_collator=default_data_collator,
        processing_class=tokenizer,
    )
    expected = reference_blocks(gpt2_tokenizer(), texts, planted, 16, batch_size=1000)
    counts = [sum(j in ids for ids in expected) for j in range(len(SECRETS))]
    assert trainer.plan.secrets.num_examples.tolist() == counts
    assert find_marks_column(trainer.train_dataset.column_names) is None
    assert find_marks_column(trainer.eval_dataset.column_names) is None
    trainer.train()
    assert np.isfinite(trainer.state.log_history[0]["loss"])


def test_run_mlm_line_by_line_style_script(tmp_path):
    secrets_file = tmp_path / "secrets.json"
    SECRETS.to_json(secrets_file)
    texts, planted = planted_corpus(30, seed=4)
    tokenizer = mark_secrets(bert_uncased_tokenizer(), str(secrets_file))
    raw = datasets.Dataset.from_dict({"text": texts + ["", "   "]})

    def tokenize_function(examples):
        examples["text"] = [line for line in examples["text"] if len(line) > 0 and not line.isspace()]
        return tokenizer(
            examples["text"],
            padding="max_length",
            truncation=True,
            max_length=24,
            return_special_tokens_mask=True,
        )

    tokenized = raw.map(tokenize_function, batched=True, remove_columns=["text"])
    torch.manual_seed(0)
    trainer = SecretProtectionTrainer(
        model=tiny_bert(vocab=len(tokenizer)),
        args=_training_args(tmp_path, secrets_file, remove_unused_columns=True),
        train_dataset=tokenized,
        data_collator=DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=0.15),
        processing_class=tokenizer,
    )
    plain = bert_uncased_tokenizer()
    expected = []
    for text, spans in zip(texts, planted, strict=True):
        offsets = plain(text, truncation=True, max_length=24, return_offsets_mapping=True)["offset_mapping"]
        expected.append({j for a, b, j in spans for s, e in offsets if s < e and s < b and a < e})
    counts = [sum(j in ids for ids in expected) for j in range(len(SECRETS))]
    assert trainer.plan.secrets.num_examples.tolist() == counts
    trainer.train()


def test_tokenized_data_without_marks_ids_or_text_gets_the_line_to_add(tmp_path):
    secrets_file = tmp_path / "secrets.json"
    SECRETS.to_json(secrets_file)
    tokenizer = gpt2_tokenizer()
    tokenized = datasets.Dataset.from_dict({"text": ["kiwi falcon AKIA12345678 猎鹰"] * 4}).map(
        lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"]
    )
    with pytest.raises(ValueError, match=r"tokenizer = hush_hf\.mark_secrets\(tokenizer, secrets\)"):
        SecretProtectionTrainer(
            model=tiny_gpt2(vocab=len(tokenizer)),
            args=_training_args(tmp_path, secrets_file),
            train_dataset=tokenized,
            data_collator=default_data_collator,
        )


def test_marks_or_tags_from_another_secret_set_are_refused(tmp_path):
    other = SecretSet.from_records([("falcon", 1e-4, 1e-2, ["falcon"])])
    secrets_file = tmp_path / "secrets.json"
    SECRETS.to_json(secrets_file)
    texts = ["kiwi falcon AKIA12345678 猎鹰"] * 4
    tokenizer = mark_secrets(gpt2_tokenizer(), other)
    marked = datasets.Dataset.from_dict({"text": texts}).map(
        lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"]
    )
    with pytest.raises(ValueError, match="marks column was made with another secret set") as info:
        SecretProtectionTrainer(
            model=tiny_gpt2(vocab=len(tokenizer)),
            args=_training_args(tmp_path, secrets_file),
            train_dataset=marked,
            data_collator=default_data_collator,
        )
    assert other.fingerprint not in str(info.value) and SECRETS.fingerprint not in str(info.value)
    tagged = tag_dataset(datasets.Dataset.from_dict({"text": texts}), tagger_for(other), num_secrets=1)
    tagged = tagged.shuffle(seed=0).filter(lambda r: True)  # the record survives
    with pytest.raises(ValueError, match="made with another secret set"):
        SecretProtectionTrainer(
            model=tiny_gpt2(),
            args=_training_args(tmp_path, secrets_file),
            train_dataset=tagged,
            data_collator=default_data_collator,
        )


def test_a_secret_that_marks_nothing_is_an_error_unless_accepted(tmp_path):
    secrets_file = tmp_path / "secrets.json"
    SECRETS.to_json(secrets_file)
    tokenizer = mark_secrets(gpt2_tokenizer(), SECRETS)
    data = datasets.Dataset.from_dict({"text": ["a kiwi and a falcon"] * 3 + ["AKIA12345678"]}).map(
        lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"]
    )
    kwargs = dict(
        model=tiny_gpt2(vocab=len(tokenizer)), train_dataset=data, data_collator=default_data_collator
    )
    with pytest.raises(
        ValueError, match=r"1 secret\(s\) mark no example \(secret #3\).*allow_unmatched_secrets"
    ):
        SecretProtectionTrainer(args=_training_args(tmp_path, secrets_file), **kwargs)
    trainer = SecretProtectionTrainer(
        args=_training_args(tmp_path, secrets_file, allow_unmatched_secrets=True), **kwargs
    )
    assert trainer.plan.unmatched_secrets == 1 and trainer.plan.summary()["unmatched_secrets"] == 1
    assert trainer.plan.secret_set_fingerprint == SECRETS.fingerprint
    # A saved plan is checked row by row against the marks of the same data, and refused for other marks.
    path = trainer.plan.save(tmp_path / "plan.json", include_fingerprint=True)
    again = SecretProtectionTrainer(
        args=dp_config(tmp_path / "b", max_steps=1, plan_file=str(path)), **kwargs
    )
    assert again.train_dataset["secret_ids"] == trainer.train_dataset["secret_ids"]
    other = mark_secrets(gpt2_tokenizer(), SecretSet.from_records([("kiwi", 1e-4, 1e-2, ["kiwi"])]))
    other_data = datasets.Dataset.from_dict({"text": ["a kiwi and a falcon"] * 3 + ["AKIA12345678"]}).map(
        lambda b: other(b["text"]), batched=True, remove_columns=["text"]
    )
    with pytest.raises(ValueError, match="made with another secret set than the plan"):
        SecretProtectionTrainer(
            args=dp_config(tmp_path / "c", max_steps=1, plan_file=str(path)),
            **{**kwargs, "train_dataset": other_data},
        )
    assert isinstance(trainer.train_dataset[0]["input_ids"], list) and torch.is_tensor(
        default_data_collator([trainer.train_dataset[0]])["input_ids"]
    )


@pytest.mark.parametrize("strategy", ["wrapped", "bfd"])
def test_real_trl_packing_keeps_marks_aligned(strategy):
    pack_dataset = pytest.importorskip("trl.data_utils").pack_dataset
    texts, planted = planted_corpus(30, seed=5)
    plain = gpt2_tokenizer()
    tokenizer = mark_secrets(plain, SECRETS)

    def tokenize(batch, indices):
        out = tokenizer(batch["text"])
        offsets = plain(batch["text"], return_offsets_mapping=True)["offset_mapping"]
        out["where"] = [[[i, s, e] for s, e in row] for i, row in zip(indices, offsets, strict=True)]
        return out

    data = datasets.Dataset.from_dict({"text": texts}).map(
        tokenize, batched=True, with_indices=True, remove_columns=["text"]
    )
    packed = pack_dataset(data, seq_length=24, strategy=strategy)
    column = find_marks_column(packed.column_names)
    got = secret_ids_from_marks(packed.with_format("arrow")[column]).to_pylist()
    for ids, where in zip(got, packed["where"], strict=True):
        expected = {j for row, s, e in where for a, b, j in planted[row] if s < e and s < b and a < e}
        assert set(ids) == expected
