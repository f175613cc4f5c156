"""Tagging and marking throughput: texts/s of the span tagger and of tokenizing with secret marks.

    python bench/secret_marking.py                     # 1M texts of ~100 words, 100K terms, num_proc=2
    python bench/secret_marking.py --texts 100000      # a shorter run (what docs/benchmarks.md records)

Texts are ~100-word windows of the ACLSum paragraphs (offline asset), repeated to ``--texts``; terms are
ACLSum words past the 2,000 most frequent (so some occur) topped up with synthetic words, 10% of them
two-word phrases. Four ``Dataset.map(num_proc=...)`` runs, side by side:

- baseline: the whole-word text tagger hush_hf had before token marks (words() + dict look-ups);
- text tagging: ``tag_dataset(ds, tagger_for(secrets))`` (identifier split, plurals, escapes,
  confusables, hyphenation, unspaced scripts);
- tokenizing with the plain GPT-2 tokenizer (``run_clm``'s tokenize_function);
- tokenizing with ``mark_secrets(tokenizer, secrets)`` (the same plus the marks column).

Target (issue 8): text tagging no slower than the baseline; marking's cost is reported against both.
"""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter
from itertools import chain

import datasets

from hush_hf.assets.corpora import aclsum_paragraphs
from hush_hf.assets.tokenizer_assets import gpt2_tokenizer
from hush_hf.secrets import Secret, SecretSet, mark_secrets, tag_dataset, tagger_for
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


def corpus(num_texts: int, words_per_text: int) -> tuple[datasets.Dataset, list[str]]:
    paragraphs = aclsum_paragraphs()["text"]
    tokens = " ".join(paragraphs).split()
    windows = [
        " ".join(tokens[i : i + words_per_text])
        for i in range(0, len(tokens) - words_per_text, words_per_text)
    ]
    texts = [windows[i % len(windows)] for i in range(num_texts)]
    counts = Counter(w for p in paragraphs for w in set(re.findall(r"[a-z]{4,}", p.lower())))
    ranked = [w for w, _ in counts.most_common()]
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=1_000_000)
    parser.add_argument("--terms", type=int, default=100_000)
    parser.add_argument("--words", type=int, default=100)
    parser.add_argument("--num-proc", type=int, default=2)
    args = parser.parse_args()
    datasets.disable_caching()
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
