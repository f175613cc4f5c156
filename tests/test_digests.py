"""Per-row digests (hush_hf.digests): equal exactly when the values are equal, whatever the storage."""

from __future__ import annotations

import datasets
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hush_hf import digests
from hush_hf.digests import row_digests


def digests_of(values, type_=None, name="c", **kwargs):
    return row_digests([(name, pa.array(values, type=type_))], **kwargs)


def same_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.all(a == b, axis=1)


def canonical(value):
    """The values a digest must distinguish: bools are integers, nothing else is merged."""
    if isinstance(value, bool):
        return ("int", int(value))
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, list):
        return ("list", tuple(canonical(v) for v in value))
    return (type(value).__name__, value)


ints = st.integers(-(2**63), 2**63 - 1)
token_lists = st.lists(st.one_of(st.integers(0, 3), ints), max_size=5)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.one_of(st.none(), token_lists), min_size=2, max_size=12))
def test_list_of_int_digests_are_equal_exactly_when_the_rows_are(rows):
    d = digests_of(rows, pa.list_(pa.int64()))
    for i in range(len(rows)):
        for j in range(len(rows)):
            equal = canonical(rows[i]) == canonical(rows[j])
            assert bool(np.all(d[i] == d[j])) == equal, (rows[i], rows[j])


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.lists(st.one_of(st.none(), st.text(max_size=3)), max_size=4), min_size=2, max_size=10)
)
def test_list_of_string_digests_are_equal_exactly_when_the_rows_are(rows):
    d = digests_of(rows, pa.list_(pa.string()))
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert bool(np.all(d[i] == d[j])) == (rows[i] == rows[j]), (rows[i], rows[j])


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.lists(st.lists(st.integers(-300, 300), max_size=3), max_size=3), min_size=2, max_size=10)
)
def test_nested_list_digests_are_equal_exactly_when_the_rows_are(rows):
    d = digests_of(rows, pa.list_(pa.list_(pa.int32())))
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert bool(np.all(d[i] == d[j])) == (rows[i] == rows[j]), (rows[i], rows[j])


def test_boundaries_inside_a_row_are_part_of_it():
    pairs = [
        ([["ab", "c"]], [["a", "bc"]], pa.list_(pa.string())),
        ([[[1], [2, 3]]], [[[1, 2], [3]]], pa.list_(pa.list_(pa.int64()))),
        ([[]], [[0]], pa.list_(pa.int64())),
        ([None], [[]], pa.list_(pa.int64())),
        ([None], [0], pa.int64()),
        ([[256]], [[0, 1]], pa.list_(pa.int64())),  # 2 bytes either way, not the same width tag
        ([""], [None], pa.string()),
    ]
    for a, b, type_ in pairs:
        assert not same_rows(digests_of(a, type_), digests_of(b, type_)).any(), (a, b)


def test_storage_does_not_change_a_digest():
    ids = [[5, 70000, 3], [], [1, 2], [40000, 40000]]
    reference = digests_of(ids, pa.list_(pa.int64()))
    for type_ in (pa.list_(pa.int32()), pa.large_list(pa.int64()), pa.list_(pa.uint32())):
        np.testing.assert_array_equal(digests_of(ids, type_), reference)
    chunked = pa.chunked_array(
        [pa.array(ids[:1], pa.list_(pa.int32())), pa.array(ids[1:], pa.list_(pa.int32()))]
    )
    np.testing.assert_array_equal(row_digests([("c", chunked)]), reference)
    sliced = pa.array([[9]] + ids, pa.list_(pa.int64())).slice(1)  # an offset into the buffers
    np.testing.assert_array_equal(row_digests([("c", sliced)]), reference)
    text = ["a", "", "ünïcode", "x" * 100]
    np.testing.assert_array_equal(digests_of(text, pa.string()), digests_of(text, pa.large_string()))
    np.testing.assert_array_equal(digests_of([True, False]), digests_of([1, 0], pa.int8()))
    np.testing.assert_array_equal(digests_of([0.5, 1.0], pa.float32()), digests_of([0.5, 1.0], pa.float64()))
    assert not same_rows(digests_of([1.0]), digests_of([1])).any()  # a float is not an int
    labels = ["b", "a", "b", None]
    encoded = pa.array(labels).dictionary_encode()
    np.testing.assert_array_equal(row_digests([("c", encoded)]), digests_of(labels))


def test_a_row_digest_depends_on_its_row_only(monkeypatch):
    rng = np.random.default_rng(0)
    ids = [
        rng.integers(0, 2**40 if i == 3 else 100, size=int(rng.integers(0, 6))).tolist() for i in range(10)
    ]
    ids[5], ids[7] = None, [1, None, 2]  # nulls in other rows: no validity bytes in this one
    alone = np.concatenate([digests_of([row], pa.list_(pa.int64())) for row in ids])
    monkeypatch.setattr(digests, "BLOCK_ROWS", 3)  # rows 0-2, 3-5, ...: widths differ between blocks
    np.testing.assert_array_equal(digests_of(ids, pa.list_(pa.int64())), alone)
    sliced = pa.array([[7, None]] + ids, pa.list_(pa.int64())).slice(1)  # offsets into shared buffers
    np.testing.assert_array_equal(row_digests([("c", sliced)]), alone)


def test_names_key_and_column_order_are_part_of_the_digest():
    column = pa.array([[1, 2]])
    base = row_digests([("input_ids", column)])
    assert not same_rows(base, row_digests([("labels", column)])).any()
    assert not same_rows(base, row_digests([("input_ids", column)], key=b"k" * 32)).any()
    two = row_digests([("a", column), ("b", pa.array(["x"]))])
    assert not same_rows(two, row_digests([("b", pa.array(["x"])), ("a", column)])).any()
    assert row_digests([("input_ids", column)], size=8).shape == (1, 8)


def test_a_dataset_behind_an_index_mapping_digests_its_logical_rows():
    dataset = datasets.Dataset.from_dict(
        {"input_ids": [[i, i + 1] for i in range(20)], "text": list("abcdefghijklmnopqrst")}
    )
    shuffled = dataset.shuffle(seed=3)
    flat = datasets.Dataset.from_list(list(shuffled))  # the same rows, materialised in that order
    columns = ["input_ids", "text"]

    def of(ds):
        view = ds.with_format("arrow")
        return row_digests([(c, view[c]) for c in columns])

    np.testing.assert_array_equal(of(shuffled), of(flat))
    order = np.asarray(shuffled._indices.column(0))
    np.testing.assert_array_equal(of(shuffled), of(dataset)[order])


def test_struct_columns_and_bad_input():
    rows = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi"}]
    d = digests_of(rows)
    assert not same_rows(d[:1], d[1:]).any()
    reordered = pa.array([{"content": "hi", "role": "user"}])
    np.testing.assert_array_equal(row_digests([("c", reordered)]), d[:1])  # fields by name
    with pytest.raises(ValueError, match="different lengths"):
        row_digests([("a", pa.array([1])), ("b", pa.array([1, 2]))])
    with pytest.raises(ValueError, match="at least one column"):
        row_digests([])
