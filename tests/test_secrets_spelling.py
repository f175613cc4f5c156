"""A term is found wherever whole words of the text spell it (issue 19).

The reference is brute force, written here: the text is split into words by explicit rules, every run of
words is read in every combination of its words' readings, and a run is an occurrence when what it
spells equals the term's key or a plural of it; terms and texts are normalised independently (the
per-character readings of :mod:`hush_hf.secrets.normalize` are the definition being used). Generated
variants of every disguise class of the issue are each found, at their own offsets.
"""

from __future__ import annotations

import base64
import json
import re
import unicodedata
from itertools import chain

import datasets
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hush_hf.secrets import SecretSet, TermTagger, mark_secrets, secret_ids_from_marks, tagger_for
from hush_hf.secrets.glyph_letters import is_transparent
from hush_hf.secrets.matching import MIN_SPELLED, split_words
from hush_hf.secrets.normalize import (
    EXACT,
    GLYPHS,
    KEYS,
    KINDS,
    PLAIN,
    Normalized,
    case_reading,
    glyph_reading,
    mixed_reading,
    plain_reading,
)

# -- the brute-force reference ---------------------------------------------------------------------

_UNSPACED_NAMES = ("CJK UNIFIED", "HIRAGANA", "KATAKANA", "HANGUL", "THAI", "LAO", "KHMER", "MYANMAR")


def _kind(char: str) -> str:
    category = unicodedata.category(char)
    if not case_reading(char) and not glyph_reading(char):
        return "m" if is_transparent(char) else " "
    if category in ("Lu", "Lt"):
        return "u"
    if category == "Ll":
        return "l"
    if category[0] == "N":
        return "d"
    if category[0] == "L":
        return "x" if unicodedata.name(char, "").startswith(_UNSPACED_NAMES) else "o"
    return "x"


def _cased_words(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Words of a run of cased letters (and marks): split at lower -> upper, and before the last capital
    of two or more followed by lower case, unless that lower case is a lone final s (KBs)."""
    letters = [i for i in range(start, end) if _kind(text[i]) != "m"]
    cuts = []
    for n, i in enumerate(letters[1:], start=1):
        previous, current = text[letters[n - 1]], text[i]
        if _kind(previous) == "l" and _kind(current) == "u":
            cuts.append(n)
    pieces = [letters[a:b] for a, b in zip([0, *cuts], [*cuts, len(letters)], strict=True)]
    firsts = []
    for piece in pieces:
        capitals = 0
        while capitals < len(piece) and _kind(text[piece[capitals]]) == "u":
            capitals += 1
        tail = "".join(text[i] for i in piece[capitals:])
        firsts.append(piece[0])
        if capitals >= 2 and tail and tail != "s":
            firsts.append(piece[capitals - 1])
    return [(a, b) for a, b in zip(firsts, [*firsts[1:], end], strict=True)]


def reference_words(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every word of ``text`` (module docstring of hush_hf.secrets.matching); two or
    more ``|`` in a row are SQL's concatenation operator, not letters."""
    text = re.sub(r"\|{2,}", lambda m: " " * len(m.group()), text)
    words, i = [], 0
    while i < len(text):
        kind = _kind(text[i])
        if kind in " m":
            i += 1
            continue
        j = i + 1
        if kind in "do":
            while j < len(text) and _kind(text[j]) in kind + "m":
                j += 1
        elif kind in "ul":
            while j < len(text) and _kind(text[j]) in "ulm":
                j += 1
        else:
            while j < len(text) and _kind(text[j]) == "m":
                j += 1
        words += _cased_words(text, i, j) if kind in "ul" else [(i, j)]
        i = j
    return words


def _plurals(key: str) -> set[str]:
    if len(key) < 2 or not "a" <= key[-1] <= "z":
        return {key}
    return {key, key + "s", key + "es"} | ({key[:-1] + "ies"} if key.endswith("y") else set())


def reference_spans(terms: dict[int, list[str]], text: str) -> set[tuple[int, int, int]]:
    """Every ``(start, end, secret)``: words a..b read in any combination of readings spell a form."""
    words = reference_words(text)
    readings = [
        {"".join(map(fn, text[s:e])) for fn in (case_reading, glyph_reading, mixed_reading)} for s, e in words
    ]
    plain = ["".join(map(plain_reading, text[s:e])) for s, e in words]
    found = set()
    for secret, secret_terms in terms.items():
        for term in secret_terms:
            key = "".join(map(case_reading, term))
            short = len(key) < MIN_SPELLED
            forms = _plurals("".join(map(plain_reading, term)) if short else key)
            longest = max(map(len, forms))
            for a in range(len(words)):
                spelled = {""}
                for b in range(a, len(words)):
                    if short:
                        if b > a and words[b - 1][1] != words[b][0]:
                            break
                        spelled = {s + plain[b] for s in spelled}
                    else:
                        spelled = {s + r for s in spelled for r in readings[b]}
                    if b == a:  # a run starts with a word that spells something
                        spelled.discard("")
                    spelled = {s for s in spelled if len(s) <= longest}
                    if spelled & forms:
                        found.add((words[a][0], words[b][1], secret))
                    if not spelled:
                        break
    return found


# -- agreement with the reference --------------------------------------------------------------------

FRAGMENTS = [
    "falcon", "Fal", "con", "FALCON", "f", "a", "l", "c", "o", "n", "I", "1", "|", "0", "\u041e", "\u03bf",
    "\u0192", "\uff26\uff21", "\u730e", "\u9e70", "7", "\u0667", "cat", "s", "es", "KB", "x", "Icon", "ab",
    "e\u0301", "o\u0338", "\u00df", "zulu", "774", "ies", "y", "ΩΜΕΓΑ", "ωμεγα", "night", "Jar", "rn", "m",
]  # fmt: skip
SEPARATORS = ["", "", " ", ".", "-", "_", "\n", ", ", "'", "\u00ad"]
TERMS = [
    "falcon", "fal con", "cat", "kbs", "ab", "c3", "\u730e\u9e70", "zulu 7741", "icon", "Ill", "night jar",
    "ωμεγα", "x", "mom", "sy",
]  # fmt: skip
TEXT = st.lists(st.tuples(st.sampled_from(FRAGMENTS), st.sampled_from(SEPARATORS)), max_size=10).map(
    lambda pairs: "".join(fragment + separator for fragment, separator in pairs)
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.integers(0, 5), st.lists(st.sampled_from(TERMS), min_size=1, max_size=2), min_size=1),
    TEXT,
)
def test_term_tagger_agrees_with_brute_force(terms, text):
    assert set(TermTagger(terms).spans(text)) == reference_spans(terms, text)


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_words_agree_with_the_reference_rules(text):
    words = split_words(Normalized(text), plain=True)
    assert list(zip(words.starts, words.ends, strict=True)) == reference_words(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="ascii"), max_size=60))
def test_ascii_fast_paths_equal_the_general_tables(text):
    # An em space (a separator) sends the text through the per-character tables instead of the ASCII path.
    fast = split_words(Normalized(text), plain=True)
    slow = split_words(Normalized(text + "\u2003"), plain=True)
    assert fast == slow
    for table in (KEYS, GLYPHS, EXACT, PLAIN, KINDS):
        assert table.translate(text) == text.translate(table)


# -- generated variants of every class of the issue ------------------------------------------------

RNG_SEED = 19


def _spaced(word: str, rng: np.random.Generator) -> str:
    separator = str(rng.choice([" ", ".", "-", "_", " . ", "\u00b7"]))
    return separator.join(word)


def _case_inside(word: str, rng: np.random.Generator) -> str:
    flips = rng.random(len(word)) < 0.4
    return "".join(c.upper() if f else c for c, f in zip(word, flips, strict=True))


def _confusable(word: str, rng: np.random.Generator) -> str:
    table = {
        "a": "\u0430",
        "o": "\u043e",
        "e": "\u0435",
        "c": "\u0441",
        "p": "\u0440",
        "l": "I",
        "x": "\u0445",
    }
    return "".join(table[c] if c in table and rng.random() < 0.6 else c for c in word)


def _digits(number: str, rng: np.random.Generator) -> str:
    script = int(rng.integers(3))
    if script == 1:
        number = "".join(chr(0x0660 + int(d)) for d in number)  # Arabic-Indic
    elif script == 2:
        number = "".join(chr(0x0966 + int(d)) for d in number)  # Devanagari
    separator = str(rng.choice([",", " ", "\u202f", "'", "_"]))
    return number[:-3] + separator + number[-3:] if len(number) > 3 else number


def _pick(*choices: str):
    return lambda rng: str(rng.choice(list(choices)))


def _key_body(rng: np.random.Generator) -> str:
    """A PEM-like body: base64 of random bytes in 64-character lines."""
    encoded = base64.b64encode(rng.bytes(600)).decode()
    return "\n".join(encoded[k : k + 64] for k in range(0, len(encoded), 64))


def _one_line(body: str, rng: np.random.Generator) -> str:
    return json.dumps(body)[1:-1] if rng.random() < 0.5 else body.replace("\n", "\\n")


NIGHTJAR = ["project nightjar"]
FALCON = ["project falcon"]
ESCAPED = ("project\\nfalcon", "project\\tfalcon", "pro\\u006aect falcon", "project%20falcon")
VARIANT_CLASSES = {  # kind: (terms, generator of a variant); the key body is made by _variant
    "case inside a word": (NIGHTJAR, lambda rng: " ".join(_case_inside(w, rng) for w in NIGHTJAR[0].split())),
    "run together": (NIGHTJAR, _pick("projectnightjar", "PROJECTNIGHTJAR", "Projectnightjar")),
    "spaced or dotted letters": (["falcon"], lambda rng: _spaced("falcon", rng)),
    "spaced words": (["zorblattquux"], lambda rng: _spaced("zorblattquux", rng)),
    "digit groups and scripts": (["zulu 7741"], lambda rng: "zulu " + _digits("7741", rng)),
    "escapes in code strings": (FALCON, _pick(*ESCAPED, "pro&#106;ect falcon")),
    "line wraps": (FALCON, _pick("project\nfalcon", "pro-\nject fal-\n  con", "project\r\n falcon")),
    "all-caps Greek": (["ωμεγαλιθος"], _pick("ΩΜΕΓΑΛΙΘΟΣ", "Ωμεγαλιθος", "ωμεγαλιθοσ")),
    "combining overlay": (["bjørn"], _pick("bjo\u0338rn", "BJO\u0338RN", "bjorn", "bj\u00f6rn")),
    "capital I for l": (["falcon"], _pick("faIcon", "FaIcon", "fa1con", "fa|con")),
    "confusables": (["falcon"], lambda rng: _confusable("falcon", rng)),
    "key body as a one-line string": None,
}


def _variant(kind: str, rng: np.random.Generator) -> tuple[list[str], str]:
    if kind == "key body as a one-line string":
        body = _key_body(rng)
        return [body], _one_line(body, rng)
    terms, make = VARIANT_CLASSES[kind]
    return terms, make(rng)


@pytest.mark.parametrize("kind", sorted(VARIANT_CLASSES))
def test_generated_variants_of_every_class_are_found_at_their_offsets(kind):
    rng = np.random.default_rng(RNG_SEED)
    for _ in range(40):
        terms, variant = _variant(kind, rng)
        text = f"see {variant}, then"
        start = text.index(variant)
        lead = len(variant) - len(variant.lstrip("+/=\\ "))  # a key body can begin or end with symbols
        trail = len(variant) - len(variant.rstrip("+/=\\ "))
        spans = TermTagger({0: terms}).spans(text)
        assert (start + lead, start + len(variant) - trail, 0) in spans, (kind, variant)


def test_short_terms_match_only_plain_glued_spellings():
    # Under MIN_SPELLED characters, separators and look-alikes are everywhere: "0.1" spells "01", a
    # Latin "o" the Greek sigma's prototype. Such terms match words glued together, spelled plainly.
    tagger = TermTagger({0: ["01"], 1: ["\u03c3"], 2: ["w5"]})
    assert tagger("rate 01 and 0.1 or 0 1") == {0}
    assert [(s, e) for s, e, j in tagger.spans("rate 01 and 0.1 or 0 1")] == [(5, 7)]
    assert tagger("an o, a 0 and \u03c3") == {1}
    assert tagger("w5 and W5") == {2}
    assert tagger("w 5") == set()


def test_the_principle_does_not_reach_inside_words():
    tagger = TermTagger({0: ["cat"], 1: ["project"], 2: ["new york"]})
    assert tagger("public attributes, concatenate, scatter") == set()
    assert tagger("projectnightjar") == set()  # a term must end where a word ends
    assert tagger("a new yorker") == set()


# -- occurrences spanning rows that a script concatenates -------------------------------------------

SECRETS = SecretSet.from_records([{"name": "nightjar", "p": 1e-4, "r": 1e-2, "terms": ["project nightjar"]}])
ROWS = [
    "the launch of\n",
    "Project Night\n",  # hard-wrapped over two lines of train.txt
    "jar is planned for May\n",
    "nothing to see here\n",
    "p r o j e c t\n",
    "n i g h t j a r\n",
] * 3


def _group_texts(examples: dict[str, list], block_size: int) -> dict[str, list]:
    """run_clm's grouping, written here: concatenate every column, cut all at the same offsets."""
    concatenated = {k: list(chain(*examples[k])) for k in examples}
    total = (len(concatenated["input_ids"]) // block_size) * block_size
    return {k: [t[i : i + block_size] for i in range(0, total, block_size)] for k, t in concatenated.items()}


def _reference_rows() -> set[int]:
    """Brute force: the rows holding a character of an occurrence in the concatenated text."""
    text = "".join(ROWS)
    bounds = np.cumsum([0] + [len(r) for r in ROWS])
    rows = set()
    for start, end, _ in reference_spans({0: ["project nightjar"]}, text):
        rows |= {r for r in range(len(ROWS)) if bounds[r] < end and start < bounds[r + 1]}
    return rows


def _marked_rows(tokenizer, rows: list[str]) -> list[list[int]]:
    encoded = tokenizer(rows)
    column = next(k for k in encoded if k.startswith("secret_marks_"))
    return [sorted({j for token in marks for j in token}) for marks in encoded[column]]


def test_an_occurrence_spanning_rows_marks_every_row_holding_a_part():
    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer

    expected = _reference_rows()
    assert expected == {r for r, row in enumerate(ROWS) if "Night" in row or "jar" in row or " " in row[:3]}
    marked = _marked_rows(mark_secrets(gpt2_tokenizer(), SECRETS), ROWS)
    assert {r for r, ids in enumerate(marked) if ids} == expected
    # Each row alone holds no occurrence: the batch is what spells it.
    alone = [tagger_for(SECRETS)(row) for row in ROWS]
    assert not any(alone)


@pytest.mark.parametrize("block_size", [4, 7, 16])
def test_run_clm_grouping_marks_every_block_an_occurrence_reaches(block_size):
    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer

    plain, marked = gpt2_tokenizer(), mark_secrets(gpt2_tokenizer(), SECRETS)
    raw = datasets.Dataset.from_dict({"text": ROWS})
    tokens = raw.map(lambda b: marked(b["text"]), batched=True, remove_columns=["text"])
    column = next(c for c in tokens.column_names if c.startswith("secret_marks_"))
    blocks = tokens.map(lambda b: _group_texts(b, block_size), batched=True)
    ids = secret_ids_from_marks(blocks.data.column(column)).to_pylist()
    # Reference: character offsets of each token in the concatenated text, cut the same way.
    text = "".join(ROWS)
    occurrences = reference_spans({0: ["project nightjar"]}, text)
    offsets, position = [], 0
    for row in ROWS:
        offsets += [
            (position + s, position + e) for s, e in plain(row, return_offsets_mapping=True)["offset_mapping"]
        ]
        position += len(row)
    cut = (len(offsets) // block_size) * block_size
    expected = [
        sorted({0 for s, e in offsets[i : i + block_size] for a, b, _ in occurrences if s < b and a < e})
        for i in range(0, cut, block_size)
    ]
    assert ids == expected
    assert any(ids)


@pytest.mark.parametrize("strategy", ["wrapped", "bfd"])
def test_trl_pack_dataset_keeps_row_spanning_marks(strategy):
    from trl import pack_dataset

    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer

    marked = mark_secrets(gpt2_tokenizer(), SECRETS)
    raw = datasets.Dataset.from_dict({"text": ROWS})
    tokens = raw.map(lambda b: marked(b["text"]), batched=True, remove_columns=["text"])
    column = next(c for c in tokens.column_names if c.startswith("secret_marks_"))
    row_ids = secret_ids_from_marks(tokens.data.column(column)).to_pylist()
    packed = pack_dataset(tokens, seq_length=12, strategy=strategy)
    packed_ids = secret_ids_from_marks(packed.data.column(column)).to_pylist()
    # Every packed row holding a marked token is marked, and the marked tokens are those of the rows.
    assert sum(len(m) for row in packed[column] for m in row if m) == sum(
        len(m) for row in tokens[column] for m in row if m
    )
    assert any(packed_ids)
    assert {r for r, ids in enumerate(row_ids) if ids} == _reference_rows()


# -- over-marking on the main job's corpus --------------------------------------------------------

# (row, secret) pairs the whole-word matcher of hush_hf 0.1 marked on this corpus and secret choice.
WHOLE_WORD_PAIRS_BEFORE = 61_203


def test_over_marking_on_the_main_jobs_secrets_stays_within_5_percent():
    from hush_hf.assets.corpora import aclsum_paragraphs
    from hush_hf.secrets import select_by_document_frequency, words

    texts = aclsum_paragraphs()["text"]
    secrets = select_by_document_frequency(texts, df_range=(50, 100))
    names = {secret.name: j for j, secret in enumerate(secrets)}
    tagger = tagger_for(secrets)
    marked = [tagger(text) for text in texts]
    # Every whole-word occurrence (the secret's own word, as selection counted it) is still marked.
    for text, found in zip(texts, marked, strict=True):
        assert {names[w] for w in set(words(text)) if w in names} <= found
    pairs = sum(map(len, marked))
    assert len(secrets) == 784
    assert WHOLE_WORD_PAIRS_BEFORE <= pairs <= 1.05 * WHOLE_WORD_PAIRS_BEFORE
