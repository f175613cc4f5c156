"""Secrets: what to protect (p_j, r_j) and which examples contain each (Hush, Sec. 3 and 5.1).

``Secret``/``SecretSet`` hold the specification; taggers and ``tag_dataset`` mark each example with
the indices of the secrets it contains; ``select_by_document_frequency`` reproduces the paper's
choice of secrets; ``secret_fingerprint`` gives keyed, non-reversible identifiers. Secret strings
never appear in reprs, logs or errors: secrets are referred to by index.
"""

from hush_hf.secrets.fingerprint import secret_fingerprint
from hush_hf.secrets.secret import Secret
from hush_hf.secrets.secret_set import SecretSet
from hush_hf.secrets.selection import (
    document_frequencies,
    rank_by_document_frequency,
    select_by_document_frequency,
)
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
    "SecretSet",
    "Tagger",
    "TermTagger",
    "UnionTagger",
    "document_frequencies",
    "rank_by_document_frequency",
    "secret_fingerprint",
    "select_by_document_frequency",
    "tag_dataset",
    "tagger_for",
    "words",
]
