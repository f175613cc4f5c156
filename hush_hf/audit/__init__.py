"""Audit: attacks on a trained model, the privacy report and the model card (issue "Audit and publish").

- :mod:`~hush_hf.audit.canaries`: random canaries to insert and declare as secrets;
- :mod:`~hush_hf.audit.exposure`: canary exposure (Carlini et al. 2019);
- :mod:`~hush_hf.audit.extraction`: k-extractability by greedy decoding (Carlini et al. 2023);
- :mod:`~hush_hf.audit.membership`: loss and calibrated-loss membership inference, exact ROC;
- :mod:`~hush_hf.audit.reconstruction`: per-secret rank and posterior of the true value;
- :mod:`~hush_hf.audit.report` / :mod:`~hush_hf.audit.card`: report (JSON, Markdown, PNG) and model card;
- :mod:`~hush_hf.audit.run`: ``run_audit`` (``hush audit``); ``render_report`` is ``hush report``;
- :mod:`~hush_hf.audit.metrics`: the same metrics as offline ``evaluate`` modules.

Names are imported lazily, so ``import hush_hf.audit`` loads neither torch nor matplotlib.
"""

from __future__ import annotations

from hush_hf.lazy_exports import lazy_exports

_EXPORTS = {
    "CanarySpace": "canaries",
    "Canary": "canaries",
    "make_canaries": "canaries",
    "insert_canaries": "canaries",
    "canary_secret_records": "canaries",
    "save_canaries": "canaries",
    "load_canaries": "canaries",
    "exposure_from_rank": "exposure",
    "exact_exposure": "exposure",
    "estimated_exposure": "exposure",
    "canary_exposures": "exposure",
    "greedy_decode": "extraction",
    "extraction_attack": "extraction",
    "extraction_attack_on_texts": "extraction",
    "roc_curve": "membership",
    "roc_auc": "membership",
    "tpr_at_fpr": "membership",
    "evaluate_scores": "membership",
    "membership_attacks": "membership",
    "SecretProbe": "reconstruction",
    "probes_for_secrets": "reconstruction",
    "canary_probes": "reconstruction",
    "reconstruction_attack": "reconstruction",
    "build_privacy_report": "report",
    "write_privacy_report": "report",
    "render_report": "report",
    "build_model_card": "card",
    "write_protection_artifacts": "card",
    "run_audit": "run",
    "metric_path": "metrics",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
