"""Confidentially Redacted Training (CRT, Zhao, Li and Wang), on top of Hush.

CRT Alg. 1: ``dedup_dataset`` (line 1), ``redact_dataset`` with policies pi and pi_c (lines 2-4: mask
what pi finds, mark rows public when nothing is found), then train public rows with ordinary steps and
private rows with DP steps (``SecretProtectionConfig(crt_schedule=...)``, lines 5-8).
``bayesian_confidentiality`` is Prop. 6 / Thm. 8.3.
"""

from hush_hf.crt.confidentiality import (
    bayesian_confidentiality,
    crt_section,
    example_epsilon,
    occurrences_section,
)
from hush_hf.crt.dedup import DedupReport, dedup_dataset, occurrence_counts, sentence_spans
from hush_hf.crt.policies import POLICY_NAMES, Policy, build_policies, secrets_policy
from hush_hf.crt.redaction import (
    DEFAULT_MASK_TOKEN,
    MASKED_SPANS_COLUMN,
    PUBLIC_COLUMN,
    RedactionReport,
    check_mask_token,
    redact_dataset,
)
from hush_hf.crt.spans import SecretSpanFinder, Span, merge_spans

__all__ = [
    "DEFAULT_MASK_TOKEN",
    "MASKED_SPANS_COLUMN",
    "POLICY_NAMES",
    "PUBLIC_COLUMN",
    "DedupReport",
    "Policy",
    "RedactionReport",
    "SecretSpanFinder",
    "Span",
    "bayesian_confidentiality",
    "crt_section",
    "example_epsilon",
    "build_policies",
    "check_mask_token",
    "dedup_dataset",
    "merge_spans",
    "occurrence_counts",
    "occurrences_section",
    "redact_dataset",
    "secrets_policy",
    "sentence_spans",
]
