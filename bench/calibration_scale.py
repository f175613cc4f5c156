"""Benchmark: noise calibration for ~100K secrets with 50-100 examples each (~7.5M memberships).

Two instances (seeded, built in memory, nothing downloaded):
- ``planned``: what an LP plan produces. Secrets of a few (prior, target) kinds share examples
  (~4.4 secrets per example); example weights are raised by progressive filling until the budgets
  sum_{D_j} w <= c * budget_j bind (docs/design.md#lp-budgets), so many secrets are saturated and
  have nearly the same sigma_j; rho = B * w / sum(w).
- ``random``: the same membership structure with independent random sampling probabilities and
  random per-secret priors and targets.

``run()`` returns the measurements; as a script it prints them (use /usr/bin/time -v for memory).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from hush_hf.accounting import SecretGroups, calibrate_noise, get_accountant, lp_budget

SECRET_KINDS = (  # (prior, target, share): API keys, IDs, emails, names
    (1e-10, 5e-4, 0.25),
    (1e-8, 1e-4, 0.25),
    (1e-6, 1e-3, 0.25),
    (1e-4, 1e-2, 0.25),
)


@dataclass(frozen=True)
class Instance:
    name: str
    groups: SecretGroups
    priors: np.ndarray
    targets: np.ndarray
    steps: int


def memberships(
    num_secrets: int, rng: np.random.Generator, examples_per_secret: float = 4.4
) -> sp.csr_matrix:
    """A 0/1 (secrets x examples) matrix: secret j appears in 50-100 distinct examples."""
    sizes = rng.integers(50, 101, size=num_secrets)
    num_examples = int(sizes.sum() / examples_per_secret)
    cols = [rng.choice(num_examples, size=n, replace=False) for n in sizes]
    indptr = np.concatenate([[0], np.cumsum(sizes)])
    data = np.ones(indptr[-1])
    return sp.csr_matrix((data, np.concatenate(cols), indptr), shape=(num_secrets, num_examples))


def progressive_filling(member: sp.csr_matrix, budget: np.ndarray, rounds: int = 6) -> np.ndarray:
    """Feasible weights w in [0, 1] with sum_{D_j} w <= budget_j, raised round by round.

    Each round every example grows by the smallest share slack_j / |D_j| of its secrets, which keeps
    every budget feasible; secrets whose examples are all limited by them end up saturated.
    """
    csc = member.tocsc()
    sizes = np.diff(member.indptr)
    w = np.zeros(member.shape[1])
    for _ in range(rounds):
        slack = np.maximum(budget - member @ w, 0.0)
        share = slack / sizes
        shares = share[csc.indices]
        starts = csc.indptr[:-1]
        step = np.minimum.reduceat(shares, starts)
        step[np.diff(csc.indptr) == 0] = 0.0
        w = np.minimum(1.0, w + step)
    return w


def planned_instance(num_secrets: int, seed: int = 0, steps: int = 2000, kind: str = "tight") -> Instance:
    """LP-like plan: budgets c * lp_budget(kind), filled; rho scaled to a mean group sum of ~0.3."""
    rng = np.random.default_rng(seed)
    member = memberships(num_secrets, rng)
    shares = np.array([k[2] for k in SECRET_KINDS])
    kinds = rng.choice(len(SECRET_KINDS), size=num_secrets, p=shares / shares.sum())
    priors = np.array([SECRET_KINDS[k][0] for k in kinds])
    targets = np.array([SECRET_KINDS[k][1] for k in kinds])
    budget = lp_budget(priors, targets, get_accountant(kind).lp_budget)
    c = 20.0 / budget.mean()  # ~20 of the 50-100 examples' weight allowed: budgets bind
    w = progressive_filling(member, c * budget)
    batch = 0.3 * w.sum() / (member @ w).mean()  # expected batch size making E[S_j] ~ 0.3
    rho = np.minimum(batch * w / w.sum(), 1.0)
    return Instance(f"planned-{kind}", SecretGroups.from_membership(member, rho), priors, targets, steps)


def random_instance(num_secrets: int, seed: int = 0, steps: int = 2000) -> Instance:
    """Random probabilities (mean group sum ~0.3) and random priors/targets (log-uniform)."""
    rng = np.random.default_rng(seed + 1)
    member = memberships(num_secrets, rng)
    rho = rng.uniform(0.0005, 0.0075, size=member.shape[1])
    priors = 10.0 ** rng.uniform(-10, -3, size=num_secrets)
    targets = np.minimum(priors * 10.0 ** rng.uniform(1, 6, size=num_secrets), 0.5)
    targets = np.maximum(targets, 2 * priors)
    return Instance("random", SecretGroups.from_membership(member, rho), priors, targets, steps)


def run(
    num_secrets: int = 100_000,
    accountants: tuple[str, ...] = ("kl", "tight"),
    seed: int = 0,
    steps: int = 2000,
    rtol: float = 1e-4,
) -> list[dict]:
    """Calibrate every instance with every accountant; one dict of measurements per run."""
    results = []
    for accountant in accountants:
        t0 = time.perf_counter()
        planned = planned_instance(num_secrets, seed, steps, kind=accountant)
        build = time.perf_counter() - t0
        for instance in (planned, random_instance(num_secrets, seed, steps)):
            start, cpu = time.perf_counter(), time.process_time()
            cal = calibrate_noise(
                instance.groups, instance.priors, instance.targets, instance.steps, accountant, rtol
            )
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            results.append(
                {
                    "instance": instance.name,
                    "accountant": accountant,
                    "num_secrets": instance.groups.num_secrets,
                    "memberships": int(instance.groups.rho.size),
                    "sigma": cal.sigma,
                    "evaluated_exactly": cal.evaluated_exactly,
                    "max_bound_over_target": float(np.max(cal.bounds / instance.targets)),
                    "seconds": elapsed,
                    "cpu_seconds": cpu,
                    "build_seconds": build,
                }
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-secrets", type=int, default=100_000)
    parser.add_argument("--accountants", default="kl,tight")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    for row in run(args.num_secrets, tuple(args.accountants.split(",")), args.seed, args.steps):
        print(
            f"{row['instance']:>14} {row['accountant']:>5}: {row['num_secrets']} secrets, "
            f"{row['memberships']} memberships, sigma={row['sigma']:.6g}, "
            f"exact={row['evaluated_exactly']}, max bound/target={row['max_bound_over_target']:.6f}, "
            f"{row['seconds']:.2f} s wall, {row['cpu_seconds']:.2f} s cpu"
        )


if __name__ == "__main__":
    main()
