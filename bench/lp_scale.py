"""Scale benchmark of the example-weight LP (hush_hf.planning.lp) on synthetic Hush-like instances.

Instances follow the paper's setup (Hush Sec. 5.1): each secret is in 50-100 examples, p_j = 1e-10,
r_j ~ U[2e-4, 1e-3]; the LP budget is g_j = Phi^-1(1 - p_j) - Phi^-1(1 - r_j) (the tight accountant's
slope, docs/design.md#lp-budgets) and capacity_j = c * g_j. Example memberships are skewed: example
i's chance to be drawn into a secret is proportional to a lognormal popularity (a few long, many short
documents).

    python bench/lp_scale.py                      # 200K x 20K and 1.7M x 100K, c = 2^-2 ... 2^4
    python bench/lp_scale.py --scale small --c 1 4

Functions for bench/plan_scale.py: ``make_instance``, ``run_case``, ``reset_peak_rss``, ``peak_rss_bytes``.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.stats import norm

from hush_hf.planning.lp import solve_example_weights

SCALES = {"small": (200_000, 20_000), "paper": (1_700_000, 100_000)}
DEFAULT_C = (0.25, 1.0, 2.0, 4.0, 8.0, 16.0)


@dataclass(frozen=True)
class LPInstance:
    """A (num_secrets x num_examples) 0/1 membership matrix and each secret's budget g_j."""

    membership: sp.csr_matrix
    budget: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.membership.shape


def make_instance(
    num_examples: int,
    num_secrets: int,
    *,
    seed: int = 0,
    secret_size: tuple[int, int] = (50, 100),
    skew: float = 1.0,
    prior: float = 1e-10,
    target_range: tuple[float, float] = (2e-4, 1e-3),
) -> LPInstance:
    """Random instance: secret j holds |D_j| ~ U{secret_size} distinct examples, drawn with probability
    proportional to a lognormal(0, ``skew``) popularity per example; budget_j = g_j for p = ``prior`` and
    r_j ~ U[``target_range``]."""
    rng = np.random.default_rng(seed)
    popularity = rng.lognormal(0.0, skew, size=num_examples)
    cdf = np.cumsum(popularity)
    cdf /= cdf[-1]
    sizes = rng.integers(secret_size[0], secret_size[1] + 1, size=num_secrets)
    # Draw a few spare candidates per secret with replacement, drop repeats, keep the first |D_j|.
    draws = sizes + 8
    rows = np.repeat(np.arange(num_secrets), draws)
    cols = np.minimum(np.searchsorted(cdf, rng.random(rows.size), side="right"), num_examples - 1)
    rank = np.arange(rows.size)
    order = np.lexsort((rank, cols, rows))
    rows, cols, rank = rows[order], cols[order], rank[order]
    first = np.ones(rows.size, dtype=bool)
    first[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
    rows, cols, rank = rows[first], cols[first], rank[first]
    order = np.lexsort((rank, rows))
    rows, cols = rows[order], cols[order]
    position = np.arange(rows.size) - np.searchsorted(rows, rows)
    keep = position < sizes[rows]
    rows, cols = rows[keep], cols[keep]
    membership = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(num_secrets, num_examples))
    targets = rng.uniform(*target_range, size=num_secrets)
    budget = norm.isf(prior) - norm.isf(targets)
    return LPInstance(membership, budget)


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) of this process; False where unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident memory since the last ``reset_peak_rss`` (VmHWM), else since process start."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_case(instance: LPInstance, c: float, *, solver: str = "highs", gap_tol: float = 1e-2,
             time_limit: float | None = None, drop_secretless: bool = False) -> dict:
    """Solve one instance at capacity c * budget; wall and CPU seconds, peak memory and LP statistics."""
    capacity = c * instance.budget
    binding_at_ones = float(np.mean(instance.membership @ np.ones(instance.shape[1]) > capacity))
    reset_peak_rss()
    wall, cpu = time.perf_counter(), time.process_time()
    solution = solve_example_weights(instance.membership, capacity, solver=solver, gap_tol=gap_tol,
                                     time_limit=time_limit, drop_secretless=drop_secretless)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    row_use = instance.membership @ solution.weights
    return {
        "num_examples": instance.shape[1],
        "num_secrets": instance.shape[0],
        "memberships": int(instance.membership.nnz),
        "c": c,
        "solver": solver,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "peak_rss_gib": round(peak_rss_bytes() / 2**30, 3),
        "status": solution.status,
        "gap": solution.gap,
        "max_block_gap": max(solution.block_gaps, default=0.0),
        "objective": solution.objective,
        "upper_bound": solution.upper_bound,
        "retained_fraction": solution.objective / instance.shape[1],
        "secrets_over_capacity_at_w1": binding_at_ones,
        "secrets_within_1pct_of_capacity": float(np.mean(row_use >= 0.99 * capacity)),
        "active_secrets": solution.num_active_secrets,
        "active_examples": solution.num_active_examples,
        "components": solution.num_components,
        "blocks": solution.num_blocks,
        "methods": sorted(set(solution.methods)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=[*SCALES, "both"], default="both")
    parser.add_argument("--c", type=float, nargs="+", default=list(DEFAULT_C), help="LP constants c")
    parser.add_argument("--solver", default="highs")
    parser.add_argument("--gap-tol", type=float, default=1e-2)
    parser.add_argument("--skew", type=float, default=1.0, help="sigma of the lognormal example popularity")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for scale in SCALES if args.scale == "both" else [args.scale]:
        start = time.perf_counter()
        instance = make_instance(*SCALES[scale], seed=args.seed, skew=args.skew)
        num_secrets, num_examples = instance.shape
        seconds = time.perf_counter() - start
        print(f"# {scale}: {num_examples} examples x {num_secrets} secrets, "
              f"{instance.membership.nnz} memberships, generated in {seconds:.1f} s", flush=True)
        for c in args.c:
            print(json.dumps(run_case(instance, c, solver=args.solver, gap_tol=args.gap_tol)), flush=True)


if __name__ == "__main__":
    main()
