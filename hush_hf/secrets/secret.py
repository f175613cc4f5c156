"""One secret: the user's identifier, its prior p and target posterior r (Hush, Definition 3.1)."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

from hush_hf.secrets.matching import regex_error_kind, term_key


def check_probability(field: str, value: object) -> float:
    """``value`` as a float in (0, 1); a ``ValueError`` naming ``field`` and the value otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{field} must be a real number, got a {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{field}={number!r} must be finite")
    if not 0.0 < number < 1.0:
        raise ValueError(f"{field}={number!r} must lie in the open interval (0, 1)")
    return number


def check_terms(terms: object) -> tuple[str, ...]:
    """``terms`` as a tuple of strings that each contain at least one word.

    A term with no word characters (e.g. ``"!!"``) could never match and is refused rather than
    silently ignored. Messages give the term's position, never its text.
    """
    if isinstance(terms, str) or not isinstance(terms, (tuple, list)):
        raise ValueError(f"terms must be a list or tuple of strings, got a {type(terms).__name__}")
    for k, term in enumerate(terms):
        if not isinstance(term, str):
            raise ValueError(f"terms[{k}] must be a string, got a {type(term).__name__}")
        if not term_key(term, case_sensitive=True):
            raise ValueError(f"terms[{k}] contains no word characters, so it can never match")
    return tuple(terms)


def check_pattern(pattern: object) -> str | None:
    """``pattern`` if it is ``None`` or a compilable regular expression (message never shows it)."""
    if pattern is None:
        return None
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"pattern must be a non-empty string or None, got a {type(pattern).__name__}")
    try:
        re.compile(pattern)
    except re.error as error:
        # The kind and position only: error.msg quotes group names, escapes and ranges of the pattern.
        raise ValueError(
            f"pattern is not a valid regular expression: {regex_error_kind(error)} at position {error.pos}"
        ) from None
    return pattern


@dataclass(frozen=True, repr=False)
class Secret:
    """A secret s_j with prior p_j and target posterior r_j, 0 < p_j < r_j < 1 (Hush, Def. 3.1).

    An attacker's chance of reconstructing the secret without the model is ``prior``; training must
    keep it at most ``target_posterior`` with the model. Examples are marked as containing the
    secret by any of its ``terms`` (words or phrases, matched as in :mod:`hush_hf.secrets.matching`)
    or by its ``pattern`` (a regular expression, searched in the raw and the normalised text, or in
    the raw text only with ``raw_pattern=True``); with neither, the ``name`` itself is the term.

    ``name`` may be the secret string itself, so it (and the terms and pattern) never appears in
    ``repr``, ``str`` or error messages.
    """

    name: str
    prior: float
    target_posterior: float
    terms: tuple[str, ...] = ()
    pattern: str | None = None
    raw_pattern: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a non-empty string, got a {type(self.name).__name__}")
        if not self.name:
            raise ValueError("name must be a non-empty string, got an empty string")
        if not self.name.strip():
            raise ValueError("name must hold a character other than spaces, got only spaces")
        prior = check_probability("prior", self.prior)
        target = self.target_posterior
        if isinstance(target, bool) or not isinstance(target, numbers.Real):
            raise ValueError(f"target_posterior must be a real number, got a {type(target).__name__}")
        target = float(target)
        if not math.isfinite(target):
            raise ValueError(f"target_posterior={target!r} must be finite")
        if target >= 1.0:
            raise ValueError(f"target_posterior={target!r} must be below 1")
        if target <= prior:
            raise ValueError(f"target_posterior={target!r} must exceed prior={prior!r}")
        object.__setattr__(self, "prior", prior)
        object.__setattr__(self, "target_posterior", target)
        object.__setattr__(self, "terms", check_terms(self.terms))
        object.__setattr__(self, "pattern", check_pattern(self.pattern))
        if not self.terms and self.pattern is None and not term_key(self.name, case_sensitive=True):
            raise ValueError(
                "name is the secret's only term (no terms or pattern) but contains no word characters, "
                "so it can never match: give terms or a pattern"
            )
        if not isinstance(self.raw_pattern, bool):
            raise ValueError(f"raw_pattern must be True or False, got a {type(self.raw_pattern).__name__}")

    def __repr__(self) -> str:
        terms = f"<{len(self.terms)} hidden>" if self.terms else "()"
        pattern = "<hidden>" if self.pattern is not None else "None"
        return (
            f"Secret(name=<hidden>, prior={self.prior!r}, target_posterior={self.target_posterior!r}, "
            f"terms={terms}, pattern={pattern}"
            f"{', raw_pattern=True' if self.raw_pattern else ''})"
        )

    __str__ = __repr__
