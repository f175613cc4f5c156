"""Tagging and marking throughput: texts/s of the span tagger and of tokenizing with secret marks.

    python bench/secret_marking.py                     # 1M texts of ~100 words, 100K terms, num_proc=2
    python bench/secret_marking.py --texts 100000      # a shorter run (what docs/benchmarks.md records)
    python bench/secret_marking.py --cpu-per-text      # CPU microseconds per text, one process
    python bench/secret_marking.py --cpu-per-text --against /tmp/old   # interleaved with another checkout

Texts are ~100-word windows of the ACLSum paragraphs (offline asset), repeated to ``--texts``; terms are
ACLSum words past the 2,000 most frequent (so some occur) topped up with synthetic words, 10% of them
two-word phrases. Four ``Dataset.map(num_proc=...)`` runs, side by side:

- baseline: the whole-word text tagger hush_hf had before token marks (words() + dict look-ups);
- text tagging: ``tag_dataset(ds, tagger_for(secrets))`` (identifier split, plurals, escapes,
  confusables, hyphenation, unspaced scripts);
- tokenizing with the plain GPT-2 tokenizer (``run_clm``'s tokenize_function);
- tokenizing with ``mark_secrets(tokenizer, secrets)`` (the same plus the marks column).

Target (issue 8): text tagging no slower than the baseline; marking's cost is reported against both.

``--cpu-per-text``: the steadier measure on a shared machine, CPU time per text in one process
(``time.process_time``, best of 3, ``--texts`` of them, 4,000 by default) of ``tagger.spans(text)``, of
plain GPT-2 tokenizing and of tokenizing with marks (batches of 1,000). ``--against CHECKOUT`` runs the
same measurement on the ``hush_hf`` of another checkout (e.g. ``git worktree add /tmp/old 251ddd7``, the
code before issue 19) and this one, interleaved ``--rounds`` times, each in a fresh process.

Issue 27: recall per disguise class for generated disguises of every layer, glyph class and canonical
form the matcher reads (markup inside words, HTML references with and without ``;``, double escapes, C
octal, CSS, quoted-printable, small capitals, negative circled letters, regional indicators, fillers,
tatweel, lunate sigma, mixed-script capitals, SQL ``||``, phone numbers, e-mail obfuscations), the CRT
credential table (each credential form: masked by the ``credentials`` policy? its row public?), and on
clean text the whole-word pairs and what the pairs beyond them are.

Then (issue 19) what the matcher finds: recall on generated disguises of planted terms (case inside a
word, words run together, spaced and dotted letters, digit groups and scripts, escapes, line wraps,
TR39 confusables, all-caps Greek, combining overlays), for the whole-word baseline and for
``tagger_for``; and the (row, secret) pairs marked on clean text, the main job's 784 ACLSum words of
document frequency 50-100 on all 12,840 paragraphs (``tag_dataset``, and ``mark_secrets`` reading
each map batch's rows together).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import unicodedata
from collections import Counter
from itertools import chain

import datasets
import numpy as np
import phonenumbers

from hush_hf.assets.corpora import aclsum_paragraphs
from hush_hf.assets.tokenizer_assets import gpt2_tokenizer
from hush_hf.secrets import (
    Secret,
    SecretSet,
    mark_secrets,
    secret_ids_from_marks,
    select_by_document_frequency,
    tag_dataset,
    tagger_for,
)
from hush_hf.secrets.words import words


class BaselineTagger:
    """The pre-marks TermTagger: whole words (NFKC, case folding) looked up in dicts, phrases as n-grams."""

    def __init__(self, terms: dict[int, list[str]]) -> None:
        self.single: dict[str, list[int]] = {}
        self.phrases: dict[tuple[str, ...], list[int]] = {}
        self.lengths: dict[str, set[int]] = {}
        for j, secret_terms in terms.items():
            for term in secret_terms:
                tokens = words(term)
                if len(tokens) == 1:
                    self.single.setdefault(tokens[0], []).append(j)
                else:
                    self.phrases.setdefault(tuple(tokens), []).append(j)
                    self.lengths.setdefault(tokens[0], set()).add(len(tokens))

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        out = []
        for text in batch["text"]:
            tokens = words(text)
            distinct = set(tokens)
            found = set(chain.from_iterable(filter(None, map(self.single.get, distinct))))
            if not self.lengths.keys().isdisjoint(distinct):
                for start, word in enumerate(tokens):
                    for n in self.lengths.get(word, ()):
                        found.update(self.phrases.get(tuple(tokens[start : start + n]), ()))
            out.append(sorted(found))
        return {"secret_ids": out}


def _disguise(term: str, rng: np.random.Generator) -> str:
    """One random disguise of ``term`` (lower-case ASCII words and digits)."""
    kind = int(rng.integers(9))
    if kind == 0:  # case changes inside words
        return "".join(c.upper() if rng.random() < 0.4 else c for c in term)
    if kind == 1:  # words run together
        return term.replace(" ", "")
    if kind == 2:  # spaced or dotted letters
        return str(rng.choice([" ", ".", "-", "_"])).join(term.replace(" ", ""))
    if kind == 3:  # digits in another script, with a group separator
        digits = "".join(chr(0x0660 + int(c)) if c.isdigit() else c for c in term)
        return digits.replace(" ", str(rng.choice([" ", ",", "\u202f"])))
    if kind == 4:  # escapes of code, JSON and URLs
        return term.replace(" ", str(rng.choice(["\\n", "\\t", "%20", "&nbsp;"])))
    if kind == 5:  # a hard line wrap, hyphenated or not
        cut = int(rng.integers(1, len(term)))
        return term[:cut] + str(rng.choice(["\n", "-\n", "\r\n  "])) + term[cut:]
    if kind == 6:  # TR39 confusables: Cyrillic letters, capital I and digit 1 for l, 0 for o
        table = {
            "a": "\u0430",
            "e": "\u0435",
            "o": "0",
            "c": "\u0441",
            "p": "\u0440",
            "l": "I",
            "i": "\u0456",
        }
        return "".join(table.get(c, c) if rng.random() < 0.5 else c for c in term)
    if kind == 7:  # combining marks over the letters
        return "".join(c + ("\u0338" if rng.random() < 0.3 else "") for c in term)
    return term.upper().replace("O", "\u039f").replace("A", "\u0391")  # all caps, Greek capitals


def recall(tagger, terms: list[str], seed: int = 0, repeats: int = 20) -> float:
    """Share of generated disguises of each term (planted in filler text) that ``tagger`` finds."""
    rng = np.random.default_rng(seed)
    hits = total = 0
    for j, term in enumerate(terms):
        for _ in range(repeats):
            text = f"we saw {_disguise(term, rng)} in the log"
            hits += j in tagger(text)
            total += 1
    return hits / total


def disguise_recall() -> None:
    rng = np.random.default_rng(19)
    letters = "abcdefghijklmnopqrstuvwxyz"
    terms = ["".join(rng.choice(list(letters), size=int(rng.integers(5, 10)))) for _ in range(200)]
    terms += [f"{t} {int(rng.integers(1000, 99999))}" for t in terms[:50]]
    terms += [f"{a} {b}" for a, b in zip(terms[50:100], terms[100:150], strict=True)]
    secrets = SecretSet(
        Secret(name=f"d{j}", prior=1e-6, target_posterior=1e-3, terms=(t,)) for j, t in enumerate(terms)
    )
    baseline = BaselineTagger({j: [t] for j, t in enumerate(terms)})
    whole_word = lambda text: set(baseline({"text": [text]})["secret_ids"][0])  # noqa: E731
    found = recall(tagger_for(secrets), terms)
    print(
        f"recall on generated disguises ({len(terms)} terms x 20): "
        f"whole-word baseline {recall(whole_word, terms):.3f}, tagger_for {found:.3f}"
    )


# -- issue 27: every reading a reader makes, and credentials in CRT ---------------------------------------

_SMALL_CAPS = dict(zip("abcdefghijklmnoprstuvwyz", "ᴀʙᴄᴅᴇꜰɢʜɪᴊᴋʟᴍɴᴏᴘʀꜱᴛᴜᴠᴡʏᴢ", strict=True))
_LOOK_ALIKE_CAPITALS = dict(zip("KAMETOPXBNH", "КΑМΕΤΟРΧΒΝΗ", strict=True))


def _escape_some(term: str, rng: np.random.Generator, escape) -> str:
    """``term`` with one to three of its letters written by ``escape(char, next char)``."""
    letters = [i for i, c in enumerate(term) if c.isalpha()]
    chosen = set(rng.choice(letters, size=min(len(letters), int(rng.integers(1, 4))), replace=False).tolist())
    return "".join(escape(c, (term + " ")[i + 1]) if i in chosen else c for i, c in enumerate(term))


def _insert_some(term: str, rng: np.random.Generator, pieces: list[str]) -> str:
    """``term`` with ``pieces`` put between letters inside its words."""
    inner = [i for i in range(1, len(term)) if term[i].isalpha() and term[i - 1].isalpha()]
    chosen = set(rng.choice(inner, size=min(len(inner), int(rng.integers(1, 3))), replace=False).tolist())
    return "".join((str(rng.choice(pieces)) if i in chosen else "") + c for i, c in enumerate(term))


def _utf8(char: str, fmt: str) -> str:
    return "".join(fmt.format(b) for b in char.encode("utf-8"))


LAYER_DISGUISES = {
    "tag inside a word": lambda t, r: _insert_some(t, r, ["<span></span>", "<b>", "</i>", "<em class=x>"]),
    "<wbr>/<br> inside a word": lambda t, r: _insert_some(t, r, ["<wbr>", "<br>", "<br/>"]),
    "comment inside a word": lambda t, r: _insert_some(t, r, ["<!-- -->", "<!--x-->"]),
    "HTML &#n; and &#n": lambda t, r: _escape_some(
        t, r, lambda c, n: f"&#{ord(c)}" + (";" if n.isdigit() else "")
    ),
    "HTML &#xh": lambda t, r: _escape_some(t, r, lambda c, n: f"&#x{ord(c):x};"),
    "double HTML &amp;#n;": lambda t, r: _escape_some(t, r, lambda c, n: f"&amp;#{ord(c)};"),
    "percent": lambda t, r: _escape_some(t, r, lambda c, n: _utf8(c, "%{:02X}")),
    "double percent %25": lambda t, r: _escape_some(t, r, lambda c, n: _utf8(c, "%25{:02X}")),
    "JSON \\u": lambda t, r: _escape_some(t, r, lambda c, n: f"\\u{ord(c):04x}"),
    "double \\\\u": lambda t, r: _escape_some(t, r, lambda c, n: f"\\\\u{ord(c):04x}"),
    "Python \\N{name}": lambda t, r: _escape_some(t, r, lambda c, n: "\\N{" + unicodedata.name(c) + "}"),
    "C octal": lambda t, r: _escape_some(t, r, lambda c, n: f"\\{ord(c):03o}" if c.isascii() else c),
    "CSS \\h ": lambda t, r: _escape_some(t, r, lambda c, n: f"\\{ord(c):x} " if c.isascii() else c),
    "quoted-printable": lambda t, r: _escape_some(t, r, lambda c, n: _utf8(c, "={:02X}")),
    "small capitals": lambda t, r: "".join(_SMALL_CAPS.get(c, c) for c in t),
    "negative circled": lambda t, r: "".join(chr(0x1F150 + ord(c) - 97) if "a" <= c <= "z" else c for c in t),
    "regional indicators": lambda t, r: "".join(
        chr(0x1F1E6 + ord(c) - 97) if "a" <= c <= "z" else c for c in t
    ),
    "Hangul filler": lambda t, r: _insert_some(t, r, ["\u3164", "\uffa0"]),
    "Arabic tatweel": lambda t, r: _insert_some(t, r, ["\u0640"]),
    "lunate sigma": lambda t, r: t.replace("c", "\u03f2"),
    "mixed-script capitals": lambda t, r: "".join(
        _LOOK_ALIKE_CAPITALS.get(c, c) if r.random() < 0.5 else c for c in t.upper()
    ),
    "SQL || concatenation": lambda t, r: "'" + t[:3] + "' || '" + t[3:] + "'",
}
PHONE_TERMS = ["+1 415 555 0199", "(212) 555-0142", "+44 20 7946 0958"]
PHONE_DISGUISES = {
    "phone, country code glued": lambda n: f"+{n.country_code}{phonenumbers.national_significant_number(n)}",
    "phone, national": lambda n: phonenumbers.format_number(n, phonenumbers.PhoneNumberFormat.NATIONAL),
    "phone, 00 prefix": lambda n: f"00{n.country_code} {phonenumbers.national_significant_number(n)}",
}
EMAIL_DISGUISES = {
    "e-mail {at} {dot}": lambda e: e.replace("@", " {at} ").replace(".", " {dot} "),
    "e-mail [at] [dot]": lambda e: e.replace("@", " [at] ").replace(".", " [dot] "),
    "e-mail (at) .": lambda e: e.replace("@", "(at)"),
    "e-mail (a)": lambda e: e.replace("@", "(a)"),
}


def layer_recall(repeats: int = 40) -> None:
    """Recall per disguise class (issue 27), ``repeats`` generated disguises per class over a few secrets."""
    rng = np.random.default_rng(27)
    words = ["project nightjar", "vacuum cobalt", "falconry", "nightjar", "akiaq7 kim"]
    print(f"recall per disguise class (issue 27; {repeats} disguises each, planted in filler text):")
    rows = []
    for name, disguise in LAYER_DISGUISES.items():
        pool = [w for w in words if "c" in w] if name == "lunate sigma" else words
        hits = 0
        for k in range(repeats):
            term = pool[k % len(pool)]
            hits += 0 in tagger_for(_one_secret(term))(f"we saw {disguise(term, rng)} in the log")
        rows.append((name, hits))
    for name, disguise in PHONE_DISGUISES.items():
        hits = sum(
            0 in tagger_for(_one_secret(t))(f"call {disguise(phonenumbers.parse(t, 'US'))} now")
            for t in PHONE_TERMS
            for _ in range(repeats // len(PHONE_TERMS) + 1)
        )
        rows.append((name, round(hits * repeats / (len(PHONE_TERMS) * (repeats // len(PHONE_TERMS) + 1)))))
    for name, disguise in EMAIL_DISGUISES.items():
        hits = sum(
            0 in tagger_for(_one_secret(e))(f"mail {disguise(e)}") for e in ["alice@example.org"] * repeats
        )
        rows.append((name, hits))
    for name, hits in rows:
        print(f"  {name:<28} {hits:>3} / {repeats}")
    total = sum(h for _, h in rows)
    print(f"  {'all classes':<28} {total:>3} / {repeats * len(rows)} = {total / (repeats * len(rows)):.3f}")


def _one_secret(term: str) -> SecretSet:
    return SecretSet([Secret(name="s", prior=1e-6, target_posterior=1e-3, terms=(term,))])


def crt_credential_table(seed: int = 27) -> None:
    """Credentials in code and configuration (issue 27): masked by the ``credentials`` policy, and public?"""
    from hush_hf.crt import build_policies, redact_dataset

    rng = np.random.default_rng(seed)
    alnum = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")

    def word(size: int, extra: str = "") -> str:
        return "".join(rng.choice(alnum + list(extra), size=size).tolist())

    aws = "AKIA" + "".join(rng.choice(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"), size=16).tolist())
    body = "\n".join(word(64, "+/") for _ in range(5))
    cases = [
        (".env DB_PASSWORD=", "DB_PASSWORD={}\n", word(14)),
        (".env SECRET_KEY=", "SECRET_KEY={}\n", word(40)),
        (".env API_KEY= hex", "API_KEY={}\n", "".join(rng.choice(list("0123456789abcdef"), 32).tolist())),
        (".env quoted", 'MAIL_PASSWORD="{}"\n', word(12) + "!"),
        ("~/.aws/credentials", "[default]\naws_secret_access_key = {}\n", word(40, "+/")),
        ("export AWS_SECRET_ACCESS_KEY=", "export AWS_SECRET_ACCESS_KEY={}\n", word(40, "+/")),
        ("github_pat_", "push with {}\n", "github_pat_" + word(82, "_")),
        ("redis://:pass@", "REDIS_URL=redis://:{}@cache:6379/0\n", word(16)),
        ("JDBC password=", "jdbc:mysql://db/a?user=u&password={}&ssl=1\n", word(12)),
        ("ADO.NET Password=", "Server=db;User ID=sa;Password={};Encrypt=True\n", word(12)),
        ("Azure AccountKey=", "AccountName=a;AccountKey={};EndpointSuffix=x\n", word(86, "+/") + "=="),
        ("docker-compose POSTGRES_PASSWORD:", "db:\n  environment:\n    POSTGRES_PASSWORD: {}\n", word(12)),
        ("mysql -p", "mysql -u root -p{} shop\n", word(12)),
        ("PGPASSWORD=", "PGPASSWORD={} psql -h db\n", word(12)),
        ("XML <password>", "<ds><password>{}</password></ds>\n", word(12)),
        ("Java .password=", "spring.datasource.password={}\n", word(12)),
        ("key split by concatenation", 'aws_id = "' + aws[:9] + '" + "{}"\n', aws[9:]),
        ("high entropy after 'secret'", "aws secret key is {} (rotate)\n", word(40, "+/")),
        ("PEM, legacy encrypted, no END", "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"
         "DEK-Info: AES-128-CBC,00FF00FF00FF00FF00FF00FF00FF00FF\n\n{}\n", body),
    ]  # fmt: skip
    texts = [template.format(value) for _, template, value in cases]
    clean = ["We tokenize each sentence and report F1 on the test set.", "password = getpass()\n"]
    data = datasets.Dataset.from_dict({"text": texts + clean})
    redacted, _ = redact_dataset(data, build_policies(["credentials"]))
    print("CRT credential table (issue 27): the credentials policy on code and configuration")
    masked_count = public_kept = 0
    rows = zip(cases, redacted["text"], redacted["crt_public"], strict=False)  # the clean rows come after
    for (name, _, value), out, public in rows:
        kept = any(value[k : k + 8] in out for k in range(0, max(1, len(value) - 7)))
        masked_count += not kept
        public_kept += kept and public
        print(f"  {name:<34} {'masked' if not kept else 'KEPT':<7} {'public' if public else 'private'}")
    public_clean = sum(redacted["crt_public"][len(cases) :])
    print(
        f"  masked {masked_count} / {len(cases)}; public rows keeping a credential: {public_kept}; rows "
        f"without one public: {public_clean} / {len(clean)}"
    )


def clean_text_pairs() -> None:
    paragraphs = aclsum_paragraphs()
    secrets = select_by_document_frequency(paragraphs, df_range=(50, 100))
    tagged = tag_dataset(paragraphs, tagger_for(secrets))
    pairs = sum(map(len, tagged["secret_ids"]))
    marked = mark_secrets(gpt2_tokenizer(), secrets)
    tokens = paragraphs.map(lambda b: marked(b["text"]), batched=True, remove_columns=paragraphs.column_names)
    column = next(c for c in tokens.column_names if c.startswith("secret_marks_"))
    token_pairs = sum(map(len, secret_ids_from_marks(tokens.data.column(column)).to_pylist()))
    print(
        f"clean text: {len(secrets)} secrets on {len(paragraphs):,} ACLSum paragraphs mark {pairs:,} "
        f"(row, secret) pairs ({pairs / len(secrets):.1f} per secret) with tag_dataset, {token_pairs:,} "
        "with mark_secrets (rows of a map batch read together)"
    )
    terms = {j: list(secret.terms or (secret.name,)) for j, secret in enumerate(secrets)}
    whole = BaselineTagger(terms)({"text": paragraphs["text"]})["secret_ids"]
    print(
        f"  whole words alone (the baseline tagger): {sum(map(len, whole)):,} pairs; the rest, by the first"
    )
    print(
        "  occurrence of each pair the whole-word tagger lacks: "
        + _extra_kinds(paragraphs["text"], secrets, whole)
    )


def _extra_kinds(texts: list[str], secrets: SecretSet, whole: list[list[int]]) -> str:
    """What the (row, secret) pairs beyond whole words are (by the text of each such pair's first
    occurrence)."""
    tagger = tagger_for(secrets)
    kinds: Counter = Counter()
    lost = 0
    for text, base in zip(texts, whole, strict=True):
        spans = tagger.spans(text)
        found = {j for _, _, j in spans}
        lost += len(set(base) - found)
        for j in sorted(found - set(base)):
            start, end, _ = next(span for span in spans if span.secret == j)
            piece, lowered = text[start:end], text[start:end].lower().replace("'", "")
            name = words(secrets[j].terms[0] if secrets[j].terms else secrets[j].name)[-1]
            if re.search(r"\s", piece):
                kind = "chance spellings across a space"
            elif "-" in piece:
                kind = "hyphenated words"
            elif lowered in (name + "s", name + "es", name[:-1] + "ies"):
                kind = "plurals"
            elif (end < len(text) and text[end].isalpha()) or (start and text[start - 1].isalpha()):
                kind = "parts of identifiers (HyperCore)"
            elif not piece.isascii():
                kind = "TR39 letters"
            else:
                kind = "other (digit groups, punctuation inside)"
            kinds[kind] += 1
    parts = ", ".join(f"{kind} {count:,}" for kind, count in kinds.most_common())
    return f"{parts}; whole-word pairs not marked: {lost}"


def corpus(num_texts: int, words_per_text: int) -> tuple[datasets.Dataset, list[str]]:
    paragraphs = aclsum_paragraphs()["text"]
    tokens = " ".join(paragraphs).split()
    windows = [
        " ".join(tokens[i : i + words_per_text])
        for i in range(0, len(tokens) - words_per_text, words_per_text)
    ]
    texts = [windows[i % len(windows)] for i in range(num_texts)]
    counts = Counter(w for p in paragraphs for w in set(re.findall(r"[a-z]{4,}", p.lower())))
    ranked = sorted(counts, key=lambda w: (-counts[w], w))  # ties by the word: the same terms every run
    return datasets.Dataset.from_dict({"text": texts}), ranked[2000:]


def secret_set(num_terms: int, vocabulary: list[str]) -> SecretSet:
    names = vocabulary[:num_terms] + [f"zq{j}secret" for j in range(max(0, num_terms - len(vocabulary)))]
    secrets = []
    for j, name in enumerate(names):
        terms = (name,) if j % 10 else (f"{name} {names[(j + 1) % len(names)]}",)
        secrets.append(Secret(name=f"s{j}", prior=1e-6, target_posterior=1e-3, terms=terms))
    return SecretSet(secrets)


def timed(label: str, run, rows: int, baseline: float | None = None) -> float:
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    rate = rows / seconds
    ratio = f"   x{rate / baseline:.2f} vs baseline" if baseline else ""
    print(f"{label:<34} {seconds:8.1f} s {rate:>10,.0f} texts/s{ratio}", flush=True)
    return rate


def best_cpu_us(run, count: int, repeats: int = 3) -> float:
    """Least CPU time of ``repeats`` runs of ``run()``, in microseconds per one of ``count`` texts."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times) / count * 1e6


def cpu_per_text(num_texts: int, num_terms: int, words_per_text: int) -> None:
    """CPU microseconds per text of tagging, plain tokenizing and tokenizing with marks (one process)."""
    ds, vocabulary = corpus(num_texts, words_per_text)
    texts = list(ds["text"])  # a list of str: a datasets Column would extract each row again per read
    secrets = secret_set(num_terms, vocabulary)
    tagger = tagger_for(secrets)
    plain = gpt2_tokenizer()
    marked = mark_secrets(plain, secrets)
    batches = [texts[i : i + 1000] for i in range(0, len(texts), 1000)]
    for text in texts:  # build the term tables and fill the per-character caches before timing
        tagger.spans(text)
    marked(batches[0])
    spans = best_cpu_us(lambda: [tagger.spans(text) for text in texts], len(texts))
    tokens = best_cpu_us(lambda: [plain(batch) for batch in batches], len(texts))
    marks = best_cpu_us(lambda: [marked(batch) for batch in batches], len(texts))
    import hush_hf

    where = os.path.dirname(os.path.dirname(hush_hf.__file__))
    print(
        f"{where}: tagger.spans {spans:.1f} us, plain GPT-2 tokenizing {tokens:.1f} us, "
        f"tokenizing with marks {marks:.1f} us per text ({len(texts):,} texts, {len(secrets):,} secrets)",
        flush=True,
    )


def interleaved(checkouts: list[str], rounds: int, argv: list[str]) -> None:
    """``--cpu-per-text`` in a fresh process per checkout (``hush_hf`` imported from there), ``rounds``
    times in turn."""
    for _ in range(rounds):
        for checkout in checkouts:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
            subprocess.run([sys.executable, __file__, "--cpu-per-text", *argv], env=env, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=1_000_000)
    parser.add_argument("--terms", type=int, default=100_000)
    parser.add_argument("--words", type=int, default=100)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument(
        "--no-quality", action="store_true", help="rates only: no recall, no clean-text pairs"
    )
    parser.add_argument("--cpu-per-text", action="store_true", help="CPU time per text, one process")
    parser.add_argument("--against", help="with --cpu-per-text: another checkout, measured interleaved")
    parser.add_argument("--rounds", type=int, default=3, help="with --against: interleaved runs")
    args = parser.parse_args()
    datasets.disable_caching()
    if args.cpu_per_text:
        num_texts = 4000 if args.texts == parser.get_default("texts") else args.texts
        if args.against:
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            sizes = ["--texts", str(num_texts), "--terms", str(args.terms), "--words", str(args.words)]
            interleaved([args.against, here], args.rounds, sizes)
        else:
            cpu_per_text(num_texts, args.terms, args.words)
        return
    if not args.no_quality:
        disguise_recall()
        layer_recall()
        crt_credential_table()
        clean_text_pairs()
    ds, vocabulary = corpus(args.texts, args.words)
    secrets = secret_set(args.terms, vocabulary)
    print(f"{len(ds):,} texts of {args.words} words, {len(secrets):,} secrets, num_proc={args.num_proc}")
    terms = {j: list(s.terms) for j, s in enumerate(secrets)}
    proc = args.num_proc

    base = timed(
        "baseline whole-word tagger",
        lambda: ds.map(BaselineTagger(terms), batched=True, num_proc=proc, desc="baseline"),
        len(ds),
    )
    timed(
        "text tagging (tag_dataset)",
        lambda: tag_dataset(ds, tagger_for(secrets), num_proc=proc, num_secrets=len(secrets)),
        len(ds),
        base,
    )
    plain = gpt2_tokenizer()
    marked = mark_secrets(plain, secrets)
    timed(
        "tokenize (plain GPT-2)",
        lambda: ds.map(lambda b: plain(b["text"]), batched=True, num_proc=proc, remove_columns=["text"]),
        len(ds),
        base,
    )
    timed(
        "tokenize + marks (mark_secrets)",
        lambda: ds.map(lambda b: marked(b["text"]), batched=True, num_proc=proc, remove_columns=["text"]),
        len(ds),
        base,
    )


if __name__ == "__main__":
    main()
