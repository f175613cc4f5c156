"""Secrets: what to protect (p_j, r_j) and which examples contain each (Hush, Sec. 3 and 5.1).

``Secret``/``SecretSet`` hold the specification; taggers and ``tag_dataset`` mark each example with
the indices of the secrets it contains; ``secret_spans`` gives where (character spans) and
``mark_secrets`` carries them onto a fast tokenizer's tokens (a per-token column that survives
chunking and packing); ``select_by_document_frequency`` reproduces the paper's
choice of secrets; ``secret_fingerprint`` gives keyed, non-reversible identifiers. Secret strings
never appear in reprs, logs or errors: secrets are referred to by index.
"""

from hush_hf.secrets.fingerprint import secret_fingerprint
from hush_hf.secrets.marks import SecretMarker, mark_secrets, secret_ids_from_marks
from hush_hf.secrets.matching import SecretSpan
from hush_hf.secrets.secret import Secret
from hush_hf.secrets.secret_set import SecretSet
from hush_hf.secrets.selection import (
    document_frequencies,
    rank_by_document_frequency,
    select_by_document_frequency,
)
from hush_hf.secrets.spans import secret_spans
from hush_hf.secrets.taggers import (
    CallableTagger,
    RegexTagger,
    Tagger,
    TermTagger,
    UnionTagger,
    tagger_for,
)
from hush_hf.secrets.tagging import tag_dataset
from hush_hf.secrets.words import words

__all__ = [
    "CallableTagger",
    "RegexTagger",
    "Secret",
    "SecretMarker",
    "SecretSet",
    "SecretSpan",
    "Tagger",
    "TermTagger",
    "UnionTagger",
    "document_frequencies",
    "mark_secrets",
    "rank_by_document_frequency",
    "secret_fingerprint",
    "secret_ids_from_marks",
    "secret_spans",
    "select_by_document_frequency",
    "tag_dataset",
    "tagger_for",
    "words",
]
