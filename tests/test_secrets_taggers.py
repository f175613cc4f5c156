"""Word tokenisation and taggers: whole words, phrases, case, regex, callables, unions."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hush_hf.secrets import (
    CallableTagger,
    RegexTagger,
    Secret,
    SecretSet,
    TermTagger,
    UnionTagger,
    tagger_for,
    words,
)

# -- words ----------------------------------------------------------------------------------------


def test_words_are_unicode_word_runs_case_folded_and_nfkc_normalised():
    assert words("The cat's catalog: cat_food, 42x!") == ["the", "cat", "s", "catalog", "cat_food", "42x"]
    assert words("Straße STRASSE") == ["strasse", "strasse"]  # casefold, not just lower()
    assert words("ﬁnance ＡＢＣ") == ["finance", "abc"]  # NFKC: ligature, full-width letters
    assert words("Ça va, Ελλάδα?") == ["ca", "va", "ελλαδα"]  # accents stripped (as BERT-uncased does)
    assert words("Mixed Case", case_sensitive=True) == ["Mixed", "Case"]
    assert words(" ,;!? ") == []


def test_words_strip_accents_and_format_characters_like_an_uncased_tokenizer():
    # BERT-uncased sees "jose" and "password" in all of these: the tagger must too (else: untagged).
    assert words("José JOSÉ Jose Jose\u0301") == ["jose"] * 4  # precomposed, upper, bare, combining
    assert words("pass\u00adword pass\u200bword \ufeffpassword") == ["password"] * 3  # soft hyphen, ZWSP, BOM
    assert words("İstanbul") == ["istanbul"]  # casefold gives i + U+0307, a combining mark
    assert words("José pass\u00adword", case_sensitive=True) == ["José", "pass", "word"]  # as written
    tagger = TermTagger({0: ["Jose"], 1: ["José"], 2: ["password"], 3: ["pass\u00adword"]})
    assert tagger("Signed: José.") == {0, 1}
    assert tagger("Signed: JOSE.") == {0, 1}
    assert tagger("the pass\u00adword is") == {2, 3}
    assert tagger("the password is") == {2, 3}


@settings(max_examples=300, deadline=None)
@given(st.text(), st.booleans())
def test_every_word_tokenises_to_itself(text, case_sensitive):
    # Selection names secrets by words and tags by words(name): this must give the word back.
    for word in words(text, case_sensitive=case_sensitive):
        assert words(word, case_sensitive=case_sensitive) == [word]


# -- TermTagger -----------------------------------------------------------------------------------


def test_single_word_terms_match_whole_words_however_spelled_never_inside_a_word():
    tagger = TermTagger({0: ["cat"]})
    for text in ("a cat.", "Cat!", "CAT", "(cat)", "the cat's toy", "dog-cat", "cat_food", "cats", "CatFood"):
        assert tagger(text) == {0}, text
    for text in ("c a t", "c.a.t", "C-A-T", "ca t"):  # the letters of whole words spell it
        assert tagger(text) == {0}, text
    for text in ("catalog", "concat", "Catalog", "public attributes", "scat", "ca tering", ""):
        assert tagger(text) == set(), text


def test_case_sensitive_option():
    insensitive = TermTagger({0: ["Paris"]})
    sensitive = TermTagger({0: ["Paris"]}, case_sensitive=True)
    assert insensitive("paris PARIS") == {0}
    assert sensitive("paris PARIS") == set()
    assert sensitive("in Paris.") == {0}


def test_phrases_match_whole_word_sequences():
    tagger = TermTagger({0: ["new york"], 1: ["new york city"], 2: ["york"], 3: ["new jersey"]})
    assert tagger("I love New-York City") == {0, 1, 2}
    assert tagger("new, york") == {0, 2}
    assert tagger("a new yorker") == set()
    assert tagger("york new") == {2}
    assert tagger("new new york") == {0, 2}  # the phrase may start at any occurrence of its first word
    assert tagger("New Jersey and new york") == {0, 2, 3}
    assert tagger("new") == set()


def test_several_secrets_per_example_and_shared_terms():
    tagger = TermTagger({0: ["alpha", "beta gamma"], 1: ["beta"], 2: ["alpha"], 5: ["delta"]})
    assert tagger("Alpha then beta gamma then delta") == {0, 1, 2, 5}
    assert tagger("beta") == {1}
    assert tagger.secret_indices == frozenset({0, 1, 2, 5})


# Agreement with a brute-force reference of the spelling rule: tests/test_secrets_spelling.py.


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["cat", "ca", "at", "cat dog", "x y"]),
    st.text(alphabet="catdogxy4_ .,-C&%\n", max_size=24),
)
def test_spans_are_original_offsets_that_tag_alone(term, text):
    # Every span is a slice of the original text that, on its own, contains the secret again.
    tagger = TermTagger({0: [term]})
    for start, end, secret in tagger.spans(text):
        assert 0 <= start < end <= len(text) and secret == 0
        assert tagger(text[start:end]) == {0}, (text, start, end)


def test_term_tagger_scales_to_many_terms():
    # 100k one-word terms: building and tagging stay dict lookups (no alternation regex).
    tagger = TermTagger({j: [f"w{j}"] for j in range(100_000)})
    assert tagger("w5 and W99999, not w100000 or xw7") == {5, 99_999}


@pytest.mark.parametrize(
    ("terms", "message"),
    [
        ({0: "hunter2"}, "TermTagger: terms of secret #0 must be a list of strings, got a str"),
        ({0: []}, "TermTagger: secret #0 has no terms"),
        ({3: ["ok", "..."]}, "TermTagger: term 1 of secret #3 contains no word characters"),
        ({0: [7]}, "TermTagger: term 0 of secret #0 must be a string, got a int"),
        ({-1: ["x"]}, "TermTagger: secret index must be a non-negative integer, got -1"),
        ({"hunter2": ["x"]}, "TermTagger: secret index must be a non-negative integer, got a str"),
        (["hunter2"], "TermTagger: terms must be a mapping secret index -> terms, got a list"),
    ],
)
def test_term_tagger_errors_never_show_terms(terms, message):
    with pytest.raises(ValueError) as info:
        TermTagger(terms)
    assert str(info.value) == message


# -- RegexTagger, CallableTagger, UnionTagger ----------------------------------------------------


def test_regex_tagger():
    tagger = RegexTagger({0: r"\bAKIA[0-9A-Z]{4}\b", 1: re.compile(r"\d{3}-\d{4}"), 4: "key"})
    assert tagger("id AKIA12AB and 555-1234") == {0, 1}
    assert tagger("akia12ab keychain") == {4}
    assert RegexTagger({0: "akia"}, flags=re.IGNORECASE)("AKIA") == {0}
    assert RegexTagger({0: re.compile("akia", re.IGNORECASE)})("AKIA") == {0}
    assert tagger.secret_indices == frozenset({0, 1, 4})
    with pytest.raises(ValueError) as info:
        RegexTagger({2: "hunter2("})
    assert str(info.value).startswith("RegexTagger: pattern of secret #2 is not a valid regular expression")
    assert "hunter2" not in str(info.value)


def test_callable_tagger_checks_ids_without_showing_them():
    assert CallableTagger(lambda text: [2, 0, 2] if "x" in text else [])("axb") == {0, 2}
    assert CallableTagger(lambda text: ())("x") == set()
    with pytest.raises(ValueError, match="got -3"):
        CallableTagger(lambda text: [-3])("x")
    with pytest.raises(ValueError) as info:
        CallableTagger(lambda text: ["hunter2"])("x")
    assert str(info.value) == "CallableTagger: secret index must be a non-negative integer, got a str"
    with pytest.raises(ValueError, match="fn must return an iterable of secret indices, got a str"):
        CallableTagger(lambda text: "hunter2")("x")
    with pytest.raises(ValueError, match="fn must be callable"):
        CallableTagger("hunter2")
    assert CallableTagger(lambda text: []).secret_indices is None


def test_union_tagger_unions_and_flattens():
    terms = TermTagger({0: ["cat"]})
    regex = RegexTagger({1: r"\d+"})
    bang = CallableTagger(lambda text: {2} if "!" in text else ())
    union = UnionTagger([terms, UnionTagger([regex, bang])])
    assert len(union.taggers) == 3
    assert union("cat 12!") == {0, 1, 2}
    assert union("dog") == set()
    assert union.secret_indices is None
    assert UnionTagger([terms, regex]).secret_indices == frozenset({0, 1})
    with pytest.raises(ValueError, match="tagger 1 must be a Tagger"):
        UnionTagger([terms, lambda text: [0]])
    with pytest.raises(ValueError, match="at least one tagger"):
        UnionTagger([])


# -- tagger_for -----------------------------------------------------------------------------------


def _secret_set() -> SecretSet:
    return SecretSet(
        [
            Secret("Zurich", 1e-6, 1e-3),  # no terms or pattern: the name is the term
            Secret("project-x", 1e-6, 1e-3, terms=("Project X", "px")),  # terms replace the name
            Secret("card", 1e-6, 1e-3, pattern=r"card\d{4}"),  # pattern only: the name is not a term
            Secret("both", 1e-6, 1e-3, terms=("Both",), pattern=r"B0TH"),
        ]
    )


def test_tagger_for_uses_terms_name_and_pattern():
    tagger = tagger_for(_secret_set())
    assert tagger("in zurich, about project x") == {0, 1}
    assert tagger("project-x stays secret") == {1}  # "project-x" is the phrase "project x"
    assert tagger("my card card1234") == {2}
    assert tagger("both") == {3} and tagger("b0th") == {3}
    assert tagger("PX and CARD9999") == {1, 2}  # case_sensitive=False also applies to patterns
    assert tagger.secret_indices == frozenset(range(4))


def test_tagger_for_case_sensitive():
    tagger = tagger_for(_secret_set(), case_sensitive=True)
    assert tagger("zurich CARD1234 Project X b0th") == {1}
    assert tagger("Zurich card1234 B0TH") == {0, 2, 3}


def test_tagger_for_refuses_a_name_that_can_never_match():
    # Refused where it enters, when the secret is made (it used to get as far as tagger_for).
    with pytest.raises(ValueError, match="name is the secret's only term .* contains no word characters"):
        Secret("?!", 0.1, 0.2)
    assert tagger_for(SecretSet([Secret("?!", 0.1, 0.2, terms=("ok",))]))("ok") == {0}
    with pytest.raises(ValueError, match="secret_set must be a SecretSet"):
        tagger_for([Secret("ok", 0.1, 0.2)])


def test_tagger_repr_shows_counts_only():
    assert repr(TermTagger({0: ["hunter2"], 1: ["x"]})) == "TermTagger(2 secrets)"
    assert repr(CallableTagger(lambda text: ())) == "CallableTagger(? secrets)"
