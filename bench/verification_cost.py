"""What re-verifying a plan at train start costs, next to calibrating it (the baseline).

The trainer recomputes every secret's bound (``hush_hf.planning.verification.recompute_bounds``) before
the first step; this prints that time beside the time ``calibrate_noise`` took for the same plan, for a
plan small enough to be evaluated secret by secret and one above ``EXACT_UP_TO`` (envelopes first).

    python bench/verification_cost.py [--examples 5000] [--secrets 200 800] [--steps 200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def instance(n: int, m: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    secret_ids = [[] for _ in range(n)]
    for j in range(m):
        for i in rng.choice(n, size=int(rng.integers(3, 40)), replace=False):
            secret_ids[i].append(j)
    return secret_ids, np.full(m, 1e-6), rng.uniform(1e-3, 1e-2, size=m)


def main() -> None:
    from hush_hf.accounting import SecretGroups, calibrate_noise
    from hush_hf.planning import membership_matrix, plan_protection
    from hush_hf.planning.verification import recompute_bounds

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=5000)
    parser.add_argument("--secrets", type=int, nargs="+", default=[200, 800])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=float, default=32.0)
    args = parser.parse_args()
    print(f"{'secrets':>8} {'calibrate (s)':>14} {'verify (s)':>11} {'ratio':>7}  all targets hold")
    for m in args.secrets:
        secret_ids, priors, targets = instance(args.examples, m)
        plan = plan_protection(secret_ids, priors, targets, expected_batch_size=args.batch,
                               steps=args.steps, noise_multiplier=1.0)  # rho only; calibrated below
        groups = SecretGroups.from_membership(membership_matrix(secret_ids, m), plan.sampling_probs)
        start = time.perf_counter()
        sigma = calibrate_noise(groups, priors, targets, args.steps).sigma
        calibrate = time.perf_counter() - start
        start = time.perf_counter()
        verification = recompute_bounds(plan, sigma, secret_ids=secret_ids)
        verify = time.perf_counter() - start
        print(f"{m:>8} {calibrate:>14.2f} {verify:>11.2f} {verify / calibrate:>7.2f}  "
              f"{verification.meets_targets}")


if __name__ == "__main__":
    main()
