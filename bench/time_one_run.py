"""One setting of ``make demo`` (arxiv_mlm), baseline checkout against this one, in alternating processes.

    .venv/bin/python bench/time_one_run.py --baseline /tmp/base      # e.g. a ``git archive`` of main
    .venv/bin/python bench/time_one_run.py --baseline /tmp/base --repeats 2 --c_exponent 4

Each process runs ``accelerate launch --num_cpu_threads_per_process <cores> recipes/arxiv_mlm.py
--settings hush_hf --c_exponents k --train_c_exponents k --dp_seed 1`` from one checkout (``PYTHONPATH``
set to it, so its ``hush_hf`` is the one imported): the demo's data, model and runs, but three runs
(``non_private``, then c = 2^k without and with noise) instead of twelve. A fixed ``--dp_seed`` makes the
DP runs repeatable, so the two checkouts' test losses and exposures can be compared bit for bit. Prints
per checkout the wall and process-CPU seconds of the ``training`` phase, the runs' own ``train()``
seconds, the rest of that phase (building the models, trainer setup with the plan's verification,
scoring: test loss and exposure), and whether every result agrees with the baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ("test_loss", "exposure_mean", "exposure_max", "train_loss")


def run_once(checkout: Path, c_exponent: int, output_dir: Path) -> dict:
    """Run the one-setting recipe from ``checkout``; its results.json plus the command's wall time."""
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [str(accelerate), "launch", "--num_cpu_threads_per_process", str(os.cpu_count()),
               "recipes/arxiv_mlm.py", "--settings", "hush_hf", "--c_exponents", str(c_exponent),
               "--train_c_exponents", str(c_exponent), "--dp_seed", "1", "--output_dir", str(output_dir)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    subprocess.run(command, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    results = json.loads((output_dir / "results.json").read_text(encoding="utf-8"))
    results["command_seconds"] = time.perf_counter() - start
    return results


def summary(results: dict) -> dict:
    runs = results["runs"]
    training = results["timings_seconds"]["training"]
    trained = sum(r["train_seconds"] for r in runs)
    return {"command": results["command_seconds"], "training": training,
            "training_cpu": results["cpu_seconds"]["training"], "train()": trained,
            "rest": training - trained}


def numbers(results: dict) -> list:
    """What the runs measured: the test loss at init, then each run's test loss, exposures, train loss."""
    return [results["init_test_loss"]] + [run[k] for run in results["runs"] for k in RESULTS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="checkout to compare against")
    parser.add_argument("--c_exponent", type=int, default=4, help="the c = 2^k trained (default 4)")
    parser.add_argument("--repeats", type=int, default=1, help="baseline/candidate pairs (alternating)")
    parser.add_argument("--output_dir", type=Path, default=ROOT / "outputs" / "time_one_run")
    args = parser.parse_args()
    checkouts = {"baseline": args.baseline.resolve(), "this": ROOT}
    found: dict[str, list[dict]] = {name: [] for name in checkouts}
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    for repeat in range(args.repeats):
        for name, checkout in checkouts.items():
            results = run_once(checkout, args.c_exponent, args.output_dir / f"{name}_{repeat}")
            found[name].append(results)
            line = "  ".join(f"{k} {v:6.1f} s" for k, v in summary(results).items())
            print(f"{name:8s} #{repeat}: {line}  (load {os.getloadavg()[0]:.1f})", flush=True)
    base = found["baseline"][0]
    for name, all_results in found.items():
        rows = [summary(r) for r in all_results]
        mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        ratio = {k: mean[k] / (sum(summary(r)[k] for r in found["baseline"]) / len(found["baseline"]))
                 for k in mean}
        print(f"{name:8s} mean: " + "  ".join(f"{k} {mean[k]:6.1f} s (x{ratio[k]:.2f})" for k in mean))
        same = all(numbers(r) == numbers(base) for r in all_results)
        print(f"{name:8s} results identical to the baseline's (test loss, exposure, train loss): {same}")
        for run in all_results[0]["runs"]:
            print(f"    {run['name']:<24s} " + "  ".join(f"{k} {run[k]!r}" for k in RESULTS))


if __name__ == "__main__":
    main()
