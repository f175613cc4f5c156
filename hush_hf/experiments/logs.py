"""Logging of an experiment (stderr and ``run.log``), loud warnings, and a stopwatch of wall and CPU time."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger("hush_hf.experiments")


def experiment_logger(name: str) -> logging.Logger:
    """The logger of experiment ``name`` (what :func:`experiment_logging` writes to ``run.log``)."""
    return logger.getChild(name)


# ------------------------------------------------------------------------------------ logging
@contextlib.contextmanager
def experiment_logging(output_dir: Path, *, main_process: bool) -> Iterator[logging.Logger]:
    """INFO logs of hush_hf (the experiment's included) to stderr and, on the main process,
    ``output_dir/run.log``.

    The handlers and levels are restored on exit, so an experiment's ``main()`` can run inside another
    program (or a test) without changing its logging.
    """
    import datasets
    import transformers

    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(output_dir / "run.log", mode="w", encoding="utf-8"))
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    named = [logging.getLogger("hush_hf")]
    saved = [(log, log.level) for log in named]
    saved_verbosity = (transformers.utils.logging.get_verbosity(), datasets.utils.logging.get_verbosity())
    for handler in handlers:
        handler.setFormatter(formatter)
        for log in named:
            log.addHandler(handler)
    for log in named:
        log.setLevel(logging.INFO if main_process else logging.WARNING)
    transformers.utils.logging.set_verbosity_warning()
    datasets.utils.logging.set_verbosity_warning()
    try:
        yield logger
    finally:
        for handler in handlers:
            for log in named:
                log.removeHandler(handler)
            handler.close()
        for log, level in saved:
            log.setLevel(level)
        transformers.utils.logging.set_verbosity(saved_verbosity[0])
        datasets.utils.logging.set_verbosity(saved_verbosity[1])


def loud(message: str) -> str:
    """Log ``message`` as a framed warning (hard to miss in a long log) and return it."""
    rule = "!" * 100
    logger.warning("\n%s\n%s\n%s", rule, message, rule)
    return message


class Stopwatch:
    """Seconds per named phase: ``with watch("planning"): ...``; ``watch.seconds`` holds the wall-clock
    time and ``watch.cpu_seconds`` the process CPU time (all threads; on a shared machine it is the one
    that says what the work costs)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}
        self._start = time.perf_counter()
        self._cpu_start = time.process_time()

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            self.seconds[phase] = self.seconds.get(phase, 0.0) + wall
            self.cpu_seconds[phase] = self.cpu_seconds.get(phase, 0.0) + cpu
            logger.info("%s: %.1f s (CPU %.1f s)", phase, wall, cpu)

    def total(self) -> float:
        return time.perf_counter() - self._start

    def total_cpu(self) -> float:
        return time.process_time() - self._cpu_start
