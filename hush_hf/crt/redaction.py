"""Redact_pi and the public/private split of CRT (Alg. 1, lines 2-4), as one ``datasets.map`` step.

Every span any policy pi finds is replaced by ``mask_token`` (overlapping spans merged, one mask per
merged span). A row is *public* (column ``crt_public``) when no policy of pi nor of the conservative
pi_c marks any of it, it holds no mask token (CRT Sec. 3.2: "every data point that contains a <MASK>
requires protection", e.g. a sentence dedup removed) and, given the plan's secrets, their own matcher
(the one that tags and marks the plan's examples, :func:`hush_hf.secrets.tagger_for`) finds none of them
in it, the rows of each ``datasets.map`` batch read one after the other as a script concatenating them
would (an occurrence spanning two rows makes both private); every other row is private.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from hush_hf.crt.policies import Policy
from hush_hf.crt.spans import merge_spans

logger = logging.getLogger(__name__)

PUBLIC_COLUMN = "crt_public"
MASKED_SPANS_COLUMN = "crt_masked_spans"
DEFAULT_MASK_TOKEN = "<MASK>"
_COUNTS = "_crt_policy_counts"
_WHOLE = "_crt_whole_masked"


@dataclass
class RedactionReport:
    """What redaction did, in counts only (no text): per policy the rows it marked and spans it found."""

    rows: int
    private_rows: int
    public_rows: int
    whole_rows_masked: int
    mask_token: str
    mask_token_added: bool
    policies: dict[str, dict[str, int]] = field(default_factory=dict)
    conservative_policies: list[str] = field(default_factory=list)
    marks_everything: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_mask_token(mask_token: str, tokenizer: Any = None, *, add_mask_token: bool = False) -> bool:
    """ValueError unless ``tokenizer`` knows ``mask_token`` as one token; returns True when it was added.

    ``add_mask_token=True`` adds it as a special token instead of failing; the model's embeddings must
    then be resized (``model.resize_token_embeddings(len(tokenizer))``), which is logged.
    """
    if not isinstance(mask_token, str) or not mask_token.strip():
        raise ValueError(f"mask_token must be a non-empty string, got {mask_token!r}")
    if tokenizer is None:
        return False
    if mask_token in tokenizer.get_vocab():
        return False
    pieces = tokenizer.tokenize(mask_token)
    if not add_mask_token:
        raise ValueError(
            f"mask_token {mask_token!r} is not a token of the tokenizer (it splits into {len(pieces)} "
            "tokens): pass add_mask_token=True (--add-mask-token) to add it as a special token, or use "
            f"one the tokenizer has (mask_token={tokenizer.mask_token!r}, unk_token={tokenizer.unk_token!r})"
        )
    tokenizer.add_tokens([mask_token], special_tokens=True)
    logger.warning(
        "added %r to the tokenizer as a special token (vocabulary now %d): resize the model's embeddings "
        "with model.resize_token_embeddings(len(tokenizer)) and save the tokenizer with the model",
        mask_token,
        len(tokenizer),
    )
    return True


class _Redactor:
    """The ``datasets.map`` function (batched): mask, split public/private, count per policy."""

    def __init__(
        self,
        policies: list[Policy],
        conservative: list[Policy],
        text_column: str,
        mask: str,
        matcher: Any = None,
    ):
        self.policies, self.conservative = policies, conservative
        self.text_column, self.mask, self.matcher = text_column, mask, matcher

    def __call__(self, batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        texts, public, masked, counts, whole = [], [], [], [], []
        for row, text in zip(indices, batch[self.text_column], strict=True):
            if not isinstance(text, str):
                raise ValueError(
                    f"row {row}: column {self.text_column!r} must hold strings, got a {type(text).__name__}"
                )
        holds_secret = [False] * len(indices)
        if self.matcher is not None:
            holds_secret = [bool(spans) for spans in self.matcher.batch_spans(batch[self.text_column])]
        for row, text, secret in zip(indices, batch[self.text_column], holds_secret, strict=True):
            found, row_counts = [], []
            for policy in self.policies:
                try:
                    spans = policy(text)
                except ValueError as error:
                    raise ValueError(f"row {row}: {error}") from error.__cause__
                found.extend(spans)
                row_counts.append(len(spans))
            marked_by_conservative = False
            for policy in self.conservative:
                try:
                    hits = policy(text)
                except ValueError as error:
                    raise ValueError(f"row {row}: {error}") from error.__cause__
                row_counts.append(len(hits))
                marked_by_conservative |= bool(hits)
            merged = merge_spans(found)
            out, last = [], 0
            for start, end in merged:
                out += [text[last:start], self.mask]
                last = end
            redacted = "".join(out) + text[last:]
            fallback = any(p.residual is not None and p.residual(redacted) for p in self.policies)
            if fallback:  # the span finder missed what the tagger sees: mask everything
                redacted = self.mask
            texts.append(redacted)
            masked.append(len(merged))
            whole.append(fallback)
            counts.append(row_counts)
            public.append(not merged and not marked_by_conservative and not secret and self.mask not in text)
        return {
            self.text_column: texts,
            PUBLIC_COLUMN: public,
            MASKED_SPANS_COLUMN: masked,
            _COUNTS: counts,
            _WHOLE: whole,
        }


def redact_dataset(
    dataset: Any,
    policies: list[Policy],
    *,
    text_column: str = "text",
    conservative_policies: list[Policy] | None = None,
    mask_token: str = DEFAULT_MASK_TOKEN,
    tokenizer: Any = None,
    add_mask_token: bool = False,
    num_proc: int | None = None,
    secrets: Any = None,
    case_sensitive: bool = False,
    batch_size: int = 1000,
) -> tuple[Any, RedactionReport]:
    """``(redacted dataset, report)``: CRT Alg. 1 lines 2-4 on ``dataset[text_column]``.

    ``policies`` is pi: their spans are masked. ``conservative_policies`` is pi_c (high recall): a row
    it marks is private but nothing is masked. ``secrets`` (the plan's :class:`~hush_hf.secrets.SecretSet`)
    keeps private every row its matcher marks, whatever the policies (see the module docstring;
    ``batch_size`` rows are read together, as the tokenizing ``map`` that follows should). Adds the bool
    column ``crt_public`` (train it with ``SecretProtectionConfig(crt_schedule=...)``) and
    ``crt_masked_spans``. ``tokenizer`` (optional) is checked to know ``mask_token`` (see
    :func:`check_mask_token`). A policy that marks every row is allowed and said (logged and in
    ``report.marks_everything``).
    """
    import datasets

    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(
            f"redact_dataset: dataset must be a datasets.Dataset, got a {type(dataset).__name__}"
        )
    if text_column not in dataset.column_names:
        raise ValueError(
            f"redact_dataset: text_column {text_column!r} is not a column; columns: {dataset.column_names}"
        )
    conservative = list(conservative_policies or [])
    for k, policy in enumerate([*policies, *conservative]):
        if not isinstance(policy, Policy):
            raise ValueError(
                f"redact_dataset: policy {k} must be a Policy (wrap functions in Policy(name, fn)), "
                f"got a {type(policy).__name__}"
            )
    if not policies and not conservative:
        raise ValueError("redact_dataset: no policy given")
    for column in (PUBLIC_COLUMN, MASKED_SPANS_COLUMN):
        if column in dataset.column_names:
            raise ValueError(f"redact_dataset: dataset already has a {column!r} column (redacted twice?)")
    matcher = None
    if secrets is not None:
        from hush_hf.secrets import SecretSet, tagger_for

        if not isinstance(secrets, SecretSet):
            raise ValueError(f"redact_dataset: secrets must be a SecretSet, got a {type(secrets).__name__}")
        matcher = tagger_for(secrets, case_sensitive=case_sensitive)
    added = check_mask_token(mask_token, tokenizer, add_mask_token=add_mask_token)
    redacted = dataset.map(
        _Redactor(list(policies), conservative, text_column, mask_token, matcher),
        batched=True,
        batch_size=batch_size,
        with_indices=True,
        num_proc=num_proc,
        desc="Redacting",
    )
    counts = np.asarray(redacted[_COUNTS], dtype=np.int64).reshape(len(redacted), -1)
    whole = int(np.sum(redacted[_WHOLE]))
    public = int(np.sum(redacted[PUBLIC_COLUMN]))
    redacted = redacted.remove_columns([_COUNTS, _WHOLE])
    names = [p.name for p in policies] + [f"{p.name} (conservative)" for p in conservative]
    per_policy = {
        name: {"rows_marked": int(np.sum(counts[:, k] > 0)), "spans": int(np.sum(counts[:, k]))}
        for k, name in enumerate(names)
    }
    everything = [n for n, c in per_policy.items() if len(redacted) and c["rows_marked"] == len(redacted)]
    for name in everything:
        logger.warning(
            "redaction policy %r marks every one of the %d rows: the public set is empty and CRT reduces "
            "to DP training on all data",
            name,
            len(redacted),
        )
    if whole:
        logger.warning(
            "%d rows still contained a tagged secret after their spans were masked; those rows were masked "
            "whole",
            whole,
        )
    report = RedactionReport(
        rows=len(redacted),
        private_rows=len(redacted) - public,
        public_rows=public,
        whole_rows_masked=whole,
        mask_token=mask_token,
        mask_token_added=added,
        policies=per_policy,
        conservative_policies=[p.name for p in conservative],
        marks_everything=everything,
    )
    return redacted, report
