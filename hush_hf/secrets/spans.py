"""The public span API: where in a text each secret occurs (for marking tokens, redaction, audits)."""

from __future__ import annotations

from pathlib import Path

from hush_hf.secrets.matching import SecretSpan
from hush_hf.secrets.secret_set import SecretSet
from hush_hf.secrets.taggers import Tagger, tagger_for

_TAGGERS: dict[int, tuple[SecretSet, Tagger]] = {}


def secret_spans(text: str, secrets: SecretSet | Tagger | str | Path) -> list[SecretSpan]:
    """Every occurrence of every secret in ``text`` as sorted ``SecretSpan(start, end, secret)``.

    Offsets index the *original* ``text`` (``text[start:end]`` covers the occurrence, escapes and
    all), whatever normalisation found it (rules: :mod:`hush_hf.secrets.matching`). ``secrets``: a
    :class:`SecretSet` (its tagger is built once and reused), a secrets file, or a :class:`Tagger`.
    """
    if not isinstance(text, str):
        raise ValueError(f"secret_spans: text must be a string, got a {type(text).__name__}")
    if isinstance(secrets, Tagger):
        return secrets.spans(text)
    if isinstance(secrets, (str, Path)):
        secrets = SecretSet.load(secrets)
    if not isinstance(secrets, SecretSet):
        raise ValueError(
            "secret_spans: secrets must be a SecretSet, a secrets file or a Tagger, "
            f"got a {type(secrets).__name__}"
        )
    cached = _TAGGERS.get(id(secrets))
    if cached is None or cached[0] is not secrets:
        cached = (secrets, tagger_for(secrets))
        _TAGGERS.clear()  # one cached set: a long-lived process switching sets does not grow
        _TAGGERS[id(secrets)] = cached
    return cached[1].spans(text)
