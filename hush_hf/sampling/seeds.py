"""The DP randomness: one secret seed, and independent per-step streams derived from it.

DP-SGD's guarantee assumes the attacker does not know which examples were sampled nor the noise
that was added (Abadi et al. 2016; Hush Alg. 2 lines 8 and 10). ``TrainingArguments.seed`` is routinely
published (``training_args.bin``, model cards), so the sampling and noise randomness comes from a
separate ``dp_seed`` of 128 bits, drawn from the operating system's CSPRNG by default.

Streams are stateless per step: stream ``(kind, step)`` is ``SeedSequence(dp_seed, spawn_key=(kind, step))``
(numpy's documented way to derive independent streams), so batch t and noise t depend on
``(dp_seed, t)`` only. Resuming at step t and agreeing across ranks then follow from the step counter.
"""

from __future__ import annotations

import numbers
import secrets

import numpy as np

DP_SEED_BITS = 128
SAMPLING_STREAM = 0
NOISE_STREAM = 1


def draw_dp_seed() -> int:
    """A fresh 128-bit seed from the OS CSPRNG (``secrets.randbits``)."""
    return secrets.randbits(DP_SEED_BITS)


def check_dp_seed(dp_seed: object, field: str = "dp_seed") -> int:
    """``dp_seed`` as an int in [0, 2^128); a ValueError naming ``field`` otherwise.

    The error never shows the value: a seed is a secret.
    """
    if isinstance(dp_seed, bool) or not isinstance(dp_seed, numbers.Integral):
        raise ValueError(
            f"{field} must be an integer in [0, 2**{DP_SEED_BITS}), got a {type(dp_seed).__name__}"
        )
    if not 0 <= int(dp_seed) < 2**DP_SEED_BITS:
        raise ValueError(
            f"{field} must be an integer in [0, 2**{DP_SEED_BITS}) (value not shown: it is secret)"
        )
    return int(dp_seed)


def step_seed_sequence(dp_seed: int, step: int, stream: int, *extra: int) -> np.random.SeedSequence:
    """The independent seed sequence of ``stream`` at ``step`` (``extra`` splits it further)."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    return np.random.SeedSequence(
        check_dp_seed(dp_seed), spawn_key=(int(stream), int(step), *map(int, extra))
    )
