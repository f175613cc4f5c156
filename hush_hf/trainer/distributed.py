"""Collectives for DP-SGD over several processes: one logical batch, clipped sums added up, noise once.

DDP's own gradient hook averages (``1/world``) and fires on every backward, and ghost clipping runs
two backward passes per micro-batch; so the DP step keeps DDP out and sums the clipped gradients
itself, once per step, with ``ReduceOp.SUM``. Every helper is a no-op in a single process.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

BUCKET_NUMEL = 1 << 25  # 32M entries (128 MiB in float32) per all-reduce
_SHUTDOWN_REGISTERED = False


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world_size() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) without one."""
    if not is_distributed():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def check_process_group_matches_launch() -> None:
    """RuntimeError if the launcher started several processes that did not join one process group:
    each would then run its own DP training on the same data, and the accounting counts one."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    _, world_size = rank_and_world_size()
    if launched != world_size:
        raise RuntimeError(
            f"the launcher started WORLD_SIZE={launched} processes but this one is in a process group of "
            f"{world_size}; on a machine without GPUs set use_cpu=True in the training arguments"
        )


def destroy_process_group_at_exit() -> None:
    """Destroy the default process group when the interpreter exits (registered once).

    A gloo group left alive at exit is torn down by static destructors while its worker threads
    still run, which can abort a rank with "terminate called without an active exception" after
    training succeeded. Destroying it from ``atexit`` (before that teardown) joins those threads;
    no barrier, so a rank whose peer already died still exits.
    """
    global _SHUTDOWN_REGISTERED
    if _SHUTDOWN_REGISTERED or not is_distributed():
        return
    atexit.register(_destroy_process_group)
    _SHUTDOWN_REGISTERED = True


def _destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_object(value: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``value`` on every rank."""
    if not is_distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def on_rank_zero(load: Any) -> Any:
    """``load()`` run on rank 0 only, its result on every rank; its ValueError raised on every rank (a
    rank that raised alone would leave the others waiting in the broadcast)."""
    result, error = None, None
    if rank_and_world_size()[0] == 0:
        try:
            result = load()
        except ValueError as err:
            error = str(err)
    result, error = broadcast_object((result, error))
    if error is not None:
        raise ValueError(error)
    return result


def all_reduce_sum_(tensors: Sequence[torch.Tensor], bucket_numel: int = BUCKET_NUMEL) -> None:
    """In place: every tensor becomes the sum of its copies over all ranks.

    Tensors are packed into flat buckets per (device, dtype) so that a model costs a few
    collectives, not one per parameter; every rank must pass the same tensors in the same order.
    """
    if not is_distributed():
        return
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    for group in groups.values():
        bucket: list[torch.Tensor] = []
        size = 0
        for t in group:
            if bucket and size + t.numel() > bucket_numel:
                _all_reduce_bucket(bucket)
                bucket, size = [], 0
            bucket.append(t)
            size += t.numel()
        if bucket:
            _all_reduce_bucket(bucket)


def _all_reduce_bucket(bucket: list[torch.Tensor]) -> None:
    flat = torch.cat([t.reshape(-1) for t in bucket])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for t in bucket:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def check_replicas_agree(tensors: Sequence[torch.Tensor]) -> None:
    """RuntimeError on every rank unless all ranks hold the same values (probed: the first entry of each
    tensor). After the noise step every rank must hold the same noisy gradient; noise generators that
    disagree across ranks (e.g. different GPU models) would make the replicas drift apart silently."""
    tensors = [t for t in tensors if t.numel()]
    if not is_distributed() or not tensors:
        return
    probe = torch.stack([t.reshape(-1)[0].to(torch.float64) for t in tensors])
    reference = probe.clone()
    dist.broadcast(reference, src=0)
    differs = torch.tensor([float(not torch.equal(reference, probe))], device=probe.device)
    dist.all_reduce(differs, op=dist.ReduceOp.MAX)
    if differs.item():
        raise RuntimeError("the noisy gradients differ between ranks: the replicas would drift apart")


def one_line(error: BaseException) -> str:
    """The first line of ``error``'s message; prefixed with its class unless a ValueError or RuntimeError
    (hush_hf's refusals), e.g. ``OutOfMemoryError: CUDA out of memory``."""
    lines = str(error).strip().splitlines()
    first = lines[0] if lines else ""
    return first if type(error) in (ValueError, RuntimeError) else f"{type(error).__name__}: {first}"


def reduce_or_refuse(
    values: Sequence[float], failure: BaseException | None, *, op: Any, device: torch.device
) -> list[float]:
    """``values`` reduced over ranks with ``op`` (``ReduceOp.SUM`` or ``MAX``), in the one collective
    that also tells every rank whether any rank holds a ``failure``: if one does, ``failure`` is raised
    on its rank and ``rank k refused: <k's message>`` on the others (a ValueError if k's was one, of any
    subclass, else a RuntimeError; k the lowest failing rank), so no rank goes on into a collective the
    failing one never enters. The messages travel (``all_gather_object``) only when a rank failed. One
    process: ``failure`` raised, else ``values``.

    Why: a check that raised on one rank alone left the others waiting in their next collective until
    the process group's timeout (30 min by default). The flag rides on a reduction the step runs anyway
    (a sum or max of flags in {0, 1} is nonzero iff some rank failed), so the path without an error
    costs no extra collective.
    """
    if not is_distributed():
        if failure is not None:
            raise failure
        return [float(v) for v in values]
    box = torch.tensor([*map(float, values), float(failure is not None)], dtype=torch.float64, device=device)
    dist.all_reduce(box, op=op)
    reduced = box.tolist()
    if reduced[-1]:
        raise_where_any_rank_failed(failure)
    return reduced[:-1]


def raise_where_any_rank_failed(failure: BaseException | None) -> None:
    """Every rank raises (see :func:`reduce_or_refuse`); called on every rank once some rank failed."""
    found: list[tuple[bool, str] | None] = [None] * dist.get_world_size()
    mine = None if failure is None else (isinstance(failure, ValueError), one_line(failure))
    dist.all_gather_object(found, mine)
    if failure is not None:
        raise failure
    rank, (value_error, message) = next((k, f) for k, f in enumerate(found) if f is not None)
    raise (ValueError if value_error else RuntimeError)(f"rank {rank} refused: {message}")


def broadcast_module_state_(module: nn.Module, src: int = 0) -> None:
    """Make every rank's parameters and buffers equal to rank ``src``'s (DP-SGD adds one update to
    one shared model; a rank that started elsewhere would silently train a different model).
    Sharded tensors (FSDP2's DTensor parameters) are skipped: each rank holds its own shard, and
    together the shards are the one model."""
    if not is_distributed():
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if not isinstance(tensor, DTensor):
                dist.broadcast(tensor.data, src=src)


def replicated(tensors: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    """The tensors that are whole copies on every rank, i.e. not FSDP2 shards (DTensor)."""
    return [t for t in tensors if t is not None and not isinstance(t, DTensor)]
