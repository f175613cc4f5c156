"""Multi-process test launches: a free local port, and ``accelerate launch`` of a test script."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launch(config: Path, script: str, *args: str, timeout: int = 240) -> None:
    """Run ``script`` (its ``__main__`` part) under ``accelerate launch --config_file config`` with the
    repository on PYTHONPATH and one thread per process; fail the test with the tail of its stderr.

    The launch runs in a session of its own: past ``timeout`` (e.g. ranks hung in a collective) the
    launcher and every worker it started are ended together, none is left running after the test."""
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
    with subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ) as launch:
        try:
            _, stderr = launch.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end_session(launch)
            _, stderr = launch.communicate()
            raise AssertionError(f"the launch ran past {timeout} s (ended):\n{stderr[-6000:]}") from None
    assert launch.returncode == 0, stderr[-6000:]


def _end_session(launch: subprocess.Popen) -> None:
    """SIGTERM to the launch's whole process group, then SIGKILL to what is left after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(launch.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            launch.poll()  # reap the launcher: a zombie still counts as a member of the group
            try:
                os.killpg(launch.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
