"""CRT's Bayesian confidentiality under redaction (CRT Prop. 6 and Thm. 8.3).

If training is (eps, delta)-Bayesian confidential for a secret x the policy pi misses, and pi misses a
share gamma of the secrets (false-negative rate, 1 - recall, under the secrets' distribution mu), then
training on Redact_pi(D) is (log(1 + gamma (e^eps - 1)), gamma delta)-Bayesian confidential (Prop. 6).
With a conservative policy pi_c of recall 1 - delta_2 deciding the public set, delta becomes
gamma delta + delta_2 (Thm. 8.3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

OCCURRENCE_KEYS = ("rows", "sentences", "unique")


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


def example_epsilon(max_sampling_prob: float, noise_multiplier: float, steps: int, delta: float) -> float:
    """eps at ``delta`` of one example in T DP steps: the Poisson-subsampled Gaussian mechanism at the
    largest sampling probability, composed T times, from a pessimistic privacy-loss distribution
    (dp_accounting's ``PLDAccountant``; an upper bound up to its stated discretisation). ``inf`` for
    sigma = 0. This is the (eps, delta) of CRT Thm. 8 for an occurrence of a secret no tagger marks.
    """
    from dp_accounting import dp_event, pld

    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if noise_multiplier == 0:
        return math.inf
    if max_sampling_prob == 0:
        return 0.0
    accountant = pld.PLDAccountant(value_discretization_interval=1e-3)
    step = dp_event.GaussianDpEvent(float(noise_multiplier))
    if max_sampling_prob < 1:
        step = dp_event.PoissonSampledDpEvent(float(max_sampling_prob), step)
    accountant.compose(dp_event.SelfComposedDpEvent(step, int(steps)))
    return float(accountant.get_epsilon(delta))


def occurrences_section(counts: Mapping[str, Any], num_secrets: int) -> dict[str, list[int]]:
    """Per secret index j (CRT Prop. 7): ``rows`` (examples containing j) and ``unique`` (distinct
    sentences containing j: what Dedup leaves, the group CRT's group confidentiality is over), and,
    when given, ``sentences`` (with repeats); checked and returned as lists of ints of length J.

    ``counts``: a :func:`hush_hf.crt.occurrence_counts` result or the ``secret_occurrences`` of a
    ``hush redact --secrets`` report. Counts only: no secret text.
    """
    if not isinstance(counts, Mapping):
        raise ValueError(f"occurrences must be a mapping of {OCCURRENCE_KEYS}, got {type(counts).__name__}")
    unknown = sorted(set(counts) - set(OCCURRENCE_KEYS))
    missing = [key for key in ("rows", "unique") if key not in counts]
    if unknown or missing:
        raise ValueError(
            f"occurrences must have keys rows and unique (and may have sentences); "
            f"missing {missing}, unknown {unknown}"
        )
    checked: dict[str, np.ndarray] = {}
    for key in (k for k in OCCURRENCE_KEYS if k in counts):
        values = np.asarray(counts[key], dtype=object)
        if values.ndim != 1 or values.size != num_secrets:
            raise ValueError(
                f"occurrences[{key!r}] must hold one count per secret ({num_secrets}), "
                f"got shape {values.shape}"
            )
        for j, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"occurrences[{key!r}][{j}] must be an integer >= 0, got {value!r}")
        checked[key] = values.astype(np.int64)
    bad = np.flatnonzero((checked["unique"] > 0) & (checked["rows"] == 0))
    if bad.size:
        raise ValueError(f"occurrences: secret {int(bad[0])} has unique sentences but no rows")
    if "sentences" in checked:
        bad = np.flatnonzero(checked["unique"] > checked["sentences"])
        if bad.size:
            raise ValueError(
                f"occurrences: secret {int(bad[0])} has more unique sentences "
                f"({int(checked['unique'][bad[0]])}) than sentences ({int(checked['sentences'][bad[0]])})"
            )
    return {key: values.tolist() for key, values in checked.items()}


def crt_section(
    plan: Any,
    *,
    recall: float | None,
    conservative_recall: float | None = None,
    delta: float = 1e-5,
    noise_multiplier: float | None = None,
    training: dict | None = None,
    occurrences: Mapping[str, Any] | None = None,
) -> dict:
    """The report's CRT section (JSON-ready): CRT Thm. 8.3 for the secrets the taggers do not mark.

    ``recall``: the measured recall 1 - gamma of the redaction policies pi on the kind of secret
    meant (None: not measured, and no confidentiality is stated); ``conservative_recall``: that of the
    policy deciding the public rows (pi_c; default ``recall``: the public set was decided by pi alone).
    eps is :func:`example_epsilon` for one occurrence at the plan's largest sampling probability and
    the sigma training used. ``training``: counts of a CRT-mode run (schedule, public_rows,
    public_steps), shown as given. ``occurrences``: each secret's rows and unique occurrences
    (:func:`occurrences_section`, CRT Prop. 7), added under ``"occurrences"`` when given.
    """
    sigma = plan.noise_multiplier if noise_multiplier is None else float(noise_multiplier)
    section = {"recall": None, "steps": plan.steps, "training": dict(training or {})}
    if occurrences is not None:
        section["occurrences"] = occurrences_section(occurrences, plan.num_secrets)
    if recall is None:
        return section
    recall = _check_share("recall", recall)
    conservative = (
        recall if conservative_recall is None else _check_share("conservative_recall", conservative_recall)
    )
    rho = float(plan.sampling_probs.max(initial=0.0))
    eps = example_epsilon(rho, sigma, plan.steps, delta)
    conf_eps, conf_delta = bayesian_confidentiality(
        eps, delta, recall=recall, conservative_recall=conservative
    )
    finite = math.isfinite(eps)  # JSON has no infinity: an unbounded eps is recorded as None
    section.update(
        unbounded=not finite,
        recall=recall,
        conservative_recall=conservative,
        delta=delta,
        max_sampling_prob=rho,
        noise_multiplier=sigma,
        example_epsilon=eps if finite else None,
        confidentiality_epsilon=conf_eps if math.isfinite(conf_eps) else None,
        confidentiality_delta=conf_delta,
    )
    return section
