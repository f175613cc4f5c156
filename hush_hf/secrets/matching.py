"""Where in a text do secrets occur? Character spans ``(start, end, secret)`` of the original text.

One rule: **a term occurs wherever a run of whole words of the text spells it**, whatever separates or
disguises the words. Text and terms are reduced to keys (:mod:`hush_hf.secrets.normalize`: escapes
decoded, NFKC, digits of any script as ASCII digits, accents and format characters dropped, Unicode TR39
prototypes, case folded, separators spelling nothing); a term matches the words ``w_a .. w_b`` of a text
when their keys, concatenated, equal the term's key. So ``project nightjar`` matches ``Project NightJar``,
``projectnightjar``, ``project_night_jar``, ``p r o j e c t  n i g h t j a r``, ``PROJECT-\\nNIGHT-JAR``,
``project%20nightjar`` and ``"project\\nnightjar"``; ``zulu 7741`` matches ``Zulu 7,741``, ``zulu 7 741``
and ``zulu ٧٧٤١``; ``falcon`` matches ``faIcon``, ``fa1con``, ``FALCON`` and ``Falcon9``.

*Words* (anchors) are maximal runs of letters and digits split where case goes from lower to upper
(``nightJar``), before the last capital of an acronym followed by lower case (``HTML|Parser``), and
between letters and digits; a character of a script written without spaces (Han, Kana, Hangul, Thai,
...) or a symbol that spells a letter (``|``) is a word alone. Because a match must start where a word
starts and end where one ends, a short term never matches inside a longer word or across the edges of
two words: ``cat`` matches ``cat``, ``Cat``, ``CatFood`` and ``c.a.t``, never ``catalog``, ``concat``
or ``public attributes``.

A term also matches with English plural endings on its last word (``falcons``, ``boxes``,
``companies``; possessives are words of their own). Where a character reads two ways (``I`` as ``i``
or ``l``, Greek capitals as letters or as Latin glyphs, a word mixing scripts read letter by letter) every
reading is tried, word by word; every layer of decoding is matched, and the raw text too (``C:\\new``
holds ``new``). A phone number or e-mail address term also matches its other writings
(:mod:`hush_hf.secrets.formats`: ``+14155550199``, ``alice {at} example {dot} org``).

Terms whose key is shorter than :data:`MIN_SPELLED` characters (``01``, ``σ``, ``w5``, ``猎鹰``) match
only words glued together (nothing between them) that spell them *plainly*, without TR39 prototypes: so
short a string is spelled by chance everywhere once separators and look-alikes are set aside (``0.1``
would be ``01``, every ``0`` a ``σ``, whose prototype is ``o``). :meth:`TermIndex.joined_spans` reads
several texts one after the other, as a script concatenating them does.

Cost per text is linear in its number of words times the words a match can span, independent of the
number of terms: every prefix of every term key up to :data:`PREFIX_CAP` characters is a dict key, and a
run of words is extended only while its keys spell such a prefix; longer terms are found by their first
``PREFIX_CAP`` characters and compared whole.
"""

from __future__ import annotations

import itertools
import re
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from functools import partial
from itertools import compress, islice
from operator import add
from typing import NamedTuple

from hush_hf.secrets.formats import canonical_forms
from hush_hf.secrets.normalize import (
    EXACT,
    KEYS,
    PLAIN,
    PLAIN_EXACT,
    Normalized,
    decode_escapes,
    dehyphenate,
    normalize,
)
from hush_hf.secrets.word_split import PieceWords, Words, join_words, occurrences, split_words

PREFIX_CAP = 32  # term-key prefixes up to this length are dict keys; longer terms are compared whole
MIN_SPELLED = 3  # shorter term keys match glued words spelling them plainly (no prototypes, no separators)


class SecretSpan(NamedTuple):
    """An occurrence of secret ``secret`` at characters ``[start, end)`` of the original text."""

    start: int
    end: int
    secret: int


_span = partial(tuple.__new__, SecretSpan)  # SecretSpan from a tuple, without a Python-level __new__


def term_key(term: str, *, case_sensitive: bool = False, plain: bool = False) -> str:
    """The key a term is matched by: its characters' keys (case reading) concatenated, escapes decoded;
    ``plain``: without TR39 prototypes (how terms shorter than :data:`MIN_SPELLED` are matched)."""
    tables = ((PLAIN, PLAIN_EXACT), (KEYS, EXACT))[not plain]
    return tables[case_sensitive].translate(decode_escapes(term).text)


def plural_forms(key: str) -> tuple[str, ...]:
    """``key`` and its English plurals (``-s``, ``-es``, ``-y`` -> ``-ies``) if it ends in a Latin letter."""
    if len(key) < 2 or not ("a" <= key[-1] <= "z"):
        return (key,)
    forms = [key, key + "s", key + "es"]
    if key.endswith("y"):
        forms.append(key[:-1] + "ies")
    return tuple(forms)


class TermIndex:
    """Term keys (and plural forms) by every prefix up to :data:`PREFIX_CAP`; longer ones by that prefix."""

    def __init__(self, terms: Mapping[int, Sequence[str]], *, case_sensitive: bool = False) -> None:
        forms: dict[str, set[int]] = {}
        short: dict[str, set[int]] = {}
        for index, secret_terms in terms.items():
            for k, term in enumerate(secret_terms):
                key = term_key(term, case_sensitive=case_sensitive)
                if not key:
                    raise ValueError(f"term {k} of secret #{index} contains no word characters")
                if len(key) < MIN_SPELLED:
                    key = term_key(term, case_sensitive=case_sensitive, plain=True) or key
                    for form in plural_forms(key):
                        short.setdefault(form, set()).add(index)
                    continue
                for form in plural_forms(key):
                    forms.setdefault(form, set()).add(index)
                for written in canonical_forms(term):
                    forms.setdefault(term_key(written, case_sensitive=case_sensitive), set()).add(index)
        self.case_sensitive = case_sensitive
        self.short = {form: tuple(sorted(ids)) for form, ids in short.items()}
        self._prefixes = frozenset(form[:n] for form in self.short for n in range(1, len(form) + 1))
        # The forms as one string: it pickles (to datasets.map workers) and is hashed (datasets'
        # fingerprints) in one piece; the prefix table is built from it where it is first used.
        self._forms = "\n".join(f"{form}\t{','.join(map(str, sorted(ids)))}" for form, ids in forms.items())
        self._table: dict[str, tuple[int, ...]] | None = None
        self._long: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        self._pieces = PieceWords(case_sensitive=case_sensitive, plain=bool(self.short))

    def __getstate__(self) -> dict:
        state = {"case_sensitive": self.case_sensitive, "short": self.short, "_forms": self._forms}
        return {**state, "_prefixes": self._prefixes}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._table, self._long = None, {}
        self._pieces = PieceWords(case_sensitive=self.case_sensitive, plain=bool(self.short))

    @property
    def table(self) -> dict[str, tuple[int, ...]]:
        """``table[prefix]``: the secrets whose form is ``prefix`` (``()`` for a proper prefix only), for
        every prefix of every form up to :data:`PREFIX_CAP` characters."""
        if self._table is None:
            table: dict[str, tuple[int, ...]] = {}
            for line in self._forms.split("\n") if self._forms else ():
                form, ids = line.split("\t")
                secrets = tuple(map(int, ids.split(",")))
                for n in range(1, min(len(form), PREFIX_CAP) + 1):
                    table.setdefault(form[:n], ())
                if len(form) <= PREFIX_CAP:
                    table[form] = secrets
                else:
                    self._long.setdefault(form[:PREFIX_CAP], []).append((form, secrets))
            self._table = table
        return self._table

    @property
    def long(self) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
        """Forms longer than :data:`PREFIX_CAP` by their first :data:`PREFIX_CAP` characters."""
        if self._table is None:
            self.table  # noqa: B018 (builds both)
        return self._long

    def split(self, normalized: Normalized) -> Words:
        """``normalized`` split into words keyed as this index needs."""
        if normalized.starts is None:  # offsets are the text's own: words from the pieces' cache
            return self._pieces.split(normalized.text)
        return split_words(normalized, case_sensitive=self.case_sensitive, plain=bool(self.short))

    def runs(self, words: Words) -> list[tuple[int, int, tuple[int, ...]]]:
        """``(a, b, secrets)``: words ``a..b`` (inclusive) spell a term of each of ``secrets``.

        Every word and every pair of adjacent words is looked up at once (``map``: most runs stop
        there); runs still alive after two words are extended word by word, and :meth:`_walk` follows
        every reading of words that have two and every term longer than :data:`PREFIX_CAP`.
        """
        keys, glyphs, long = words.keys, words.glyphs, self.long
        get, count = self.table.get, len(keys)
        entries = list(map(get, keys))
        pairs = list(map(get, map(add, keys, islice(keys, 1, None))))  # pairs[a]: words a, a + 1
        found = [(a, a, entries[a]) for a in compress(itertools.count(), entries)]  # truthy: a term
        for a in [a for a, entry in enumerate(pairs) if entry is not None]:
            spelled, entry, b = keys[a] + keys[a + 1], pairs[a], a + 1
            while True:  # words a..b spell a term prefix
                if entry:
                    found.append((a, b, entry))
                b += 1
                if b == count:
                    break
                if glyphs is not None and glyphs[b] is not None:
                    states = [(b, spelled + keys[b]), *((b, spelled + g) for g in glyphs[b])]
                    self._walk(keys, glyphs, a, states, found)
                    break
                spelled += keys[b]
                entry = get(spelled)
                if entry is None:
                    if long and len(spelled) > PREFIX_CAP:
                        self._walk(keys, glyphs, a, [(b, spelled)], found)
                    break
        if glyphs is not None:  # runs reading a word as its glyph: from that word, or through it
            for g in [g for g, glyph in enumerate(glyphs) if glyph is not None]:
                self._walk(keys, glyphs, g, [(g, other) for other in glyphs[g]], found)
                if g and entries[g - 1] is not None:
                    self._walk(keys, glyphs, g - 1, [(g, keys[g - 1] + other) for other in glyphs[g]], found)
        if long and 2 * max(map(len, keys), default=0) > PREFIX_CAP:  # runs that outgrow the prefix
            for a, key in enumerate(keys):  # table within their first two words
                if len(key) > PREFIX_CAP:
                    self._walk(keys, glyphs, a, [(a, key)], found)
                elif entries[a] is not None and a + 1 < count and len(key) + len(keys[a + 1]) > PREFIX_CAP:
                    self._walk(keys, glyphs, a, [(a + 1, key + keys[a + 1])], found)
        if self.short and words.plain is not None:
            found += self._short_runs(words)
        return found

    def _short_runs(self, words: Words) -> list[tuple[int, int, tuple[int, ...]]]:
        """Terms shorter than :data:`MIN_SPELLED`: runs of words with nothing between them (``w5``,
        ``猎鹰``) that spell the term plainly (case, accents and compatibility forms aside)."""
        plain, starts, ends = words.plain, words.starts, words.ends
        short, prefixes = self.short, self._prefixes
        found = []
        for a in [a for a, key in enumerate(plain) if key in prefixes]:
            spelled, b = plain[a], a
            while True:
                ids = short.get(spelled)
                if ids:
                    found.append((a, b, ids))
                b += 1
                if b == len(plain) or ends[b - 1] != starts[b]:
                    break
                spelled += plain[b]
                if spelled not in prefixes:
                    break
        return found

    def _walk(
        self,
        keys: list[str],
        glyphs: list[tuple[str, ...] | None] | None,
        a: int,
        states: list[tuple[int, str]],
        found: list[tuple[int, int, tuple[int, ...]]],
    ) -> None:
        """Runs starting at word ``a``, from ``states`` ``(b, what words a..b spell)`` on, in every reading
        of every word; terms longer than :data:`PREFIX_CAP` compared whole."""
        get, count = self.table.get, len(keys)
        stack = list(states)
        while stack:
            b, spelled = stack.pop()
            if len(spelled) > PREFIX_CAP:
                candidates = self.long.get(spelled[:PREFIX_CAP], ())
                found += [(a, b, ids) for form, ids in candidates if form == spelled]
                if not any(len(form) > len(spelled) and form.startswith(spelled) for form, _ in candidates):
                    continue
            else:
                entry = get(spelled)
                if entry is None:
                    continue
                if entry:
                    found.append((a, b, entry))
            b += 1
            if b < count:
                stack.append((b, spelled + keys[b]))
                if glyphs is not None and glyphs[b] is not None:
                    stack += [(b, spelled + other) for other in glyphs[b]]

    def spans(self, normalized: Normalized, out: set[SecretSpan]) -> None:
        """Add every term occurrence in ``normalized`` (original offsets) to ``out``."""
        words = self.split(normalized)
        runs = self.runs(words)
        if runs:
            out.update(map(_span, occurrences(words, runs)))

    def joined_spans(self, rows: Sequence[Normalized], out: Sequence[set[SecretSpan]]) -> None:
        """Occurrences in the texts ``rows`` read one after the other (as a script that concatenates
        them reads them): an occurrence spanning several rows adds, to each row it touches, the part of
        it in that row (``out[r]``: offsets into row r)."""
        split = [self.split(row) for row in rows]
        words, firsts = join_words(split)
        parts: list[list[tuple[int, int, tuple[int, ...]]]] = [[] for _ in rows]  # runs in each row's words
        for a, b, ids in self.runs(words):
            first, last = bisect_right(firsts, a) - 1, bisect_right(firsts, b) - 1
            for row in range(first, last + 1):
                if firsts[row] == firsts[row + 1]:  # a row without words inside the run
                    continue
                start, end = max(a, firsts[row]), min(b, firsts[row + 1] - 1)
                parts[row].append((start - firsts[row], end - firsts[row], ids))
        for row, runs in enumerate(parts):
            if runs:
                out[row].update(map(_span, occurrences(split[row], runs)))


#: The kinds of ``re.error`` messages, without what follows them: ``error.msg`` quotes parts of the
#: pattern (group names, escapes, character ranges), i.e. of the secret.
REGEX_ERROR_KINDS = (
    "redefinition of group name", "unknown group name", "bad character in group name", "missing group name",
    "bad escape", "bad character range", "unterminated character set", "unterminated name",
    "unterminated subpattern", "unbalanced parenthesis", "nothing to repeat", "multiple repeat",
    "unknown extension", "look-behind requires fixed-width pattern", "cannot refer to an open group",
    "invalid group reference", "global flags not at the start", "bad inline flags", "unknown flag",
    "missing flag", "missing -, : or )", "missing )", "missing :", "missing ), unterminated comment",
    "the repetition number is too large", "min repeat greater than max repeat", "octal escape value",
    "incomplete escape", "cannot refer to group defined in the same lookbehind subpattern",
    "conditional backref with more than two branches", "expected",
)


def regex_error_kind(error: re.error) -> str:
    """What kind of syntax error ``error`` is, in words that never quote the pattern."""
    message = str(error.msg)
    for kind in REGEX_ERROR_KINDS:
        if message.startswith(kind):
            return kind
    return "invalid syntax"


def compile_pattern(index: int, pattern: str | re.Pattern[str], flags: int) -> re.Pattern[str]:
    """``pattern`` compiled with ``flags``; errors name the secret, never the pattern."""
    if isinstance(pattern, re.Pattern):
        flags, pattern = pattern.flags | flags, pattern.pattern
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"pattern of secret #{index} must be a non-empty string")
    try:
        return re.compile(pattern, flags)
    except re.error as error:
        raise ValueError(
            f"pattern of secret #{index} is not a valid regular expression: "
            f"{regex_error_kind(error)} at position {error.pos}"
        ) from None


def pattern_spans(
    patterns: Sequence[tuple[int, re.Pattern[str], bool]], text: str, variants: Sequence[Normalized]
) -> set[SecretSpan]:
    """Matches of ``(index, compiled, raw)`` in ``text`` and, unless raw, in its normalised ``variants``."""
    out: set[SecretSpan] = set()
    for index, compiled, raw in patterns:
        for match in compiled.finditer(text):
            if match.end() > match.start():
                out.add(SecretSpan(match.start(), match.end(), index))
        if raw:
            continue
        for variant in variants:
            if variant.text == text and variant.starts is None:
                continue
            for match in compiled.finditer(variant.text):
                if match.end() > match.start():
                    out.add(SecretSpan(*variant.original_span(match.start(), match.end()), index))
    return out


def text_variants(text: str) -> list[Normalized]:
    """For patterns: the normalised text and, with words hyphenated across line breaks, the joined one."""
    normalized = normalize(text)
    joined = dehyphenate(normalized)
    return [normalized] if joined is None else [normalized, joined]
