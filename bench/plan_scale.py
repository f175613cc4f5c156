"""Planning at scale: noise calibration (100K secrets) and the example-weight LP (200K x 20K and the
paper's 1.7M x 100K), each in its own process so peak memory is per task.

    python bench/plan_scale.py            # everything (several minutes on 2 cores)
    python bench/plan_scale.py --quick    # calibration with kl and tight, LP at the 200K x 20K scale only

Targets (issue "Protection planning"): calibration <= 2 s (kl) and <= 60 s (tight); LP <= 30 s at
200K x 20K and <= 5 min with <= 8 GB and a certified gap <= 1% at the paper's scale.
Results are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs = [
        [HERE / "calibration_scale.py", "--accountants", "kl,tight"],
        [HERE / "lp_scale.py", "--scale", "small" if args.quick else "both"],
    ]
    for script, *script_args in runs:
        print(f"== {script.name} {' '.join(script_args)}", flush=True)
        subprocess.run([sys.executable, str(script), *script_args], check=True)


if __name__ == "__main__":
    main()
