"""``bench/step_memory.py`` reads a step's peak memory on a CPU from the resident set: the method, checked.

With the allocator settings it runs its contenders under, a tensor freed is returned to the system at
once, and a tensor alive for a moment shows in the peak taken after ``clear_refs``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import step_memory  # noqa: E402

PROBE = """
import sys; sys.path.insert(0, sys.argv[1])
from pathlib import Path
import torch
import step_memory
torch.ones(2**22).sum()  # 16 MiB freed: glibc alone would now take smaller blocks from its heap
before = step_memory.resident_mib("VmRSS")
Path("/proc/self/clear_refs").write_text("5")
held = [torch.ones(2**21) for _ in range(32)]  # 32 x 8 MiB, touched
pin = torch.ones(2**10)  # above them in that heap, so that freeing them cannot shrink it
del held
print(step_memory.resident_mib("VmHWM") - before, step_memory.resident_mib("VmRSS") - before)
"""


def test_a_freed_tensor_shows_in_the_peak_and_leaves_the_resident_set() -> None:
    env = {**os.environ, **step_memory.ALLOCATOR}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(BENCH)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    peak_rise, after = (int(v) for v in out.stdout.split())
    assert 256 <= peak_rise < 256 + 32
    assert after < 8  # glibc's own thresholds kept 33 MiB of the 256 here
