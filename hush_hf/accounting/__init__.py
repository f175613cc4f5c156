"""Accounting: per-secret posterior bounds and noise calibration (Hush Sec. 3.3 and 4).

Accountants live in one table (``accountants.REGISTRY``; names in ``ACCOUNTANTS``, default first):
``tight`` (default; blow-up function of Hayes et al. 2023 from a pessimistic PLD), ``rdp`` (Stock et
al. 2022 with the exact Renyi divergence) and ``kl`` (Hush Lemma 3.2 with the exact KL divergence);
``register_accountant`` adds one. Names are imported on first use, so that reading the table (the
CLI's choices, the trainer config's check) does not import scipy.signal.
"""

from __future__ import annotations

from hush_hf.lazy_exports import lazy_exports

_EXPORTS = {
    "ACCOUNTANTS": "accountants",
    "DEFAULT_ACCOUNTANT": "accountants",
    "Accountant": "accountants",
    "get_accountant": "accountants",
    "register_accountant": "accountants",
    "LP_BUDGET_KINDS": "budgets",
    "bernoulli_kl": "budgets",
    "lp_budget": "budgets",
    "NoiseCalibration": "calibration",
    "calibrate_noise": "calibration",
    "posterior_bounds": "calibration",
    "SecretGroups": "groups",
    "validate_targets": "validation",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
