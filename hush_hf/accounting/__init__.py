"""Accounting: per-secret posterior bounds and noise calibration (Hush Sec. 3.3 and 4).

Three accountants (``ACCOUNTANTS``): ``tight`` (default; blow-up function of Hayes et al. 2023
from a pessimistic PLD), ``rdp`` (Stock et al. 2022 with the exact Renyi divergence) and ``kl``
(Hush Lemma 3.2 with the exact KL divergence).
"""

from hush_hf.accounting.budgets import bernoulli_kl, lp_budget
from hush_hf.accounting.calibration import NoiseCalibration, calibrate_noise, posterior_bounds
from hush_hf.accounting.groups import SecretGroups
from hush_hf.accounting.validation import ACCOUNTANTS, validate_targets

__all__ = [
    "ACCOUNTANTS",
    "NoiseCalibration",
    "SecretGroups",
    "bernoulli_kl",
    "calibrate_noise",
    "lp_budget",
    "posterior_bounds",
    "validate_targets",
]
