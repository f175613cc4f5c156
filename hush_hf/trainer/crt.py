"""CRT mode (CRT Alg. 1, lines 5-8): ordinary public steps between the plan's DP steps.

Public rows (a bool column, ``crt_public`` from :func:`hush_hf.crt.redact_dataset`) get ordinary
steps: the mean loss gradient of a batch of ``public_batch_size`` rows, no clipping, no noise. The
plan's T DP steps run unchanged: the k-th private step draws the plan's batch k and noise k (seeded by
``(dp_seed, k)``) exactly as a run without CRT mode does. Schedules:

- ``alternate_epochs`` (Alg. 1): one epoch of public steps (``ceil(n_pub / b_pub)``), then one private
  "epoch" of ``max(1, round(n_pri / B))`` DP steps (CRT footnote 3: steps that in expectation cover the
  private rows), repeated until the T DP steps are taken;
- ``interleave``: one public step before every DP step.

Why every per-secret Hush bound still holds. The bound of secret j compares two worlds that differ only
in the content of the rows D_j containing j. Public rows must have an empty ``secret_ids`` (checked:
a public row with a tagged secret is refused), so D_j lies in the private rows, the public rows and
their order (shuffled from ``TrainingArguments.seed``, not from the DP seed) are the same in both worlds,
and a public step maps the current model to the next one through a function of that public data alone.
The T DP steps are accounted under adaptive composition: the bound holds whatever function of the
previous outputs picks each step's starting model. Inserting public steps only changes that function
(post-processing by maps independent of secret j), and the DP steps themselves, their sampling
probabilities, B, sigma, C and T, are unchanged. So the posterior bound of every tagged secret is the
plan's, with or without CRT mode. It covers tagged secrets only: a secret no tagger marks, sitting in a
public row, is trained without noise; CRT's Bayesian confidentiality for what the policies miss (Prop. 6,
Thm. 8.3, :func:`hush_hf.crt.bayesian_confidentiality`) needs their measured recall.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

CRT_SCHEDULES = ("off", "alternate_epochs", "interleave")


@dataclass(frozen=True)
class CrtSchedule:
    """Which optimizer steps are public: ``public[t]`` for global step t; ``private_index[t]`` is k for
    the k-th DP step (-1 on public steps), ``public_index[t]`` the count of public steps before t."""

    public: np.ndarray
    private_index: np.ndarray
    public_index: np.ndarray

    @property
    def total_steps(self) -> int:
        return int(self.public.size)

    @property
    def public_steps(self) -> int:
        return int(self.public.sum())

    @property
    def private_steps(self) -> int:
        return self.total_steps - self.public_steps

    def is_public(self, step: int) -> bool:
        return bool(self.public[step])


def build_schedule(
    kind: str,
    *,
    private_steps: int,
    num_public: int,
    num_private: int,
    public_batch_size: int,
    expected_batch_size: float,
) -> CrtSchedule:
    """The step pattern of ``kind`` (see the module docstring); no public steps when ``num_public == 0``."""
    if kind not in CRT_SCHEDULES[1:]:
        raise ValueError(f"crt_schedule must be one of {CRT_SCHEDULES}, got {kind!r}")
    if num_public == 0:
        pattern = [False] * private_steps
    elif kind == "interleave":
        pattern = [True, False] * private_steps
    else:
        public_epoch = math.ceil(num_public / public_batch_size)
        private_epoch = max(1, round(num_private / expected_batch_size))
        pattern, done = [], 0
        while done < private_steps:
            chunk = min(private_epoch, private_steps - done)
            pattern += [True] * public_epoch + [False] * chunk
            done += chunk
    public = np.asarray(pattern, dtype=bool)
    private_index = np.where(public, -1, np.cumsum(~public) - 1)
    public_index = np.cumsum(public) - public
    return CrtSchedule(public, private_index, public_index)


class CrtBatchSampler:
    """Batches for the whole CRT run: the plan's Poisson batch k on the k-th DP step, and on public steps
    ``public_batch_size`` public rows from a permutation per epoch (seeded by ``seed``, a public seed).

    ``private`` is the plan's :class:`~hush_hf.sampling.WeightedPoissonSampler`; each rank gets its share
    of both kinds of batch (``batch[rank::num_replicas]``).
    """

    def __init__(
        self,
        private: object,
        schedule: CrtSchedule,
        public_rows: np.ndarray,
        *,
        public_batch_size: int,
        seed: int,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        self.private, self.schedule = private, schedule
        self.public_rows = np.asarray(public_rows, dtype=np.int64)
        self.public_batch_size, self.seed = int(public_batch_size), int(seed)
        self.num_replicas, self.rank = num_replicas, rank
        self.per_epoch = max(1, math.ceil(self.public_rows.size / self.public_batch_size))

    def public_batch(self, index: int) -> np.ndarray:
        """Rows of the ``index``-th public step (all ranks together)."""
        epoch, position = divmod(index, self.per_epoch)
        order = np.random.default_rng((self.seed, epoch)).permutation(self.public_rows)
        start = position * self.public_batch_size
        return np.sort(order[start : start + self.public_batch_size])

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.schedule.total_steps):
            if self.schedule.is_public(step):
                batch = self.public_batch(int(self.schedule.public_index[step]))
            else:
                batch = self.private.batch(int(self.schedule.private_index[step]))
            yield batch[self.rank :: self.num_replicas].tolist()

    def __len__(self) -> int:
        return self.schedule.total_steps
