"""Dedup of CRT Alg. 1 (line 1): exact duplicate rows, near-duplicate rows, repeated sentences.

- exact rows: a SHA-256 of each text (a ``datasets.map`` step); every row after the first with the
  same hash is removed;
- near-duplicate rows (optional): MinHash signatures of word 5-shingles and MinHash LSH (datasketch),
  a candidate kept as a duplicate when its estimated Jaccard similarity is >= ``near_threshold``;
  rows are visited in order and a row is removed when it is near an earlier kept row;
- repeated sentences (only when asked, ``sentences=True``): from the second occurrence on, a sentence
  (whitespace-normalised, exact) is replaced by the mask token (CRT Sec. 3.2), so a secret repeated in
  the same sentence counts once (CRT Prop. 7: group confidentiality depends on the unique occurrences
  only). Off by default: a "sentence" ends at every line break, so in code it is a line, and masking
  repeated lines (``return None``, ``import os``, closing brackets) mangles nearly every file (6,444
  lines in 198 of 200 standard-library files) without hiding any secret.

A sentence is a run of text ending at ``.``, ``!`` or ``?`` followed by white space, at a line break,
or at the end of the text (a regular expression: no sentence-splitter model is available offline).
The :class:`DedupReport` holds counts and row indices only, never text.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from hush_hf.crt.redaction import DEFAULT_MASK_TOKEN

SENTENCE = re.compile(r"\S[^\n]*?(?:[.!?](?=\s|$)|(?=\n)|$)")
SPACE = re.compile(r"\s+")
_HASH = "_crt_hash"
_SENTENCE_HASHES = "_crt_sentence_hashes"


@dataclass
class DedupReport:
    """What dedup removed: ``(removed row, kept row)`` index pairs of the input, and masked sentences."""

    rows_in: int
    rows_out: int
    exact_duplicates: list[tuple[int, int]] = field(default_factory=list)
    near_duplicates: list[tuple[int, int]] = field(default_factory=list)
    sentences_masked: int = 0
    rows_with_masked_sentences: int = 0
    near_threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"dedup: {self.rows_in} rows -> {self.rows_out}; removed {len(self.exact_duplicates)} exact and "
            f"{len(self.near_duplicates)} near duplicates; masked {self.sentences_masked} repeated sentences "
            f"in {self.rows_with_masked_sentences} rows"
        )


def sentence_spans(text: str) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each sentence of ``text`` (see the module docstring)."""
    for m in SENTENCE.finditer(text):
        yield m.start(), m.end()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _sentence_key(sentence: str) -> str:
    return _digest(SPACE.sub(" ", sentence).strip())


class _Hasher:
    def __init__(self, text_column: str) -> None:
        self.text_column = text_column

    def __call__(self, batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        hashes, sentences = [], []
        for row, text in zip(indices, batch[self.text_column], strict=True):
            if not isinstance(text, str):
                raise ValueError(
                    f"row {row}: column {self.text_column!r} must hold strings, got a {type(text).__name__}"
                )
            hashes.append(_digest(text))
            sentences.append([_sentence_key(text[s:e]) for s, e in sentence_spans(text)])
        return {_HASH: hashes, _SENTENCE_HASHES: sentences}


class _SentenceMasker:
    def __init__(self, text_column: str, masked: dict[int, set[int]], mask: str) -> None:
        self.text_column, self.masked, self.mask = text_column, masked, mask

    def __call__(self, batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        out = []
        for row, text in zip(indices, batch[self.text_column], strict=True):
            drop = self.masked.get(row)
            if not drop:
                out.append(text)
                continue
            pieces, last = [], 0
            for k, (start, end) in enumerate(sentence_spans(text)):
                if k in drop:
                    pieces += [text[last:start], self.mask]
                    last = end
            out.append("".join(pieces) + text[last:])
        return {self.text_column: out}


def _shingles(text: str, size: int) -> set[bytes]:
    tokens = SPACE.sub(" ", text).strip().lower().split(" ")
    if len(tokens) <= size:
        return {" ".join(tokens).encode("utf-8", "surrogatepass")}
    return {
        " ".join(tokens[k : k + size]).encode("utf-8", "surrogatepass") for k in range(len(tokens) - size + 1)
    }


def _near_duplicates(
    texts: list[str], threshold: float, num_perm: int, shingle_size: int, seed: int
) -> dict[int, int]:
    """``{removed position: kept position}`` among ``texts`` by MinHash LSH (first kept wins)."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    signatures: dict[int, Any] = {}
    removed: dict[int, int] = {}
    for k, text in enumerate(texts):
        signature = MinHash(num_perm=num_perm, seed=seed)
        signature.update_batch(list(_shingles(text, shingle_size)))
        near = [c for c in lsh.query(signature) if signatures[c].jaccard(signature) >= threshold]
        if near:
            removed[k] = min(near)
            continue
        lsh.insert(k, signature)
        signatures[k] = signature
    return removed


def dedup_dataset(
    dataset: Any,
    *,
    text_column: str = "text",
    sentences: bool = False,
    near_threshold: float | None = None,
    num_perm: int = 128,
    shingle_size: int = 5,
    mask_token: str = DEFAULT_MASK_TOKEN,
    seed: int = 1,
    num_proc: int | None = None,
) -> tuple[Any, DedupReport]:
    """``(deduplicated dataset, report)``; see the module docstring. Row order is kept.

    Exact duplicate rows are always removed; ``near_threshold`` in (0, 1] turns on near-duplicate
    removal (None: off) and ``sentences=True`` the masking of repeated sentences (lines).
    """
    import datasets

    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(f"dedup_dataset: dataset must be a datasets.Dataset, got a {type(dataset).__name__}")
    if text_column not in dataset.column_names:
        raise ValueError(
            f"dedup_dataset: text_column {text_column!r} is not a column; columns: {dataset.column_names}"
        )
    if near_threshold is not None and not (
        isinstance(near_threshold, (int, float)) and 0 < near_threshold <= 1
    ):
        raise ValueError(f"dedup_dataset: near_threshold must be in (0, 1] or None, got {near_threshold!r}")
    if not isinstance(num_perm, int) or num_perm < 16:
        raise ValueError(f"dedup_dataset: num_perm must be an integer >= 16, got {num_perm!r}")
    if not isinstance(shingle_size, int) or shingle_size < 1:
        raise ValueError(f"dedup_dataset: shingle_size must be a positive integer, got {shingle_size!r}")
    if not isinstance(mask_token, str) or not mask_token.strip():
        raise ValueError(f"dedup_dataset: mask_token must be a non-empty string, got {mask_token!r}")
    rows_in = len(dataset)
    hashed = dataset.map(
        _Hasher(text_column), batched=True, with_indices=True, num_proc=num_proc, desc="Hashing"
    )
    first: dict[str, int] = {}
    exact: list[tuple[int, int]] = []
    keep: list[int] = []
    for row, digest in enumerate(hashed[_HASH]):
        if digest in first:
            exact.append((row, first[digest]))
        else:
            first[digest] = row
            keep.append(row)
    near: list[tuple[int, int]] = []
    if near_threshold is not None and keep:
        texts = hashed.select(keep)[text_column]
        removed = _near_duplicates(texts, float(near_threshold), num_perm, shingle_size, seed)
        near = [(keep[k], keep[v]) for k, v in sorted(removed.items())]
        keep = [row for k, row in enumerate(keep) if k not in removed]
    kept = hashed.select(keep)
    masked: dict[int, set[int]] = {}
    if sentences:
        seen: set[str] = set()
        for position, keys in enumerate(kept[_SENTENCE_HASHES]):
            for k, key in enumerate(keys):
                if key in seen:
                    masked.setdefault(position, set()).add(k)
                seen.add(key)
    kept = kept.remove_columns([_HASH, _SENTENCE_HASHES])
    if masked:
        kept = kept.map(
            _SentenceMasker(text_column, masked, mask_token),
            batched=True,
            with_indices=True,
            num_proc=num_proc,
            desc="Masking repeated sentences",
        )
    report = DedupReport(
        rows_in=rows_in,
        rows_out=len(kept),
        exact_duplicates=exact,
        near_duplicates=near,
        sentences_masked=int(sum(len(v) for v in masked.values())),
        rows_with_masked_sentences=len(masked),
        near_threshold=near_threshold,
    )
    return kept, report


def occurrence_counts(dataset: Any, secret_set: Any, *, text_column: str = "text") -> dict[str, np.ndarray]:
    """Per secret j (CRT Prop. 7): ``rows`` (examples containing j), ``sentences`` (sentences containing
    j, with repeats) and ``unique`` (distinct such sentences, what dedup leaves). Arrays of length J.

    Tagged with the secrets' own tagger, sentence by sentence (a term crossing a sentence boundary is
    counted in ``rows`` only).
    """
    from hush_hf.secrets import tagger_for

    tagger = tagger_for(secret_set)
    size = len(secret_set)
    rows = np.zeros(size, dtype=np.int64)
    occurrences = np.zeros(size, dtype=np.int64)
    distinct: list[set[str]] = [set() for _ in range(size)]
    for text in dataset[text_column]:
        for j in tagger(text):
            rows[j] += 1
        for start, end in sentence_spans(text):
            sentence = text[start:end]
            found = tagger(sentence)
            if found:
                key = _sentence_key(sentence)
                for j in found:
                    occurrences[j] += 1
                    distinct[j].add(key)
    unique = np.array([len(d) for d in distinct], dtype=np.int64)
    return {"rows": rows, "sentences": occurrences, "unique": unique}
