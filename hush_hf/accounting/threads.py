"""Evaluating independent laws on several threads, with the same numbers as one thread.

The ``tight`` accountant's work per law (``blowup``) is numpy and scipy on arrays of 10^4-10^5
entries, which run without the GIL: a second core nearly halves a batch of laws (the trainer
re-verifies every secret's bound before its first step). Each law's bound is a function of that
law's inputs alone, computed by the same code in whichever thread, and results are put back in
input order, so the bounds are bitwise those of a serial loop. Every task runs in a copy of the
caller's context (numpy's ``errstate`` lives there); the pool is shut down before returning, also
when a task raises (its exception is re-raised here, and the tasks not yet started are dropped).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def validate_workers(workers: object) -> int:
    """A thread count: an int >= 1 (``ValueError`` otherwise)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    return workers


def map_in_threads(function: Callable[[Item], Result], items: Sequence[Item], workers: int) -> list[Result]:
    """``[function(x) for x in items]``, on up to ``workers`` threads (one: in this thread)."""
    workers = min(validate_workers(workers), len(items))
    if workers <= 1:
        return [function(item) for item in items]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hush-laws")
    try:
        futures = [pool.submit(contextvars.copy_context().run, function, item) for item in items]
        return [future.result() for future in futures]
    finally:  # after a failure (or Ctrl-C) the tasks not yet started are dropped, not waited for
        pool.shutdown(wait=True, cancel_futures=True)
