"""tag_dataset: the secret_ids column, unions, validation, and num_proc equivalence."""

from __future__ import annotations

import datasets
import pytest

from hush_hf.secrets import CallableTagger, RegexTagger, SecretSet, TermTagger, tag_dataset, tagger_for

TEXTS = [
    "The cat sat on the catalog.",
    "New York has cats, not a cat.",
    "Nothing here",
    "call 555-1234 about the CAT in new york",
    "",
]


def _dataset() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text": TEXTS, "label": list(range(len(TEXTS)))})


def test_adds_sorted_unique_ids_with_an_int64_list_feature():
    tagged = tag_dataset(_dataset(), TermTagger({2: ["cat"], 0: ["new york"], 1: ["the"]}))
    assert tagged["secret_ids"] == [[1, 2], [0, 2], [], [0, 1, 2], []]
    assert tagged.features["secret_ids"] == datasets.Sequence(datasets.Value("int64"))
    assert tagged["label"] == list(range(len(TEXTS)))  # other columns untouched


def test_several_taggers_are_unioned():
    empty = CallableTagger(lambda text: [2] if text == "" else [])
    taggers = [TermTagger({0: ["cat"]}), RegexTagger({1: r"\d{3}-\d{4}"}), empty]
    tagged = tag_dataset(_dataset(), taggers, num_secrets=3)
    assert tagged["secret_ids"] == [[0], [0], [], [0, 1], [2]]


def test_tagger_for_a_secret_set_end_to_end():
    records = [("cat", 1e-10, 1e-3), ("ny", 1e-10, 1e-3, ["new york"], r"\d{3}-\d{4}")]
    secrets = SecretSet.from_records(records)
    tagged = tag_dataset(_dataset(), tagger_for(secrets), num_secrets=len(secrets))
    assert tagged["secret_ids"] == [[0], [0, 1], [], [0, 1], []]


def test_existing_column_needs_overwrite():
    tagged = tag_dataset(_dataset(), TermTagger({0: ["cat"]}))
    with pytest.raises(ValueError, match="column 'secret_ids' already exists; pass overwrite=True"):
        tag_dataset(tagged, TermTagger({0: ["nothing"]}))
    retagged = tag_dataset(tagged, TermTagger({0: ["nothing"]}), overwrite=True)
    assert retagged["secret_ids"] == [[], [], [0], [], []]
    assert retagged.column_names == ["text", "label", "secret_ids", "secret_ids__hush_tagged_text__text"]


def test_custom_column_and_text_column():
    dataset = datasets.Dataset.from_dict({"body": ["a cat", "a dog"]})
    tagged = tag_dataset(dataset, TermTagger({0: ["dog"]}), "body", column="ids")
    assert tagged["ids"] == [[], [0]]


def test_missing_text_column_names_it_and_the_available_ones():
    with pytest.raises(ValueError) as info:
        tag_dataset(_dataset(), TermTagger({0: ["cat"]}), "content")
    assert str(info.value) == (
        "tag_dataset: text_column 'content' not found; available columns: ['text', 'label']"
    )


def test_known_ids_are_checked_against_num_secrets_before_any_work():
    def fail(text):
        raise AssertionError("tagging must not start")

    with pytest.raises(ValueError, match=r"the tagger has secret id 7, out of range \[0, 5\)"):
        tag_dataset(_dataset(), [CallableTagger(fail), TermTagger({7: ["cat"]})], num_secrets=5)


def test_unknown_id_error_names_example_and_id():
    tagger = CallableTagger(lambda text: [9] if "555" in text else [1])
    with pytest.raises(ValueError, match=r"^example 3: secret id 9 is out of range \[0, 4\)$"):
        tag_dataset(_dataset(), tagger, num_secrets=4, batch_size=2)
    negative = CallableTagger(lambda text: [-2] if "Nothing" in text else [])
    with pytest.raises(ValueError, match=r"^example 2: CallableTagger: secret index must be .* got -2$"):
        tag_dataset(_dataset(), negative)
    # without num_secrets only the sign is checked
    assert tag_dataset(_dataset(), tagger)["secret_ids"][3] == [9]


def test_non_string_text_is_an_error_naming_the_example():
    dataset = datasets.Dataset.from_dict({"text": ["a cat", None, "cat"]})
    with pytest.raises(ValueError, match="^example 1: column 'text' holds a NoneType, not a string$"):
        tag_dataset(dataset, TermTagger({0: ["cat"]}))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_proc": 0}, "num_proc must be a positive integer, got 0"),
        ({"batch_size": -1}, "batch_size must be a positive integer, got -1"),
        ({"num_secrets": 2.5}, "num_secrets must be a positive integer, got a float"),
        ({"column": "text"}, "column='text' would overwrite the text column"),
    ],
)
def test_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tag_dataset(_dataset(), TermTagger({0: ["cat"]}), **kwargs)


def test_bad_tagger_and_dataset_types():
    with pytest.raises(ValueError, match="must be a Tagger or a list of Taggers, got a function"):
        tag_dataset(_dataset(), lambda text: [0])
    with pytest.raises(ValueError, match="dataset must be a datasets.Dataset or DatasetDict, got a list"):
        tag_dataset(TEXTS, TermTagger({0: ["cat"]}))


def test_dataset_dict_is_tagged_split_by_split():
    test = datasets.Dataset.from_dict({"text": ["cat"]})
    splits = datasets.DatasetDict({"train": _dataset(), "test": test})
    tagged = tag_dataset(splits, TermTagger({0: ["cat"]}))
    assert tagged["train"]["secret_ids"] == [[0], [0], [], [0], []]
    assert tagged["test"]["secret_ids"] == [[0]]
    with pytest.raises(ValueError, match="not found in split 'test'"):
        tag_dataset(datasets.DatasetDict({"test": test.rename_column("text", "x")}), TermTagger({0: ["a"]}))


def test_num_proc_two_gives_identical_results():
    texts = [
        f"doc {i} " + " ".join(f"w{(i * k) % 13}" for k in range(1, 6)) + (" w1 w2" if i % 3 else "")
        for i in range(48)
    ]
    dataset = datasets.Dataset.from_dict({"text": texts})
    terms = {j: [f"w{j}"] for j in range(13)} | {13: ["w1 w2"]}
    taggers = [TermTagger(terms), RegexTagger({14: r"doc 1\d\b"})]
    serial = tag_dataset(dataset, taggers, num_secrets=15, batch_size=5)
    parallel = tag_dataset(dataset, taggers, num_secrets=15, batch_size=5, num_proc=2)
    assert parallel["secret_ids"] == serial["secret_ids"]
    assert any(13 in ids for ids in serial["secret_ids"]) and any(14 in ids for ids in serial["secret_ids"])


def test_secret_strings_are_not_printed(capsys):
    tag_dataset(_dataset(), TermTagger({0: ["catalog"]}))
    captured = capsys.readouterr()
    assert "catalog" not in captured.out + captured.err
