"""reduce_or_refuse: a reduction that also tells every rank whether one failed (2 spawned gloo processes).

The end-to-end runs (a trainer check failing on one rank) are in test_rank_errors.py; this checks the
primitive itself, fast: values reduced exactly without an error; with one, the failing rank raises its
own exception object and the others ``rank k refused: <its first line>``, and the group stays usable.
"""

from __future__ import annotations

import datetime
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hush_hf.trainer.distributed import one_line, reduce_or_refuse
from tests.launching import free_port

DEVICE = torch.device("cpu")


class Custom(Exception):
    pass


class CustomValueError(ValueError):
    pass


def _raised(values, failure, op) -> tuple[str, str, bool] | list[float]:
    """What ``reduce_or_refuse`` returned, or (class, message, whether it is ``failure`` itself)."""
    try:
        return reduce_or_refuse(values, failure, op=op, device=DEVICE)
    except Exception as error:  # noqa: BLE001  (what each rank raised is the result)
        return type(error).__name__, str(error), error is failure


def worker(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    SUM, MAX = dist.ReduceOp.SUM, dist.ReduceOp.MAX
    results = {
        "sum": _raised([rank + 1.0, 2.0**53], None, SUM),
        "max": _raised([float(rank), -1.0], None, MAX),
        "none": _raised([], None, MAX),
        "value_error_on_1": _raised([3.0], ValueError("bad row\nsecond line") if rank == 1 else None, SUM),
        "custom_on_0": _raised([3.0], Custom("odd thing") if rank == 0 else None, MAX),
        "subclass_on_1": _raised([0.0], CustomValueError("odd value") if rank == 1 else None, SUM),
        "both": _raised([3.0], RuntimeError(f"rank {rank} broke"), SUM),
        "after": _raised([1.0], None, SUM),  # the group still works after the refusals
    }
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


def test_every_rank_raises_when_one_failed_and_the_values_are_reduced_otherwise(tmp_path):
    out = str(tmp_path / "agreement")
    context = mp.start_processes(
        worker, args=(2, free_port(), out), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 120
    try:
        while not context.join(timeout=1):
            assert time.monotonic() < deadline, "the ranks hung"
    finally:
        for process in context.processes:  # ended on any failure: no process outlives the test
            if process.is_alive():
                process.kill()
                process.join()
    r0, r1 = (torch.load(f"{out}.{rank}", weights_only=False) for rank in (0, 1))
    assert r0["sum"] == r1["sum"] == [3.0, 2.0**54]  # exact in float64
    assert r0["max"] == r1["max"] == [1.0, -1.0]
    assert r0["none"] == r1["none"] == []
    assert r1["value_error_on_1"] == ("ValueError", "bad row\nsecond line", True)  # its own exception
    assert r0["value_error_on_1"] == ("ValueError", "rank 1 refused: bad row", False)  # first line only
    assert r0["custom_on_0"] == ("Custom", "odd thing", True)
    assert r1["custom_on_0"] == ("RuntimeError", "rank 0 refused: Custom: odd thing", False)
    assert r0["subclass_on_1"] == ("ValueError", "rank 1 refused: CustomValueError: odd value", False)
    assert r0["both"] == ("RuntimeError", "rank 0 broke", True)
    assert r1["both"] == ("RuntimeError", "rank 1 broke", True)
    assert r0["after"] == r1["after"] == [2.0]


def test_one_process_raises_the_failure_or_returns_the_values():
    error = ValueError("x")
    with pytest.raises(ValueError) as raised:
        reduce_or_refuse([1.0], error, op=None, device=DEVICE)
    assert raised.value is error
    assert reduce_or_refuse([1, 2.5], None, op=None, device=DEVICE) == [1.0, 2.5]
    assert one_line(RuntimeError("  first\nsecond")) == "first"
    assert one_line(KeyError("k")) == "KeyError: 'k'"
    assert one_line(ValueError("")) == ""
