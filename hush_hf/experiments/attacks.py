"""Attacks on a trained model, as the experiments report them: test loss with canary exposure and
membership inference, and reconstruction of secrets ranked among alternatives of the same length.

Secrets and canaries are referred to by index: no value reaches a result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hush_hf.experiments.canaries import exposure
from hush_hf.experiments.evaluation import mean_token_loss


def causal_lm_attacks(
    model: Any,
    tokenizer: Any,
    canaries: Sequence[Any],
    *,
    test_batches: Any,
    members: list[str],
    nonmembers: list[str],
    exposure_samples: int,
    num_fresh_canaries: int,
    max_length: int,
    batch_size: int,
    seed: int,
) -> dict[str, Any]:
    """Test perplexity, canary exposure (from ``exposure_samples`` candidates) and two membership
    attacks on one causal LM: the canaries against ``num_fresh_canaries`` fresh values of their space
    (seeded with ``seed + 1``), and ``members`` (training rows) against ``nonmembers`` (held-out rows)."""
    from hush_hf.audit import membership_attacks

    loss = mean_token_loss(model, test_batches, causal=True)
    found = exposure(model, tokenizer, canaries, kind="causal", samples=exposure_samples,
                     batch_size=batch_size, seed=seed)
    space, taken = canaries[0].space, {c.value for c in canaries}
    rng = np.random.default_rng(seed + 1)
    fresh = [v for v in space.random_values(4 * num_fresh_canaries, rng) if v not in taken]
    canary_mia = membership_attacks(model, tokenizer, [c.text for c in canaries],
                                    [space.text(v) for v in fresh[:num_fresh_canaries]],
                                    batch_size=batch_size)[0].to_json()
    example_mia = membership_attacks(model, tokenizer, members, nonmembers, max_length=max_length,
                                     batch_size=batch_size)[0].to_json()
    return {"test_loss": loss, "test_perplexity": math.exp(loss), **found, "canary_mia": canary_mia,
            "example_mia": example_mia, "canary_mia_auc": canary_mia["auc"],
            "example_mia_auc": example_mia["auc"]}


def length_matched_alternatives(secrets: Any, tokenizer: Any, count: int, seed: int) -> dict[int, list[str]]:
    """For each secret, up to ``count`` other secrets' names of the same token length (as written after
    ``import ``, i.e. after a space), drawn at random (seeded); the nearest lengths fill up when too few
    match.

    A causal LM scores a candidate by the sum of its tokens' log-probabilities, so a candidate longer
    than the true name loses for its length alone; matching lengths makes the ranking measure what
    the model learnt, not the names' lengths.
    """
    names = [s.name for s in secrets]
    encoded = tokenizer([" " + name for name in names], add_special_tokens=False)["input_ids"]
    lengths = np.array([len(ids) for ids in encoded])
    rng = np.random.default_rng(seed)
    chosen: dict[int, list[str]] = {}
    for j, length in enumerate(lengths):
        others = np.array([k for k in range(len(names)) if k != j], dtype=np.int64)
        if others.size:
            # Nearest lengths first, in random order among equals.
            order = np.lexsort((rng.random(others.size), np.abs(lengths[others] - length)))
            chosen[j] = [names[k] for k in others[order[:count]]]
    return chosen


def reconstruction_attack_summary(
    model: Any, tokenizer: Any, probes: list[Any], plan: Any, sensitive: set[int], batch_size: int
) -> dict[str, Any]:
    """The reconstruction attack (causal LM) on every probe: ``per_secret`` (rank, probability and number
    of candidates by secret index) and a summary each for the ``sensitive`` secrets and the others
    (``ordinary``)."""
    from hush_hf.audit import reconstruction_attack
    from hush_hf.audit.reconstruction import summarize_reconstructions

    model.eval()
    found = reconstruction_attack(model, tokenizer, probes, plan=plan, kind="causal", batch_size=batch_size)
    groups = {"sensitive": [r for r in found if r.index in sensitive],
              "ordinary": [r for r in found if r.index not in sensitive]}
    per_secret = {r.index: {"rank": r.rank, "probability": r.probability, "candidates": r.num_candidates}
                  for r in found}
    return {"per_secret": per_secret, **{
        name: {k: v for k, v in summarize_reconstructions(group).items() if k != "secrets"}
        for name, group in groups.items()}}


def membership_rows(
    train_texts: Sequence[str], canaries: Sequence[Any], test_texts: Sequence[str], count: int, seed: int
) -> tuple[list[str], list[str]]:
    """``(members, nonmembers)`` for the example membership attack: ``count`` training rows that are not
    canaries (a seeded choice, in training order) and the first ``count`` held-out rows."""
    ordinary = [t for t in train_texts if not any(c.text == t for c in canaries)]
    chosen = np.random.default_rng(seed).permutation(len(ordinary))[:count]
    return [ordinary[k] for k in np.sort(chosen)], list(test_texts[:count])


def probed_secrets(sensitive: set[int], num_secrets: int, num_ordinary: int, seed: int) -> list[int]:
    """The secrets an attack probes: every sensitive one, then ``num_ordinary`` of the others (at most all
    of them), drawn at random (seeded); each part in index order."""
    rng = np.random.default_rng(seed)
    ordinary = [j for j in range(num_secrets) if j not in sensitive]
    count = min(num_ordinary, len(ordinary))
    return sorted(sensitive) + sorted(rng.choice(ordinary, size=count, replace=False).tolist())
