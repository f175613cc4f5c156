"""What re-verifying a plan at train start costs, next to calibrating it (the baseline), and on how many
threads.

The trainer recomputes every secret's bound (``hush_hf.planning.verification.recompute_bounds``) before
the first step; this prints that time beside the time ``calibrate_noise`` took for the same plan, for a
plan small enough to be evaluated secret by secret and one above ``EXACT_UP_TO`` (envelopes first).

    python bench/verification_cost.py [--examples 5000] [--secrets 200 800] [--steps 200]

``--plans DIR`` re-verifies saved plans instead (the demo's: ``make demo`` writes them to
``outputs/arxiv_mlm/plans``), at their own sigma and T, serially (``workers=1``, what the trainer did
before it used threads) and on ``--workers`` threads, side by side, wall and process CPU time, and checks
that the bounds are bitwise equal. ``--baseline-tree PATH`` also runs the serial recomputation with the
code of another checkout (e.g. an export of main) in a subprocess and compares its bounds bitwise.

    python bench/verification_cost.py --plans outputs/arxiv_mlm/plans --workers 2 [--baseline-tree /tmp/main]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: Run by ``--baseline-tree``: the serial recomputation with that tree's code (no ``workers`` argument).
_BASELINE = """
import json, sys, time
import numpy as np
from hush_hf.planning.plan import ProtectionPlan
from hush_hf.planning.verification import recompute_bounds
plan = ProtectionPlan.load(sys.argv[1])
wall, cpu = time.perf_counter(), time.process_time()
bound = recompute_bounds(plan).bound
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
np.save(sys.argv[2], bound)
print(json.dumps({"wall": wall, "cpu": cpu}))
"""


def instance(n: int, m: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    secret_ids = [[] for _ in range(n)]
    for j in range(m):
        for i in rng.choice(n, size=int(rng.integers(3, 40)), replace=False):
            secret_ids[i].append(j)
    return secret_ids, np.full(m, 1e-6), rng.uniform(1e-3, 1e-2, size=m)


def synthetic(args: argparse.Namespace) -> None:
    from hush_hf.accounting import SecretGroups, calibrate_noise
    from hush_hf.planning import membership_matrix, plan_protection
    from hush_hf.planning.verification import recompute_bounds

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
        verification = recompute_bounds(plan, sigma, secret_ids=secret_ids, workers=args.workers)
        verify = time.perf_counter() - start
        print(f"{m:>8} {calibrate:>14.2f} {verify:>11.2f} {verify / calibrate:>7.2f}  "
              f"{verification.meets_targets}")


def timed(function):
    wall, cpu = time.perf_counter(), time.process_time()
    out = function()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def baseline(tree: Path, plan_file: Path) -> tuple[np.ndarray, float, float]:
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "bound.npy"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run([sys.executable, "-c", _BASELINE, str(plan_file), str(target)], env=env,
                              check=True, capture_output=True, text=True, cwd=tree)
        times = json.loads(done.stdout.strip().splitlines()[-1])
        return np.load(target), times["wall"], times["cpu"]


def saved_plans(args: argparse.Namespace) -> None:
    from hush_hf.planning.plan import ProtectionPlan
    from hush_hf.planning.verification import recompute_bounds

    files = sorted(Path(args.plans).glob(args.pattern))
    if not files:
        raise SystemExit(f"no plan matching {args.pattern!r} in {args.plans}")
    print(f"load average before: {os.getloadavg()[0]:.1f}; {os.cpu_count()} cores")
    threads = f"{args.workers} threads wall/CPU (s)"
    head = f"{'plan':<16} {'secrets':>7} {'serial wall/CPU (s)':>20} {threads:>24} {'speed-up':>8}  bitwise"
    if args.baseline_tree:
        head += f"  {'baseline wall/CPU (s)':>21}  bitwise"
    print(head)
    for path in files:
        plan = ProtectionPlan.load(path)
        serial, s_wall, s_cpu = timed(lambda plan=plan: recompute_bounds(plan, workers=1).bound)
        threaded, t_wall, t_cpu = timed(lambda plan=plan: recompute_bounds(plan, workers=args.workers).bound)
        same = np.array_equal(serial, threaded)
        line = (f"{path.stem:<16} {plan.num_secrets:>7} {s_wall:>10.1f} / {s_cpu:<7.1f} "
                f"{t_wall:>12.1f} / {t_cpu:<9.1f} {s_wall / t_wall:>8.2f}  {same}")
        if args.baseline_tree:
            old, b_wall, b_cpu = baseline(Path(args.baseline_tree), path)
            line += f"  {b_wall:>11.1f} / {b_cpu:<7.1f}  {np.array_equal(old, serial)}"
        print(line, flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=5000)
    parser.add_argument("--secrets", type=int, nargs="+", default=[200, 800])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=float, default=32.0)
    parser.add_argument("--workers", type=int, default=1, help="threads for the verification")
    parser.add_argument("--plans", default=None, help="re-verify the saved plans in this directory instead")
    parser.add_argument("--pattern", default="hush_hf_c*.json", help="which plans in --plans (glob)")
    parser.add_argument("--baseline-tree", default=None, help="also run the serial code of this checkout")
    args = parser.parse_args()
    if args.plans:
        saved_plans(args)
    else:
        synthetic(args)


if __name__ == "__main__":
    main()
