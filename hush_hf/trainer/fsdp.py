"""DP-SGD under FSDP2 (``fully_shard``): which plugin settings are exact, and aligned micro-batches.

Under FSDP2 each rank holds a shard of every parameter. A DP step is still the DDP one: every rank
draws the same logical Poisson batch and takes a disjoint share of it (``batch[rank::world]``); the
clipping engine (:class:`~hush_hf.clipping.GhostClipper`) reduce-scatters each micro-batch's clipped
sum ``sum_i c_i g_i`` to the shards (``ReduceOp.SUM``), so after the step a shard holds the sum over
all ranks; the noise of a shard is the slice of the noise the unsharded run draws
(:func:`hush_hf.trainer.noise.shard_rows`). What FSDP adds is that every forward all-gathers the
parameters, every backward all-gathers them again, and every clipped sum is reduce-scattered: all
collectives, so every rank must run the same number of micro-batches. Shares differ in size by at
most one row, so a rank may have one micro-batch fewer than another (or none): it runs *filler*
micro-batches (:func:`filler_micro_batches`) whose per-example losses are multiplied by 0.

Why a filler adds exactly 0 (not approximately): the gradient of ``0 * loss_i`` reaching every
layer output is exactly 0 (each backward op maps a zero upstream gradient to zero given finite
activations; a non-finite activation makes the norm non-finite, which the engine refuses), so
the per-example norm is 0, the clip factor is 1, and each clipped sum ``sum_t dy_t x_t^T`` is a sum of
products with a zero factor, i.e. exactly (+/-)0 in IEEE arithmetic; ``g + 0 == g`` bit for bit.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from hush_hf.trainer.distributed import is_distributed


def check_fsdp_plugin(plugin: Any) -> None:
    """ValueError, naming the option and its value, for every FSDP setting the DP step cannot run exactly.

    - ``fsdp_version`` must be 2: FSDP1 flattens parameters into one ``FlatParameter`` per unit, so the
      per-layer hooks of ghost clipping see no per-layer weights.
    - ``cpu_offload`` (``CPUOffloadPolicy``): sharded parameters and gradients live on the CPU while
      the clipped sums are built on the accelerator; not supported (not verified).
    - ``mixed_precision_policy`` with a ``param_dtype`` other than float32 or bfloat16, or a float16
      ``reduce_dtype`` (fp16 is refused everywhere: its loss scaler does not see the DP step). bf16 is
      exact in the sense of the DDP bf16 path, see :func:`check_fsdp_precision`.
    - ``activation_checkpointing``: checkpointed clipping takes two backward passes per micro-batch, and
      FSDP would reduce-scatter the gradients in each (not verified).
    - ``ignored_modules``: their parameters stay unsharded replicas beside sharded ones (not verified).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy

    version = getattr(plugin, "fsdp_version", 1)
    if version != 2:
        raise ValueError(
            f"fsdp_version={version!r} is not supported with DP training: FSDP1 flattens the parameters, "
            "which per-layer ghost clipping cannot see; use fsdp_version: 2 (FSDP2, fully_shard)"
        )
    if isinstance(getattr(plugin, "cpu_offload", None), CPUOffloadPolicy):
        raise ValueError(
            "fsdp_offload_params=True (cpu_offload) is not supported with DP training under FSDP: the "
            "clipped sums are built on the accelerator while the offloaded shards live on the CPU (not "
            "verified); set fsdp_offload_params: false"
        )
    check_fsdp_precision(getattr(plugin, "mixed_precision_policy", None))
    if getattr(plugin, "activation_checkpointing", False):
        raise ValueError(
            "fsdp_activation_checkpointing=True is not supported with DP training: checkpointed clipping "
            "runs two backward passes per micro-batch and FSDP would reduce-scatter the gradients in each "
            "(not verified); turn checkpointing off under FSDP, or use DDP with gradient_checkpointing=True"
        )
    if getattr(plugin, "ignored_modules", None):
        raise ValueError(
            "FSDP ignored_modules is not supported with DP training: unsharded replicas beside sharded "
            "parameters are not verified; shard the whole model"
        )


SUPPORTED_PRECISIONS = (None, torch.float32, torch.bfloat16)


def check_fsdp_precision(policy: Any) -> None:
    """ValueError for an FSDP2 ``MixedPrecisionPolicy`` whose dtypes the DP step does not run exactly.

    Supported: float32, and bf16 compute, i.e. ``param_dtype=torch.bfloat16`` (what accelerate's
    ``mixed_precision: bf16`` sets, over float32 master weights) or a model loaded in bf16. Exact in the
    sense the DDP bf16 path is: the per-example norm and the applied ``c_i g_i`` are computed from the
    same bf16 factors (in float32), so each example's applied gradient stays within C, with the bf16 clip
    margin of ``GhostClipper`` (``CLIP_MARGINS``: 2^-6, covering how differently the two routes round).
    What rounds after that is the sum of the clipped gradients: the engine reduce-scatters it over ranks
    itself, in float32 (``GhostClipper._accumulate``), so FSDP's ``reduce_dtype`` never touches it
    (tests/test_fsdp.py: bf16 and float32 ``reduce_dtype`` train bit-identical models). A bf16
    parameter's clipped sum stays in float32 over micro-batches and ranks, as under DDP; the noise is
    added to it in float32 and the result rounded once (:mod:`hush_hf.clipping.clipped_sums`), so the
    sum the noise covers has sensitivity C whatever the parameter dtype.
    """
    for field in ("param_dtype", "reduce_dtype"):
        dtype = getattr(policy, field, None)
        if dtype not in SUPPORTED_PRECISIONS:
            raise ValueError(
                f"FSDP mixed_precision_policy {field}={dtype} is not supported with DP training: use bf16 "
                "(mixed_precision: bf16) or float32 (mixed_precision: 'no'); fp16's loss scaler does not "
                "see the DP step's backward passes"
            )


def check_fsdp_arguments(args: Any) -> None:
    """The checks of :func:`check_fsdp_plugin` on ``TrainingArguments.fsdp`` / ``fsdp_config`` (before the
    Trainer builds its plugin from them). ``bf16=True`` becomes accelerate's bf16 policy (supported, see
    :func:`check_fsdp_precision`); ``fp16`` is refused for every DP run."""
    plugin_args = getattr(args, "fsdp_plugin_args", None) or {}
    if "offload" in str(args.fsdp) or plugin_args.get("cpu_offload"):
        raise ValueError(
            "fsdp cpu_offload is not supported with DP training under FSDP: the clipped sums are built on "
            "the accelerator while the offloaded shards live on the CPU (not verified); drop 'offload'"
        )
    check_fsdp_plugin(SimpleNamespace(**{"fsdp_version": 1, **plugin_args}))


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether FSDP2 (``fully_shard``) manages some part of ``model``."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def micro_batch_count(rows: int, max_size: int) -> int:
    """How many micro-batches of at most ``max_size`` rows hold ``rows`` rows (0 for 0 rows)."""
    if rows < 0 or max_size < 1:
        raise ValueError(f"need rows >= 0 and max_size >= 1, got rows={rows}, max_size={max_size}")
    return math.ceil(rows / max_size)


def filler_micro_batches(local: int, busiest: int) -> int:
    """How many zero-weight filler micro-batches a rank with ``local`` micro-batches runs so that it runs
    as many as the busiest rank (``busiest``, from :func:`max_across_ranks`)."""
    if not 0 <= local <= busiest:
        raise ValueError(f"need 0 <= local <= busiest, got local={local}, busiest={busiest}")
    return busiest - local


def max_across_ranks(value: int, device: torch.device) -> int:
    """The largest ``value`` over all ranks (a collective; ``value`` itself in a single process)."""
    if not is_distributed():
        return int(value)
    box = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return int(box.item())
