"""Secret / SecretSet: construction, validation messages that never show a name, files, repr."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hush_hf.secrets import Secret, SecretSet

NAME = "hunter2"  # stands for a secret string: it must never appear in a message or repr


def test_secret_fields_are_normalised():
    secret = Secret(NAME, 1e-10, 5e-4, terms=["a b", "c"], pattern=r"\d+")
    assert secret.prior == 1e-10 and isinstance(secret.prior, float)
    assert secret.target_posterior == 5e-4
    assert secret.terms == ("a b", "c")
    assert secret.pattern == r"\d+"


def test_secret_accepts_numpy_and_integer_numbers():
    secret = Secret(NAME, np.float64(0.25), np.float32(0.5))
    assert secret.prior == 0.25 and secret.target_posterior == 0.5
    with pytest.raises(ValueError, match="target_posterior=1.0 must be below 1"):
        Secret(NAME, 0.25, 1)


def test_repr_and_str_hide_name_terms_and_pattern():
    secret = Secret(NAME, 1e-10, 5e-4, terms=("swordfish",), pattern="opensesame")
    for text in (repr(secret), str(secret), f"{secret}", repr([secret]), repr(SecretSet([secret]))):
        assert NAME not in text and "swordfish" not in text and "opensesame" not in text
    assert repr(secret) == (
        "Secret(name=<hidden>, prior=1e-10, target_posterior=0.0005, terms=<1 hidden>, pattern=<hidden>)"
    )
    plain = "Secret(name=<hidden>, prior=0.1, target_posterior=0.2, terms=(), pattern=None)"
    assert repr(Secret(NAME, 0.1, 0.2)) == plain
    assert repr(SecretSet([secret])) == "SecretSet(1 secrets)"


OK = {"name": "fine", "prior": 0.1, "target": 0.2}


@pytest.mark.parametrize(
    ("prior", "target", "message"),
    [
        (0.0, 0.5, "secret #1: prior=0.0 must lie in the open interval (0, 1)"),
        (1.0, 0.5, "secret #1: prior=1.0 must lie in the open interval (0, 1)"),
        (-0.1, 0.5, "secret #1: prior=-0.1 must lie in the open interval (0, 1)"),
        (1.5, 0.5, "secret #1: prior=1.5 must lie in the open interval (0, 1)"),
        (math.nan, 0.5, "secret #1: prior=nan must be finite"),
        (math.inf, 0.5, "secret #1: prior=inf must be finite"),
        (0.7, 0.5, "secret #1: target_posterior=0.5 must exceed prior=0.7"),
        (0.5, 0.5, "secret #1: target_posterior=0.5 must exceed prior=0.5"),
        (0.5, 1.0, "secret #1: target_posterior=1.0 must be below 1"),
        (0.5, 1.5, "secret #1: target_posterior=1.5 must be below 1"),
        (0.5, math.nan, "secret #1: target_posterior=nan must be finite"),
        (0.5, -math.inf, "secret #1: target_posterior=-inf must be finite"),
        (True, 0.5, "secret #1: prior must be a real number, got a bool"),
        (0.1, None, "secret #1: target_posterior is empty"),
        (0.1, [0.2], "secret #1: target_posterior must be a real number, got a list"),
    ],
)
def test_every_validation_error_names_index_field_and_value_but_not_the_name(prior, target, message):
    with pytest.raises(ValueError) as info:
        SecretSet.from_records([OK, {"name": NAME, "prior": prior, "target": target}])
    assert str(info.value) == message
    assert NAME not in str(info.value)


def test_direct_secret_errors_have_no_index_and_no_name():
    with pytest.raises(ValueError, match=r"^target_posterior=0.5 must exceed prior=0.7$"):
        Secret(NAME, 0.7, 0.5)
    with pytest.raises(ValueError, match="name must be a non-empty string, got an empty string"):
        Secret("", 0.1, 0.2)
    with pytest.raises(ValueError, match="name must be a non-empty string, got a int"):
        Secret(7, 0.1, 0.2)


def test_empty_set_and_duplicate_names_are_refused():
    with pytest.raises(ValueError, match="at least one secret"):
        SecretSet([])
    with pytest.raises(ValueError, match="at least one secret"):
        SecretSet.from_records([])
    with pytest.raises(ValueError) as info:
        SecretSet.from_records([(NAME, 0.1, 0.2), ("other", 0.1, 0.2), (NAME, 0.2, 0.3)])
    assert str(info.value) == "secret #2: name duplicates the name of secret #0"


def test_terms_and_patterns_are_checked_without_showing_them():
    with pytest.raises(ValueError) as info:
        SecretSet.from_records([OK, {"name": NAME, "p": 0.1, "r": 0.2, "terms": ["ok", "?!"]}])
    assert str(info.value) == "secret #1: terms[1] contains no word characters, so it can never match"
    with pytest.raises(ValueError) as info:
        Secret(NAME, 0.1, 0.2, pattern="hunter[2")
    assert "not a valid regular expression" in str(info.value) and "hunter" not in str(info.value)
    with pytest.raises(ValueError, match="terms must be a list or tuple of strings, got a str"):
        Secret(NAME, 0.1, 0.2, terms="hunter2")
    with pytest.raises(ValueError, match=r"terms\[0\] must be a string, got a int"):
        Secret(NAME, 0.1, 0.2, terms=[3])


def test_from_records_accepts_every_documented_form():
    secrets = SecretSet.from_records(
        [
            {"id": "a", "p": "1e-10", "r": " 5e-4 "},
            {"name": "b", "prior": 0.1, "target_posterior": 0.3, "terms": "x; y z ;", "pattern": ""},
            {"name": 17, "prior": 0.1, "target": 0.4, "terms": ["q"], "pattern": r"k\d"},
            ("c", 0.2, 0.5),
            ("d", 0.2, 0.6, ["t"]),
            ("e", 0.2, 0.7, None, "e+"),
            Secret("f", 0.3, 0.8),
        ]
    )
    assert len(secrets) == 7
    assert [s.name for s in secrets] == ["a", "b", "17", "c", "d", "e", "f"]
    np.testing.assert_array_equal(secrets.priors, [1e-10, 0.1, 0.1, 0.2, 0.2, 0.2, 0.3])
    np.testing.assert_array_equal(secrets.targets, [5e-4, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    assert secrets[1].terms == ("x", "y z") and secrets[1].pattern is None
    assert secrets[2].terms == ("q",) and secrets[2].pattern == r"k\d"
    assert secrets[5].terms == () and secrets[5].pattern == "e+"
    assert secrets[-1] == Secret("f", 0.3, 0.8)
    assert [s.name for s in secrets[1:3]] == ["b", "17"]
    assert [s.name for s in secrets] == [s.name for s in iter(secrets)]
    with pytest.raises(ValueError, match="read-only"):
        secrets.priors[0] = 0.5


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"name": NAME, "prior": 0.1}, "secret #0: missing field 'target_posterior' (also accepted"),
        ({"id": NAME, "name": NAME, "p": 0.1, "r": 0.2}, "secret #0: give only one of the fields 'name'"),
        ({"name": NAME, "p": 0.1, "prior": 0.1, "r": 0.2}, "secret #0: give only one of the fields 'prior'"),
        ({"name": NAME, "p": "hunter2", "r": 0.2}, "secret #0: prior is not a number"),
        ({"name": NAME, "p": "", "r": 0.2}, "secret #0: prior is empty"),
        ({"name": NAME, "p": 0.1, "r": 0.2, NAME: 1}, "secret #0: 1 unrecognised field(s); accepted fields"),
        ((NAME, 0.1), "secret #0: a tuple record is (name, prior, target_posterior[, terms[, pattern]])"),
        (NAME, "secret #0: a record must be a Secret, a mapping or a tuple, got a str"),
        ({"name": 1.5, "p": 0.1, "r": 0.2}, "secret #0: name must be a string, got a float"),
    ],
)
def test_record_errors_never_echo_names_keys_or_text(record, message):
    with pytest.raises(ValueError) as info:
        SecretSet.from_records([record])
    assert str(info.value).startswith(message)
    assert NAME not in str(info.value)


def test_records_must_be_an_iterable_of_records():
    with pytest.raises(ValueError, match="got a single dict"):
        SecretSet.from_records({"name": "a", "p": 0.1, "r": 0.2})
    with pytest.raises(ValueError, match=r"^secret #0: expected a Secret, got a dict \(use SecretSet"):
        SecretSet([{"name": "a", "p": 0.1, "r": 0.2}])


def _expected():
    return SecretSet(
        [
            Secret("alpha", 1e-10, 2.5e-4, terms=("al pha", "alf")),
            Secret("beta", 0.01, 0.125, pattern=r"b\d{3}"),
            Secret("gamma", 1e-6, 1e-3),
        ]
    )


def test_json_list_object_and_jsonl(tmp_path):
    records = [
        {"name": "alpha", "p": 1e-10, "r": 2.5e-4, "terms": ["al pha", "alf"]},
        {"id": "beta", "prior": 0.01, "target": 0.125, "pattern": r"b\d{3}"},
        {"name": "gamma", "prior": 1e-6, "target_posterior": 1e-3},
    ]
    (tmp_path / "list.json").write_text(json.dumps(records))
    (tmp_path / "object.json").write_text(json.dumps({"secrets": records}))
    (tmp_path / "lines.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    for name in ("list.json", "object.json", "lines.jsonl"):
        assert SecretSet.load(tmp_path / name) == _expected()
    assert SecretSet.from_json(tmp_path / "object.json") == _expected()
    assert SecretSet.from_jsonl(tmp_path / "lines.jsonl") == _expected()


def test_csv_with_bom_semicolon_terms_and_empty_cells(tmp_path):
    path = tmp_path / "secrets.csv"
    path.write_text(
        "\ufeffid,p,r,terms,pattern\n"
        'alpha,1e-10,2.5e-4,"al pha; alf",\n'
        "beta,0.01,0.125,,b\\d{3}\n"
        "gamma,1e-6,1e-3,@id,\n",
        encoding="utf-8",
    )
    assert SecretSet.from_csv(path) == _expected()
    assert SecretSet.load(path) == _expected()


def test_csv_without_header_does_not_leak_the_first_row(tmp_path):
    path = tmp_path / "noheader.csv"
    path.write_text(f"{NAME},0.1,0.2\nother,0.1,0.2\n")
    with pytest.raises(ValueError) as info:
        SecretSet.from_csv(path)
    assert "unrecognised field" in str(info.value) and NAME not in str(info.value)


def test_bad_files_are_reported_without_contents(tmp_path):
    (tmp_path / "keys.json").write_text(json.dumps({NAME: {"p": 0.1, "r": 0.2}}))
    with pytest.raises(ValueError) as info:
        SecretSet.from_json(tmp_path / "keys.json")
    assert "exactly one key 'secrets', found 1 key(s)" in str(info.value) and NAME not in str(info.value)
    (tmp_path / "broken.jsonl").write_text('{"name": "a", "p": 0.1, "r": 0.2}\n{"name": "hunter2"\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON") as info:
        SecretSet.from_jsonl(tmp_path / "broken.jsonl")
    assert NAME not in str(info.value)
    (tmp_path / "nan.json").write_text('[{"name": "hunter2", "p": NaN, "r": 0.2}]')
    with pytest.raises(ValueError, match=r"^secret #0: prior=nan must be finite$"):
        SecretSet.from_json(tmp_path / "nan.json")
    with pytest.raises(ValueError, match=r"suffix '\.yaml' is not supported; use one of \.json, \.jsonl"):
        SecretSet.load(tmp_path / "secrets.yaml")


def test_to_json_round_trips_exactly(tmp_path):
    secrets = SecretSet(
        [
            Secret("ünï code", 1e-10, 0.1 + 0.2, terms=("a", "b c")),
            Secret("p", 1 / 3, 2 / 3, pattern=r"\bp\b"),
        ]
    )
    path = tmp_path / "out.json"
    secrets.to_json(path)
    assert SecretSet.from_json(path) == secrets
    assert SecretSet.from_json(path).targets[0] == 0.1 + 0.2
    assert json.loads(path.read_text(encoding="utf-8"))["secrets"][0]["name"] == "ünï code"
