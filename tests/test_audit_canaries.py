"""Canaries: the randomness space, seeded generation, insertion, and declaring them as secrets."""

import json

import datasets
import numpy as np
import pytest

from hush_hf.audit.canaries import (
    Canary,
    CanarySpace,
    canary_secret_records,
    insert_canaries,
    load_canaries,
    make_canaries,
    save_canaries,
)
from hush_hf.secrets import SecretSet, tag_dataset, tagger_for


def test_space_size_prior_and_enumeration():
    space = CanarySpace()
    assert space.size == 10**6 and space.prior == 1e-6
    assert space.bits == pytest.approx(19.93, abs=5e-3)
    small = CanarySpace(template="key={secret}.", alphabet="ab", length=3)
    values = [small.value(i) for i in range(small.size)]
    assert values == ["aaa", "aab", "aba", "abb", "baa", "bab", "bba", "bbb"]
    assert [small.index(v) for v in values] == list(range(8))
    assert small.text("aba") == "key=aba."


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"template": "no placeholder"}, "exactly one"),
    ({"template": "{secret} and {secret}"}, "exactly one"),
    ({"template": "ID{secret}"}, "whole word"),
    ({"template": "{secret}x"}, "whole word"),
    ({"template": "{secret} {other}"}, "other format fields"),
    ({"alphabet": "1"}, "at least 2"),
    ({"alphabet": "112"}, "distinct"),
    ({"alphabet": "0-"}, "word characters"),
    ({"length": 0}, "length"),
])
def test_space_refuses_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CanarySpace(**kwargs)


def test_make_canaries_is_seeded_distinct_and_hides_values():
    first = make_canaries(20, repetitions=3, seed=7)
    again = make_canaries(20, repetitions=3, seed=7)
    other = make_canaries(20, repetitions=3, seed=8)
    assert [c.value for c in first] == [c.value for c in again] != [c.value for c in other]
    assert len({c.value for c in first}) == 20
    assert all(len(c.value) == 6 and c.value.isdigit() and c.repetitions == 3 for c in first)
    assert first[0].value not in repr(first[0]) and first[0].value not in str(first)
    with pytest.raises(ValueError, match="repetitions has 2 entries"):
        make_canaries(3, repetitions=[1, 2])
    with pytest.raises(ValueError, match="num_canaries"):
        make_canaries(0)
    with pytest.raises(ValueError, match="repetitions must be an integer"):
        Canary(0, "123456", -1)
    with pytest.raises(ValueError, match="not in this canary space"):
        Canary(0, "12345a", 1)


def test_insert_into_a_list_keeps_order_and_counts():
    data = [f"row {i}" for i in range(50)]
    canaries = make_canaries(3, repetitions=[4, 0, 2], seed=1)
    out, positions = insert_canaries(data, canaries, seed=2)
    assert len(out) == 56
    assert [t for t in out if t.startswith("row")] == data
    assert [len(p) for p in positions] == [4, 0, 2]
    for canary, rows in zip(canaries, positions, strict=True):
        assert all(out[r] == canary.text for r in rows)
        assert out.count(canary.text) == canary.repetitions
    again, _ = insert_canaries(data, canaries, seed=2)
    assert again == out


def test_insert_into_a_dataset_then_tag_as_secrets():
    dataset = datasets.Dataset.from_dict({"text": [f"plain text {i}" for i in range(30)],
                                          "label": list(range(30))})
    canaries = make_canaries(2, repetitions=[3, 1], seed=3)
    out, positions = insert_canaries(dataset, canaries, seed=4)
    assert len(out) == 34 and out.features == dataset.features
    assert [r for r in out["label"] if r is not None] == list(range(30))
    records = canary_secret_records(canaries, target_posterior=1e-3)
    assert records[0] == {"id": "hush-canary-0", "prior": 1e-6, "target": 1e-3, "terms": [canaries[0].value]}
    secrets = SecretSet.from_records(records)
    tagged = tag_dataset(out, tagger_for(secrets), num_secrets=len(secrets))
    for j, rows in enumerate(positions):
        assert sorted(i for i, ids in enumerate(tagged["secret_ids"]) if j in ids) == rows


def test_insert_refuses_bad_input():
    canaries = make_canaries(1, seed=0)
    with pytest.raises(ValueError, match="text_column='body'"):
        insert_canaries(datasets.Dataset.from_dict({"text": ["a"]}), canaries, text_column="body")
    with pytest.raises(ValueError, match="strings only"):
        insert_canaries(["a", 3], canaries)
    with pytest.raises(ValueError, match="at least one canary"):
        insert_canaries(["a"], [])


def test_save_and_load_round_trip(tmp_path):
    space = CanarySpace(template="PIN: {secret}", alphabet="0123456789", length=4)
    canaries = make_canaries(4, repetitions=[1, 2, 0, 5], space=space, seed=9)
    path = save_canaries(tmp_path / "canaries.json", canaries)
    assert json.loads(path.read_text())["space"]["template"] == "PIN: {secret}"
    loaded = load_canaries(path)
    assert [(c.index, c.value, c.repetitions, c.space) for c in loaded] == \
        [(c.index, c.value, c.repetitions, c.space) for c in canaries]
    (tmp_path / "bad.json").write_text(json.dumps({"canaries": []}))
    with pytest.raises(ValueError, match="not a canary file"):
        load_canaries(tmp_path / "bad.json")


def test_random_values_are_uniform_over_the_space():
    space = CanarySpace(template="x {secret}", alphabet="abcd", length=1)
    draws = space.random_values(40_000, np.random.default_rng(0))
    counts = np.array([draws.count(ch) for ch in "abcd"])
    assert np.all(np.abs(counts / 40_000 - 0.25) < 0.01)
