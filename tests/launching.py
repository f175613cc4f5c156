"""Multi-process test launches: a free local port, and ``accelerate launch`` of a test script."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launch(config: Path, script: str, *args: str, timeout: int = 240) -> None:
    """Run ``script`` (its ``__main__`` part) under ``accelerate launch --config_file config`` with the
    repository on PYTHONPATH and one thread per process; fail the test with the tail of its stderr."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        str(Path(sys.executable).with_name("accelerate")),
        "launch",
        "--config_file",
        str(config),
        "--main_process_port",
        str(free_port()),
        script,
        *args,
    ]
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-6000:]
