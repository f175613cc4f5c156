"""An experiment as a script runs it: parse (presets + flags), validate before any work, run, write results.

A recipe states its experiment and hands the rest to :class:`Experiment`::

    EXPERIMENT = Experiment("arxiv_mlm", ArxivMLMArguments, PRESETS, validate=validate, run=run)

    if __name__ == "__main__":
        EXPERIMENT.main()

``run(args, config, session)`` gets the parsed arguments, the ``SecretProtectionConfig`` and a
:class:`Session` (output folder, main process or not, a stopwatch of the phases) and returns what
``results.json`` holds; :meth:`Session.finish` writes ``results.json`` and ``results.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hush_hf.experiments.arguments import parse_experiment_arguments
from hush_hf.experiments.logs import Stopwatch, experiment_logger, experiment_logging
from hush_hf.experiments.results import finish

T = TypeVar("T")


class Session:
    """What one run of an experiment shares across its phases: ``output_dir``, ``main_process`` (only
    the main process plans and writes files; every process trains) and ``watch`` (wall and CPU seconds
    per phase: ``with session.watch("planning"): ...``)."""

    def __init__(self, config: Any) -> None:
        self.output_dir = Path(config.output_dir)
        self.main_process = config.process_index == 0
        self.watch = Stopwatch()

    def on_main_process(self, compute: Callable[[], T]) -> T:
        """``compute()`` on the main process, its result sent to every process (under ``accelerate
        launch`` every rank then trains with exactly the main process's plans)."""
        from hush_hf.trainer.distributed import broadcast_object

        return broadcast_object(compute() if self.main_process else None)

    def finish(self, results: dict[str, Any], page: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
        """Stamp the phase times into ``results``; on the main process write ``results.json`` and
        ``results.md`` (``page(results)``); returns ``results``."""
        finish(results, self.output_dir, self.watch, page, main_process=self.main_process)
        return results


@dataclass(frozen=True)
class Experiment:
    """``name`` (default output folder ``outputs/<name>``), ``arguments`` (a dataclass extending
    :class:`~hush_hf.experiments.ExperimentArguments`), ``presets`` (preset name -> defaults of the
    arguments and the ``SecretProtectionConfig``), ``validate(args, config)`` (raises ValueError naming
    the field and value, before any work) and ``run(args, config, session)`` (returns the results)."""

    name: str
    arguments: type
    presets: Mapping[str, Mapping[str, Any]]
    validate: Callable[[Any, Any], None]
    run: Callable[[Any, Any, Session], dict[str, Any]]

    @property
    def logger(self) -> logging.Logger:
        return experiment_logger(self.name)

    def parse(self, argv: Sequence[str] | None = None) -> tuple[Any, Any]:
        """``(args, config)`` from ``argv`` (default ``sys.argv[1:]``): the preset's defaults, flags win."""
        return parse_experiment_arguments(self.arguments, self.presets, name=self.name, argv=argv)

    def main(self, argv: Sequence[str] | None = None) -> dict[str, Any]:
        """Parse, validate before any work, then run with the experiment's logging (stderr and
        ``run.log``); returns what ``results.json`` holds."""
        args, config = self.parse(argv)
        self.validate(args, config)
        with experiment_logging(Path(config.output_dir), main_process=config.process_index == 0):
            return self.run(args, config, Session(config))
