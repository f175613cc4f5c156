"""CRT's Bayesian confidentiality under redaction (CRT Prop. 6 and Thm. 8.3).

If training is (eps, delta)-Bayesian confidential for a secret x the policy pi misses, and pi misses a
share gamma of the secrets (false-negative rate, 1 - recall, under the secrets' distribution mu), then
training on Redact_pi(D) is (log(1 + gamma (e^eps - 1)), gamma delta)-Bayesian confidential (Prop. 6).
With a conservative policy pi_c of recall 1 - delta_2 deciding the public set, delta becomes
gamma delta + delta_2 (Thm. 8.3).
"""

from __future__ import annotations

import math


def _check_share(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{field} must be a number in [0, 1], got {value!r}")
    return float(value)


def bayesian_confidentiality(
    epsilon: float, delta: float, *, recall: float, conservative_recall: float = 1.0
) -> tuple[float, float]:
    """``(log(1 + gamma (e^eps - 1)), gamma delta + delta_2)`` with gamma = 1 - recall and
    delta_2 = 1 - conservative_recall (CRT Thm. 8.3); computed with ``log1p``/``expm1``."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon >= 0:
        raise ValueError(f"epsilon must be a number >= 0, got {epsilon!r}")
    delta = _check_share("delta", delta)
    gamma = 1.0 - _check_share("recall", recall)
    delta_2 = 1.0 - _check_share("conservative_recall", conservative_recall)
    infinite = math.isinf(epsilon)
    eps = (math.inf if gamma > 0 else 0.0) if infinite else math.log1p(gamma * math.expm1(epsilon))
    return eps, min(1.0, gamma * delta + delta_2)
