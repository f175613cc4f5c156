"""Per-secret sampling probabilities in CSR layout: the input of every accountant."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class SecretGroups:
    """Sampling probabilities of the examples of each secret.

    Secret ``j``'s examples D_j are sampled with probabilities ``rho[indptr[j]:indptr[j+1]]``.
    Per step the number of them in the batch is S_j = sum_{i in D_j} Bern(rho_i) (Poisson-binomial),
    and the accountants bound N(S_j, sigma^2)^T against N(0, sigma^2)^T (Hush, Sec. 4).
    """

    indptr: np.ndarray
    rho: np.ndarray

    def __post_init__(self) -> None:
        indptr = np.asarray(self.indptr, dtype=np.int64)
        rho = np.asarray(self.rho, dtype=np.float64)
        if indptr.ndim != 1 or indptr.size < 1 or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
            raise ValueError("SecretGroups.indptr must be a non-decreasing 1-D array starting at 0")
        if indptr[-1] != rho.size:
            raise ValueError(f"SecretGroups.indptr[-1]={indptr[-1]} does not match len(rho)={rho.size}")
        bad = ~np.isfinite(rho) | (rho < 0) | (rho > 1)
        if np.any(bad):
            k = int(np.flatnonzero(bad)[0])
            raise ValueError(f"SecretGroups.rho must lie in [0, 1]; entry {k} is {float(rho[k])!r}")
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "rho", rho)

    @property
    def num_secrets(self) -> int:
        return self.indptr.size - 1

    @property
    def sizes(self) -> np.ndarray:
        """Number of examples of each secret, |D_j|."""
        return np.diff(self.indptr)

    def group(self, j: int) -> np.ndarray:
        """The sampling probabilities of secret ``j``'s examples."""
        return self.rho[self.indptr[j] : self.indptr[j + 1]]

    @property
    def secret_of_entry(self) -> np.ndarray:
        """For each entry of ``rho``, the index of the secret it belongs to."""
        return np.repeat(np.arange(self.num_secrets), self.sizes)

    def segment_sum(self, values: np.ndarray) -> np.ndarray:
        """sum over each secret's entries of ``values`` (an array aligned with ``rho``)."""
        return np.bincount(self.secret_of_entry, weights=values, minlength=self.num_secrets)

    def sum_rho(self) -> np.ndarray:
        """E[S_j] = sum_{i in D_j} rho_i for every secret."""
        return self.segment_sum(self.rho)

    def sum_rho_sq(self) -> np.ndarray:
        """sum_{i in D_j} rho_i^2 for every secret (so Var[S_j] = sum_rho - sum_rho_sq)."""
        return self.segment_sum(self.rho**2)

    def subset(self, secrets: np.ndarray) -> SecretGroups:
        """The groups of the given secret indices, in that order."""
        secrets = np.asarray(secrets, dtype=np.int64)
        starts, stops = self.indptr[secrets], self.indptr[secrets + 1]
        lengths = stops - starts
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        idx = (
            np.concatenate([np.arange(a, b) for a, b in zip(starts, stops, strict=True)])
            if secrets.size
            else []
        )
        return SecretGroups(indptr, self.rho[np.asarray(idx, dtype=np.int64)])

    @classmethod
    def from_lists(cls, groups: list[np.ndarray] | list[list[float]]) -> SecretGroups:
        """Build from one array of sampling probabilities per secret."""
        lengths = [len(g) for g in groups]
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        rho = np.concatenate([np.asarray(g, dtype=np.float64) for g in groups]) if groups else np.zeros(0)
        return cls(indptr, rho)

    @classmethod
    def from_membership(cls, membership: sp.spmatrix, rho: np.ndarray) -> SecretGroups:
        """Build from a (num_secrets x num_examples) 0/1 membership matrix and per-example rho."""
        csr = sp.csr_matrix(membership)
        rho = np.asarray(rho, dtype=np.float64)
        if csr.shape[1] != rho.size:
            raise ValueError(f"membership has {csr.shape[1]} examples but rho has {rho.size}")
        return cls(csr.indptr.astype(np.int64), rho[csr.indices])
