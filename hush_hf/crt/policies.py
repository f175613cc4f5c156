"""Redaction policies pi (CRT Sec. 3.2): ``policy(text) -> list[Span]``, the characters to mask.

A :class:`Policy` wraps a span function under a name; the name (never the text) is what errors and
reports show. :func:`build_policies` makes the named ones: ``secrets`` (the secrets' own terms and
patterns, via :mod:`hush_hf.crt.spans`), the offline detectors of :mod:`hush_hf.crt.detectors`
(``email``, ``phone``, ``credit_card``, ``iban``, ``ip``, ``credentials``) and ``pii`` (all of
``email``..``ip``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hush_hf.crt.detectors import DETECTORS, PII, phone_detector
from hush_hf.crt.spans import SecretSpanFinder, Span

POLICY_NAMES = ("secrets", "pii", *DETECTORS)


class Policy:
    """A named span function. ``residual(masked_text) -> bool``, when given, says whether the text
    still holds what the policy looks for after its spans were masked (then the whole text is masked)."""

    def __init__(
        self,
        name: str,
        fn: Callable[[str], Iterable[Any]],
        *,
        residual: Callable[[str], bool] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"Policy: name must be a non-empty string, got {name!r}")
        if not callable(fn):
            raise ValueError(f"Policy {name!r}: fn must be callable, got a {type(fn).__name__}")
        self.name, self.fn, self.residual = name, fn, residual

    def __repr__(self) -> str:
        return f"Policy({self.name!r})"

    def __call__(self, text: str) -> list[Span]:
        """The spans ``fn`` finds, checked: integer ``0 <= start < end <= len(text)``."""
        try:
            found = list(self.fn(text))
        except Exception as error:  # a policy's own failure: name it, never quote the text
            raise ValueError(f"redaction policy {self.name!r} raised {type(error).__name__}") from error
        spans = []
        for k, item in enumerate(found):
            try:
                start, end = item[0], item[1]
            except (TypeError, IndexError):
                raise ValueError(
                    f"redaction policy {self.name!r}: span {k} must be (start, end), "
                    f"got a {type(item).__name__}"
                ) from None
            ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (start, end))
            if not ok or not 0 <= start < end <= len(text):
                raise ValueError(
                    f"redaction policy {self.name!r}: span {k} must satisfy 0 <= start < end <= len(text) "
                    f"= {len(text)} with integers, got ({start!r}, {end!r})"
                )
            spans.append(Span(int(start), int(end), self.name))
        return spans


def secrets_policy(secret_set: Any, *, case_sensitive: bool = False) -> Policy:
    """pi from the secrets' own taggers; ``residual`` re-tags the masked text with the same tagger."""
    from hush_hf.secrets import tagger_for

    tagger = tagger_for(secret_set, case_sensitive=case_sensitive)
    return Policy(
        "secrets",
        SecretSpanFinder(secret_set, case_sensitive=case_sensitive),
        residual=lambda text: bool(tagger(text)),
    )


def build_policies(
    names: Sequence[str],
    *,
    secret_set: Any = None,
    case_sensitive: bool = False,
    phone_regions: Sequence[str] | None = None,
) -> list[Policy]:
    """The named policies, in order, each once (``pii`` expands to the PII detectors)."""
    if isinstance(names, str):
        names = [names]
    out: dict[str, Policy] = {}
    for name in names:
        if name not in POLICY_NAMES:
            raise ValueError(f"unknown redaction policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
        for each in PII if name == "pii" else (name,):
            if each in out:
                continue
            if each == "secrets":
                if secret_set is None:
                    raise ValueError("redaction policy 'secrets' needs a secrets file (secret_set)")
                out[each] = secrets_policy(secret_set, case_sensitive=case_sensitive)
            elif each == "phone" and phone_regions is not None:
                out[each] = Policy(each, phone_detector(phone_regions))
            else:
                out[each] = Policy(each, DETECTORS[each]())
    if not out:
        raise ValueError("no redaction policy given")
    return list(out.values())
