"""Planted canaries (Carlini et al. 2019): inserted into the training rows, declared secrets, and audited.

A canary is a template with a random value (``My ID is: 4829301756``); it is declared a secret with the
prior of a blind guess, p = 1/|R|, so every DP model in a recipe protects it like any other secret, and
its exposure (log2 |R| - log2 rank among the candidates) measures what the model memorised. Canaries are
referred to by index: their values never reach a log or a result file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def plant_canaries(
    train: Any,
    *,
    num_canaries: int,
    repetitions: int,
    targets: Sequence[float],
    seed: int,
    text_column: str = "text",
    digits: int = 6,
) -> tuple[Any, list[Any], list[dict[str, Any]]]:
    """``(train with the canary rows inserted, canaries, secret records)``.

    Canary k is ``My ID is: <digits random digits>`` inserted ``repetitions`` times as its own row (seeded
    positions); its secret record has prior 10^-digits, target ``targets[k]`` and the value as its term.
    """
    from hush_hf.audit import CanarySpace, insert_canaries, make_canaries

    if len(targets) != num_canaries:
        raise ValueError(f"targets has {len(targets)} entries for num_canaries={num_canaries}")
    space = CanarySpace(length=digits)
    canaries = make_canaries(num_canaries, repetitions, space=space, seed=seed)
    train, _ = insert_canaries(train, canaries, text_column=text_column, seed=seed)
    return train, canaries, [c.secret_record(float(r)) for c, r in zip(canaries, targets, strict=True)]


def uniform_targets(count: int, low: float, high: float, seed: int) -> list[float]:
    """``count`` targets r ~ U[low, high] (seeded), as the paper draws its secrets' targets."""
    return np.random.default_rng(seed).uniform(low, high, size=count).tolist()


def exposure(
    model: Any,
    tokenizer: Any,
    canaries: Sequence[Any],
    *,
    kind: str,
    samples: int,
    batch_size: int,
    seed: int,
) -> dict[str, Any]:
    """Max and mean exposure (bits) of the canaries, and each canary's, by index; |R| is too large to
    enumerate, so the rank is extrapolated from ``samples`` random candidates (skew-normal fit)."""
    from hush_hf.audit import canary_exposures
    from hush_hf.audit.exposure import summarize_exposures

    was_training = model.training
    found = summarize_exposures(
        canary_exposures(
            model, tokenizer, canaries, method="skewnorm", num_samples=samples, batch_size=batch_size,
            seed=seed, kind=kind,
        )
    )
    model.train(was_training)
    return {
        "exposure_max": found["inserted"]["max"],
        "exposure_mean": found["inserted"]["mean"],
        "exposure_max_possible": found["max_possible"],
        "exposure_per_canary": [{"canary": c["index"], "exposure": c["exposure"]} for c in found["canaries"]],
    }


def tag_with_canaries(
    train: Any,
    secrets: Sequence[Any],
    *,
    num_canaries: int,
    repetitions: int,
    targets: Sequence[float],
    seed: int,
    text_column: str = "text",
    digits: int = 6,
) -> tuple[Any, Any, list[Any]]:
    """``(train tagged with secret_ids, SecretSet, canaries)``: ``num_canaries`` canaries planted
    (:func:`plant_canaries`; none when 0) and declared secrets after ``secrets``, then every row tagged
    with the whole set (secret j is ``secrets[j]``, canary k is secret ``len(secrets) + k``)."""
    from hush_hf.secrets import SecretSet, tag_dataset, tagger_for

    canaries, records = [], []
    if num_canaries:
        train, canaries, records = plant_canaries(train, num_canaries=num_canaries, repetitions=repetitions,
                                                  targets=targets, seed=seed, text_column=text_column,
                                                  digits=digits)
    secret_set = SecretSet([*secrets, *SecretSet.from_records(records)])
    train = tag_dataset(train, tagger_for(secret_set), text_column=text_column, num_secrets=len(secret_set))
    return train, secret_set, canaries
