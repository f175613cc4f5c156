"""hush_hf: per-secret reconstruction protection for Hugging Face training (Ganesh et al. 2025).

The pipeline, upstream to downstream: ``secrets`` (spec + taggers) -> ``planning`` (LP weights,
sampling probabilities) -> ``accounting`` (noise calibration, per-secret bounds) -> ``sampling``
(WeightedPoissonSampler) -> ``clipping`` (ghost norms) -> ``trainer`` -> ``audit``.
Public names are imported lazily so that ``import hush_hf`` stays fast.
"""

from __future__ import annotations

from hush_hf.lazy_exports import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "Secret": "hush_hf.secrets",
    "SecretSet": "hush_hf.secrets",
    "mark_secrets": "hush_hf.secrets",
    "secret_spans": "hush_hf.secrets",
    "prepare_secret_ids": "hush_hf.trainer.plan_setup",
    "ProtectionPlan": "hush_hf.planning",
    "plan_protection": "hush_hf.planning",
    "calibrate_noise": "hush_hf.accounting",
    "posterior_bounds": "hush_hf.accounting",
    "WeightedPoissonSampler": "hush_hf.sampling",
    "GhostClipper": "hush_hf.clipping",
    "SecretProtectionConfig": "hush_hf.trainer",
    "SecretProtectionTrainer": "hush_hf.trainer",
    "GhostClippingCallback": "hush_hf.trainer",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
