"""Marks for every reading a reader makes (issue 27): layers, glyph classes, canonical formats.

Each disguise class is generated here (fixed seed) and read by an independent normaliser written in this
file from the standard library and libphonenumber (``html.unescape``, ``urllib.parse.unquote``,
``codecs``' ``unicode_escape``, ``quopri``, a tag stripper, Unicode names, E.164): the reference says what
a reader reads, and the tagger must mark the secret over the whole disguise.
"""

from __future__ import annotations

import codecs
import html
import quopri
import re
import unicodedata
from urllib.parse import unquote

import numpy as np
import phonenumbers
import pytest

from hush_hf.secrets import TermTagger

SEED = 27
VARIANTS = 12  # per class and term

WORDS = ["project nightjar", "vacuum", "cobalt", "falconry", "nightjar"]
CYRILLIC = ["ночной"]
PHONES = ["+1 415 555 0199", "(212) 555-0142", "+44 20 7946 0958"]
EMAILS = ["alice@example.org", "j.smith@mail.example.co.uk"]

# -- the independent reader -------------------------------------------------------------------------

_TAGS = re.compile(r"<!--.*?-->|<[^<>]*>", re.S)
_CSS = re.compile(r"\\([0-9A-Fa-f]{1,6}) ?")
_FILLERS = dict.fromkeys(map(ord, "\u3164\u115f\u1160\uffa0\u0640\u200b\u00ad"))
_LOOK_ALIKE_CAPITALS = {"К": "K", "Κ": "K", "А": "A", "Α": "A", "М": "M", "Μ": "M", "Ι": "I", "І": "I",
                        "Е": "E", "Ε": "E", "Т": "T", "Τ": "T", "Н": "H", "Η": "H", "О": "O", "Ο": "O",
                        "Р": "P", "Ρ": "P", "Х": "X", "Χ": "X", "В": "B", "Β": "B", "Ν": "N", "ϲ": "c",
                        "Ϲ": "C"}  # fmt: skip


def _one_pass(text: str, css: bool) -> str:
    text = _TAGS.sub("", text)
    text = html.unescape(text)
    text = unquote(text)
    if "=" in text:
        text = quopri.decodestring(text.encode("utf-8")).decode("utf-8", "replace")
    if "\\" in text:
        if css:
            text = _CSS.sub(lambda m: chr(int(m.group(1), 16)), text)
        text = codecs.decode(text.encode("latin-1", "backslashreplace"), "unicode_escape")
    return text


def reader_readings(text: str) -> set[str]:
    """What a reader reads: decoding to a fixed point (octal or CSS for backslash digits)."""
    out = set()
    for css in (False, True):
        current = text
        for _ in range(10):
            later = _one_pass(current, css)
            if later == current:
                break
            current = later
        out.add(current)
    return out


def _letter(char: str) -> str:
    name = unicodedata.name(char, "")
    if name.startswith(
        (
            "LATIN LETTER SMALL CAPITAL ",
            "NEGATIVE CIRCLED LATIN CAPITAL LETTER ",
            "NEGATIVE SQUARED LATIN CAPITAL LETTER ",
            "REGIONAL INDICATOR SYMBOL LETTER ",
        )
    ):
        return name[-1].lower()
    return _LOOK_ALIKE_CAPITALS.get(char, char)


def skeleton(text: str) -> str:
    """Letters and digits read, case folded, separators dropped."""
    text = "".join(map(_letter, text.translate(_FILLERS)))
    text = unicodedata.normalize("NFKC", text).casefold()
    return "".join(c for c in text if c.isalnum())


def reference_reads(term: str, text: str) -> bool:
    return any(skeleton(term) in skeleton(reading) for reading in reader_readings(text))


def email_read(text: str) -> str:
    text = re.sub(r"[\[\]{}]|\((?!a\))|(?<!\(a)\)", " ", text)
    text = re.sub(r"\s+at\s+|\(a\)", "@", text, flags=re.I)
    return re.sub(r"\s+dot\s+", ".", text, flags=re.I).replace(" ", "")


# -- generators -------------------------------------------------------------------------------------


def _positions(word: str, rng: np.random.Generator, inner: bool = False) -> list[int]:
    letters = [i for i, c in enumerate(word) if c.isalpha() and (not inner or 0 < i < len(word) - 1)]
    count = int(rng.integers(1, min(3, len(letters)) + 1))
    return sorted(rng.choice(letters, size=count, replace=False).tolist())


def _escaping(fn):
    def disguise(term: str, rng: np.random.Generator) -> str:
        chosen = set(_positions(term, rng))
        nexts = [*term[1:], " "]
        return "".join(
            fn(c, rng, n) if i in chosen else c for i, (c, n) in enumerate(zip(term, nexts, strict=True))
        )

    return disguise


def _inserting(pieces):
    def disguise(term: str, rng: np.random.Generator) -> str:
        chosen = set(_positions(term, rng, inner=True))
        return "".join((str(rng.choice(pieces)) if i in chosen else "") + c for i, c in enumerate(term))

    return disguise


def _utf8_percent(c: str) -> str:
    return "".join(f"%{b:02X}" for b in c.encode("utf-8"))


def _glyphs(first: int):
    return lambda term, rng: "".join(chr(first + ord(c) - 97) if "a" <= c <= "z" else c for c in term)


_SMALL_CAPS = dict(zip("abcdefghijklmnoprstuvwyz", "ᴀʙᴄᴅᴇꜰɢʜɪᴊᴋʟᴍɴᴏᴘʀꜱᴛᴜᴠᴡʏᴢ", strict=True))

LETTER_CLASSES = {
    "HTML tag inside a word": _inserting(["<span></span>", "<b></b>", "<i>", "</em>", "<span class='x'>"]),
    "<wbr> and <br> inside a word": _inserting(["<wbr>", "<br>", "<br/>", "<wbr />"]),
    "HTML comment inside a word": _inserting(["<!-- -->", "<!--x-->"]),
    "HTML decimal with ;": _escaping(lambda c, r, n: f"&#{ord(c)};"),
    "HTML decimal without ;": _escaping(lambda c, r, n: f"&#{ord(c)}" + (";" if n.isdigit() else "")),
    "HTML hex with and without ;": _escaping(
        lambda c, r, n: (
            f"&#x{ord(c):x}" + (";" if n in "0123456789abcdefABCDEF" else str(r.choice([";", ""])))
        )
    ),
    "double HTML": _escaping(lambda c, r, n: f"&amp;#{ord(c)};"),
    "percent": _escaping(lambda c, r, n: _utf8_percent(c)),
    "double percent": _escaping(lambda c, r, n: _utf8_percent(c).replace("%", "%25")),
    "JSON \\u": _escaping(lambda c, r, n: f"\\u{ord(c):04x}"),
    "double backslash \\\\u": _escaping(lambda c, r, n: f"\\\\u{ord(c):04x}"),
    "Python \\N{name}": _escaping(lambda c, r, n: "\\N{" + unicodedata.name(c) + "}"),
    "C \\x": _escaping(lambda c, r, n: f"\\x{ord(c):02x}" if ord(c) < 128 else c),
    "C octal": _escaping(lambda c, r, n: f"\\{ord(c):03o}" if ord(c) < 128 else c),
    "CSS": _escaping(lambda c, r, n: f"\\{ord(c):x} " if ord(c) < 128 else c),
    "quoted-printable": _escaping(lambda c, r, n: "".join(f"={b:02X}" for b in c.encode("utf-8"))),
    "small capitals": lambda term, rng: "".join(_SMALL_CAPS.get(c, c) for c in term),
    "negative circled": _glyphs(0x1F150),
    "negative squared": _glyphs(0x1F170),
    "regional indicators": _glyphs(0x1F1E6),
    "Hangul filler": _inserting(["\u3164", "\uffa0"]),
    "Arabic tatweel": _inserting(["\u0640", "\u0640\u0640"]),
    "lunate sigma": lambda term, rng: term.replace("c", str(rng.choice(["ϲ", "Ϲ"]))),
    "mixed-script capitals with I": lambda term, rng: "".join(
        str(rng.choice([c, _CAPITALS.get(c, c)])) if c != "i" else "I" for c in term.upper().lower()
    ).upper(),
    "SQL || concatenation": lambda term, rng: "'" + "' || '".join(_cut(term, rng)) + "'",
}
_CAPITALS = {
    "k": "К",
    "a": "Α",
    "m": "М",
    "e": "Ε",
    "t": "Τ",
    "o": "Ο",
    "p": "Р",
    "x": "Χ",
    "b": "Β",
    "n": "Ν",
}
LETTER_TERMS = {
    "lunate sigma": ["vacuum", "cobalt", "project nightjar"],
    "mixed-script capitals with I": ["kim", "akiaq7", "nightjar", "ambient"],
}


def _cut(term: str, rng: np.random.Generator) -> list[str]:
    flat = term.replace(" ", "")
    cut = int(rng.integers(1, len(flat)))
    return [flat[:cut], flat[cut:]]


PHONE_CLASSES = {
    "phone, country code glued": lambda number: (
        "+" + number.country_code.__str__() + phonenumbers.national_significant_number(number)
    ),
    "phone, national": lambda number: phonenumbers.format_number(
        number, phonenumbers.PhoneNumberFormat.NATIONAL
    ),
    "phone, international": lambda number: phonenumbers.format_number(
        number, phonenumbers.PhoneNumberFormat.INTERNATIONAL
    ),
    "phone, 00 prefix": lambda number: (
        "00 " + str(number.country_code) + " " + phonenumbers.national_significant_number(number)
    ),
}
EMAIL_CLASSES = {
    "e-mail {at} {dot}": lambda e: e.replace("@", " {at} ").replace(".", " {dot} "),
    "e-mail [at] [dot]": lambda e: e.replace("@", " [at] ").replace(".", " [dot] "),
    "e-mail (at) and .": lambda e: e.replace("@", "(at)"),
    "e-mail AT DOT": lambda e: e.replace("@", " AT ").replace(".", " DOT "),
    "e-mail (a)": lambda e: e.replace("@", "(a)"),
}


def _covered(tagger: TermTagger, text: str, start: int, end: int) -> bool:
    spans = [(s, e) for s, e, j in tagger.spans(text) if j == 0]
    return any(s <= start and end <= e for s, e in spans)


@pytest.mark.parametrize("name", sorted(LETTER_CLASSES))
def test_every_letter_disguise_is_read_and_marked_over_the_whole_disguise(name):
    rng = np.random.default_rng(SEED)
    disguise = LETTER_CLASSES[name]
    terms = LETTER_TERMS.get(name, WORDS + (CYRILLIC if name.startswith(("HTML", "percent", "JSON")) else []))
    missed = []
    for term in terms:
        tagger = TermTagger({0: [term], 1: ["unrelated words"]})
        for _ in range(VARIANTS):
            variant = disguise(term, rng)
            text = f"we saw {variant} in the log"
            assert reference_reads(term, text), (name, variant)  # the generator writes what a reader reads
            start = text.index(variant) + (variant[0] in "'")
            end = start + len(variant.rstrip(" '")) - (variant[0] in "'")
            if not _covered(tagger, text, start, end):
                missed.append(variant)
    assert not missed, (name, missed[:3])


@pytest.mark.parametrize("name", sorted(PHONE_CLASSES))
def test_phone_numbers_are_read_as_their_e164_number(name):
    for term in PHONES:
        number = phonenumbers.parse(term, "US")
        tagger = TermTagger({0: [term]})
        variant = PHONE_CLASSES[name](number)
        text = f"call {variant} today"
        region = "DE" if variant.startswith("00") else phonenumbers.region_code_for_number(number)
        assert phonenumbers.parse(variant, region) == number  # the reference reads the same number
        start = text.index(variant) + (variant[0] in "+(")
        assert _covered(tagger, text, start, text.index(variant) + len(variant)), (term, variant)


@pytest.mark.parametrize("name", sorted(EMAIL_CLASSES))
def test_email_obfuscations_are_read_as_the_address(name):
    for term in EMAILS:
        tagger = TermTagger({0: [term]})
        variant = EMAIL_CLASSES[name](term)
        assert email_read(variant) == term
        text = f"mail {variant} now"
        start = text.index(variant)
        assert _covered(tagger, text, start, start + len(variant)), variant


def test_layers_do_not_join_words_outside_words():
    tagger = TermTagger({0: ["cobalt"], 1: ["project"]})
    assert tagger("co <b>balt</b>") == set()  # a tag between words stays a separator, not a join
    assert tagger("<a href='x'>proj</a> ect") == set()
    assert tagger("x = 'proj' | 'ect'") == set()  # a single | is a letter l, not an operator
    assert tagger("SELECT 'proj' || 'ect'") == {1}


def test_layer_offsets_map_back_exactly():
    tagger = TermTagger({0: ["nightjar"]})
    text = "see n&#105;ght<wbr>ja%2572 and &amp;#110;ightjar"
    assert [(s, e) for s, e, _ in tagger.spans(text)] == [(4, 26), (31, 48)]


def test_circled_digits_and_a_national_prefix_after_the_country_code():
    tagger = TermTagger({0: ["7741 2290"], 1: ["+44 20 7946 0958"]})
    digits = "".join(chr(0x2776 + int(d) - 1) if d != "0" else "\u24ff" for d in "77412290")
    assert "".join(unicodedata.name(c).split()[-1][0] for c in digits[:2]) == "SS"  # SEVEN SEVEN
    assert tagger(f"id {digits} ok") == {0}
    text = "call +44 (0)20 7946 0958"
    assert phonenumbers.parse(text[5:], "US") == phonenumbers.parse("+44 20 7946 0958", None)
    assert tagger(text) == {1}
