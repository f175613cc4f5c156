"""hush_hf.jsonfile: duplicate keys found with their line, no false alarm on any valid JSON."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hush_hf.jsonfile import first_duplicate_key, loads_json

TRICKY = st.text(alphabet='ab:{}[]",\\\n \u00e9', max_size=6)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(VALUES, st.sampled_from([None, 0, 2]))
def test_no_duplicate_is_found_in_json_that_has_none(value, indent):
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    assert first_duplicate_key(text) is None
    assert loads_json(text, source="x") == value


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.dictionaries(TRICKY, VALUES, min_size=1, max_size=4), VALUES, st.sampled_from([None, 2]))
def test_a_key_repeated_in_one_object_is_found_at_its_second_occurrence(obj, value, indent):
    """The duplicate is appended as the object's last member; the expected offset is computed from the
    serialised pieces (not by the scanner under test)."""
    key = next(iter(obj))
    inner = json.dumps(obj, indent=indent, ensure_ascii=False)
    at = len('{"outer": [') + len(inner) - 1  # the inner object's closing brace
    text = '{"outer": [' + inner[:-1] + ", " + json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value)
    text += "}]}"
    assert first_duplicate_key(text) == (key, at + 2)
    with pytest.raises(ValueError) as info:
        loads_json(text, source="f", shown_keys=(key,))
    line = text.count("\n", 0, at + 2) + 1
    assert str(info.value).startswith(f"f: line {line}: one object has the field {key!r} twice")
    with pytest.raises(ValueError, match=r"the field \(name not shown: it may be secret\) twice"):
        loads_json(text, source="f")


def test_the_same_key_in_different_objects_is_no_duplicate():
    text = '{"a": {"a": 1, "b": {"a": 2}}, "b": [{"a": 3}, {"a": 4}], "c": "\\"a\\": 5"}'
    assert first_duplicate_key(text) is None
    assert first_duplicate_key('{"a": {"x": 1, "x": 2}}') == ("x", 15)
