"""Accounting: per-secret posterior bounds and noise calibration (Hush Sec. 3.3 and 4)."""

from hush_hf.accounting.groups import SecretGroups

__all__ = ["SecretGroups"]
