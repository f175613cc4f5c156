"""Time ``make demo`` (the main job) or another recipe's offline default: wall and CPU, the planning apart.

    python bench/time_demo.py                          # = make demo, output in outputs/time_arxiv_mlm/
    python bench/time_demo.py --recipe gpt2_canary     # another recipe's offline default

Runs ``make demo`` itself (``DEMO_ARGS="--output_dir <dir>"``, and ``DEMO_RECIPE`` for another recipe),
so the threads and flags are the Makefile's; it installs first if the environment is out of date, which
the whole command's time then includes. Measures that command's wall time and CPU time (user + system of
the process tree, ``resource.getrusage(RUSAGE_CHILDREN)``) and prints the recipe's own phases from its
``results.json`` (wall and process CPU seconds per phase; planning runs in worker processes whose CPU
time the recipe's own counter does not see, so its wall time is the figure to read). The target of the main
job is <= 10 minutes of wall time on an idle 2-core machine, planning included; on a shared machine the
wall time says how busy it was, the CPU time what the work costs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="arxiv_mlm", help="recipes/<recipe>.py (default: the main job)")
    parser.add_argument("--output_dir", default=None, help="default: outputs/time_<recipe>")
    args = parser.parse_args()
    output_dir = Path(args.output_dir or ROOT / "outputs" / f"time_{args.recipe}")
    command = ["make", "-s", "demo", f"DEMO_RECIPE={args.recipe}", f"DEMO_ARGS=--output_dir {output_dir}"]
    print("running:", " ".join(command), f"(load average before: {os.getloadavg()[0]:.1f})", flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    results = json.loads((output_dir / "results.json").read_text(encoding="utf-8"))
    print(f"\nwhole command: wall {wall:.0f} s, CPU {usage.ru_utime + usage.ru_stime:.0f} s "
          f"(user {usage.ru_utime:.0f} + system {usage.ru_stime:.0f}); load average after: "
          f"{os.getloadavg()[0]:.1f}")
    cpu = results.get("cpu_seconds", {})
    for phase, seconds in results["timings_seconds"].items():
        print(f"  {phase:<28} wall {seconds:7.1f} s   CPU (main process) {cpu.get(phase, math.nan):7.1f} s")


if __name__ == "__main__":
    main()
