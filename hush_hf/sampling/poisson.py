"""Weighted Poisson sampling: example i is in each batch independently with probability rho_i."""

from __future__ import annotations

import numbers
from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from hush_hf.sampling.seeds import SAMPLING_STREAM, check_dp_seed, step_seed_sequence


class WeightedPoissonSampler(Sampler[list[int]]):
    """A batch sampler for DP-SGD with per-example sampling probabilities (Hush Alg. 2, line 8).

    Batch t is ``{i : U_{t,i} < rho_i}`` with U_{t,i} ~ U[0, 1) from the stream ``(dp_seed, t)``, so
    ``Pr[i in batch t] = rho_i`` independently over i and t, ``E|batch t| = sum_i rho_i = B``, and an
    empty batch is a valid draw (DP-SGD then takes a noise-only step). Batch t is a function of
    ``(seed, t)`` alone: every rank draws the same logical batch, and a resumed run draws the same
    batches as an uninterrupted one.

    With ``num_replicas > 1`` each rank yields its share ``batch[rank::num_replicas]``: the shares are
    disjoint, cover the batch, and nothing is padded or repeated (unlike ``BatchSamplerShard``).
    ``len(sampler)`` is the number of steps. The seed is secret: it is never shown in reprs or errors.
    """

    def __init__(
        self,
        sampling_probs: np.ndarray,
        *,
        num_steps: int,
        seed: int,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        probs = np.asarray(sampling_probs, dtype=np.float64)
        if probs.ndim != 1:
            raise ValueError(f"sampling_probs must be 1-D (one per example), got shape {probs.shape}")
        bad = ~np.isfinite(probs) | (probs < 0) | (probs > 1)
        if np.any(bad):
            k = int(np.flatnonzero(bad)[0])
            raise ValueError(f"sampling_probs must lie in [0, 1]; example {k} has {float(probs[k])!r}")
        _check_int("num_steps", num_steps, minimum=1)
        _check_int("num_replicas", num_replicas, minimum=1)
        _check_int("rank", rank, minimum=0)
        if rank >= num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank}")
        self._probs = probs
        self._probs.flags.writeable = False
        self._seed = check_dp_seed(seed, "seed")
        self.num_steps = int(num_steps)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)

    @property
    def sampling_probs(self) -> np.ndarray:
        """rho_i per example (read-only)."""
        return self._probs

    @property
    def expected_batch_size(self) -> float:
        """B = sum_i rho_i."""
        return float(self._probs.sum())

    def batch(self, step: int) -> np.ndarray:
        """The logical batch of ``step`` (all ranks together): sorted example indices."""
        _check_int("step", step, minimum=0)
        rng = np.random.default_rng(step_seed_sequence(self._seed, step, SAMPLING_STREAM))
        return np.flatnonzero(rng.random(self._probs.size) < self._probs)

    def share(self, batch: np.ndarray) -> np.ndarray:
        """This rank's disjoint part of a logical batch."""
        return batch[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.num_steps):
            yield self.share(self.batch(step)).tolist()

    def __len__(self) -> int:
        return self.num_steps

    def __repr__(self) -> str:
        return (
            f"WeightedPoissonSampler({self._probs.size} examples, B={self.expected_batch_size:g}, "
            f"{self.num_steps} steps, rank {self.rank}/{self.num_replicas})"
        )


def _check_int(field: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")
