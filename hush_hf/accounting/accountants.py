"""The accountant registry: one table of accountants, keyed by name, each behind one interface.

Every place that names accountants reads this table: ``ACCOUNTANTS`` (a live view of the names,
default first), the CLI's ``--accountant`` choices, the plan's default LP budget
(``Accountant.lp_budget``), the trainer config's check and the model card's wording
(``Accountant.description``). ``register_accountant`` adds one and refuses an entry that lacks any of
these. An accountant maps (laws of S, one sigma per law, steps T, queries (law index, prior), their
targets or None) to rigorous upper bounds on the posterior, and offers a cheap sigma estimate used
only to decide what to evaluate first (never to certify anything).

Bound functions may be given as ``"module:function"`` and are imported on first use: the table is
read by ``hush --help`` and the trainer config, which should not pay for scipy.signal (~3 s).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hush_hf.accounting.budgets import LP_BUDGET_KINDS, bernoulli_kl, gaussian_gap

if TYPE_CHECKING:
    from hush_hf.accounting.counts import CountDistributions

BoundFn = Callable[
    ["CountDistributions", np.ndarray, int, np.ndarray, np.ndarray, np.ndarray | None], np.ndarray
]
GapFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Accountant:
    """``bounds(laws, sigma_per_law, steps, priors, law_of_query, targets)`` (a function, or its
    ``"module:function"``); ``estimate_sigma`` ranks only. ``targets`` (or None) is what each bound will
    be compared with: an accountant may skip work that cannot change whether a bound meets it.
    ``lp_budget``: the LP budget kind a plan uses with it by default (one of ``LP_BUDGET_KINDS``);
    ``description``: one sentence for model cards; ``threaded``: ``bounds`` also takes ``workers=N``
    and evaluates its laws on N threads with the same numbers as one (``threads``)."""

    name: str
    bounds: BoundFn | str
    sigma_factor: float  # sigma_j ~ factor * sqrt(T) * E[S_j] / gap_j (docs/design.md#lp-budgets)
    gap: GapFn
    lp_budget: str
    description: str
    threaded: bool = False

    def evaluate(
        self,
        laws: CountDistributions,
        sigma: np.ndarray,
        steps: int,
        priors: np.ndarray,
        rows: np.ndarray,
        targets: np.ndarray | None,
        workers: int = 1,
    ) -> np.ndarray:
        """Upper bounds on the posterior for queries (law ``rows[i]``, ``priors[i]``); ``workers``:
        threads an accountant that is ``threaded`` may use (the others use one)."""
        bounds = _resolve(self.bounds)
        if self.threaded and workers > 1:
            return bounds(laws, sigma, steps, priors, rows, targets, workers=workers)  # type: ignore[call-arg]
        return bounds(laws, sigma, steps, priors, rows, targets)

    def estimate_sigma(
        self, mean: np.ndarray, priors: np.ndarray, targets: np.ndarray, steps: int
    ) -> np.ndarray:
        """Linear-in-E[S] estimate of each secret's own sigma_j (for ranking)."""
        return self.sigma_factor * np.sqrt(steps) * mean / self.gap(priors, targets)


#: The table. Insertion order is the order of ``ACCOUNTANTS``; the first entry is the default.
REGISTRY: dict[str, Accountant] = {}
DEFAULT_ACCOUNTANT = "tight"


def register_accountant(accountant: Accountant) -> Accountant:
    """Add ``accountant`` to the table; ``ValueError`` naming the field it lacks, or if its name is taken."""
    if not isinstance(accountant, Accountant):
        raise ValueError(f"register_accountant needs an Accountant, got {type(accountant).__name__}")
    name = accountant.name
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"accountant name must be an identifier-like string, got {name!r}")
    if name in REGISTRY:
        raise ValueError(f"an accountant named {name!r} is already registered")
    if not callable(accountant.gap):
        raise ValueError(f"accountant {name!r}: gap must be callable")
    if not callable(accountant.bounds) and not _is_dotted(accountant.bounds):
        raise ValueError(f"accountant {name!r}: bounds must be callable or 'module:function'")
    factor = accountant.sigma_factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (0 < factor < math.inf):
        raise ValueError(f"accountant {name!r}: sigma_factor must be a positive number, got {factor!r}")
    if accountant.lp_budget not in LP_BUDGET_KINDS:
        raise ValueError(
            f"accountant {name!r}: lp_budget must be one of {LP_BUDGET_KINDS}, got {accountant.lp_budget!r}"
        )
    if not isinstance(accountant.description, str) or not accountant.description.strip():
        raise ValueError(f"accountant {name!r}: description (one sentence for model cards) is empty")
    if not isinstance(accountant.threaded, bool):
        raise ValueError(f"accountant {name!r}: threaded must be True or False, got {accountant.threaded!r}")
    REGISTRY[name] = accountant
    return accountant


class _RegisteredNames(Sequence[str]):
    """The registered names, default first, always current (a read-only view of ``REGISTRY``)."""

    def _names(self) -> tuple[str, ...]:
        rest = tuple(n for n in REGISTRY if n != DEFAULT_ACCOUNTANT)
        return ((DEFAULT_ACCOUNTANT,) if DEFAULT_ACCOUNTANT in REGISTRY else ()) + rest

    def __getitem__(self, index):  # type: ignore[override]
        return self._names()[index]

    def __len__(self) -> int:
        return len(REGISTRY)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in REGISTRY

    def __repr__(self) -> str:
        return repr(self._names())


#: Accountant names, default first (a live view: a registered accountant appears here at once).
ACCOUNTANTS: Sequence[str] = _RegisteredNames()


def validate_accountant(accountant: object) -> str:
    """One of :data:`ACCOUNTANTS`, else a ``ValueError`` listing them."""
    if not isinstance(accountant, str) or accountant not in REGISTRY:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS!r}, got {accountant!r}")
    return accountant


def get_accountant(name: object) -> Accountant:
    """The registered accountant called ``name`` (``ValueError`` listing the names otherwise)."""
    return REGISTRY[validate_accountant(name)]


def _is_dotted(path: object) -> bool:
    return isinstance(path, str) and path.count(":") == 1 and all(path.split(":"))


def _resolve(bounds: BoundFn | str) -> BoundFn:
    if callable(bounds):
        return bounds
    module, name = bounds.split(":")
    return getattr(importlib.import_module(module), name)


def _sqrt_two_mu(priors: np.ndarray, targets: np.ndarray) -> np.ndarray:
    return np.sqrt(2.0 * bernoulli_kl(targets, priors))


register_accountant(
    Accountant(
        "tight",
        "hush_hf.accounting.blowup:tight_bounds",
        1.02,
        gaussian_gap,
        lp_budget="tight",
        description="the blow-up function of a pessimistic privacy-loss distribution (Hayes, Balle and "
        "Mahloujifar 2023), exact up to a discretisation that only over-estimates the bound",
        threaded=True,
    )
)
register_accountant(
    Accountant(
        "rdp",
        "hush_hf.accounting.renyi:rdp_bounds",
        1.085,
        gaussian_gap,
        lp_budget="tight",
        description="Rényi divergences of the exact mixture (Stock et al. 2022)",
    )
)
register_accountant(
    Accountant(
        "kl",
        "hush_hf.accounting.kl:kl_bounds",
        1.0,
        _sqrt_two_mu,
        lp_budget="kl",
        description="the KL divergence of the exact mixture (Hush, Lemma 3.2)",
    )
)
