"""The Gaussian mechanism of one DP-SGD step (Hush Alg. 2, lines 9-10).

Given ``p.grad = sum_{i in batch} clip(g_i, C)`` for every trainable parameter, the noisy gradient is

    p.grad <- (p.grad + sigma * C * z_p) / B,   z_p ~ N(0, I) independent over parameters and entries,

with B the *expected* batch size (dividing by the drawn size would make the scale data-dependent).
The noise of step t is drawn from generators seeded by ``(dp_seed, t)`` (see ``hush_hf.sampling.seeds``),
so it is identical on every rank and after a resume, and unknown to anyone without ``dp_seed``.

torch's generators (mt19937 on CPU, Philox on GPU) are not cryptographically secure and sample
floating-point Gaussians; this is the usual DP-SGD implementation gap (cf. Opacus ``secure_mode``,
Mironov 2012), not a weakening specific to hush_hf.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from hush_hf.clipping.clipped_sums import clipped_sums_for_noise, round_into_grads_
from hush_hf.clipping.tensor_views import as_shape
from hush_hf.sampling.seeds import NOISE_STREAM, step_seed_sequence


def noise_generator(
    dp_seed: int, step: int, device: torch.device, device_ordinal: int = 0
) -> torch.Generator:
    """The generator of step ``step`` for the ``device_ordinal``-th device holding parameters.

    Distinct devices get distinct streams: reusing one stream on two devices would give two
    parameter blocks identical noise, i.e. no noise along their difference.
    """
    state = step_seed_sequence(dp_seed, step, NOISE_STREAM, device_ordinal).generate_state(1, dtype=np.uint64)
    generator = torch.Generator(device=device)
    generator.manual_seed(int(state[0]))
    return generator


def shard_rows(full: torch.Tensor, grad: DTensor) -> torch.Tensor:
    """This rank's rows of ``full`` for a gradient sharded like FSDP2's parameters (``Shard(0)`` on a
    1-D mesh, ``torch.chunk`` sizes): the noise of a shard is the slice of the noise the unsharded run
    draws, so sharded and unsharded runs add identical noise. Every rank draws the whole tensor (the
    generators are sequential); anything else than dim-0 sharding on one mesh dimension is refused."""
    mesh = grad.device_mesh
    if mesh.ndim != 1 or tuple(grad.placements) != (Shard(0),):
        raise ValueError(
            f"sharded gradients must be Shard(0) on a 1-D device mesh (FSDP2), got {tuple(grad.placements)} "
            f"on a {mesh.ndim}-D mesh"
        )
    pieces = torch.chunk(full, mesh.size(), dim=0)
    rank = mesh.get_local_rank()
    local = pieces[rank] if rank < len(pieces) else full[:0]
    if local.shape != grad.to_local().shape:
        raise ValueError(
            f"local gradient shard has shape {tuple(grad.to_local().shape)}, expected {tuple(local.shape)} "
            "from torch.chunk of the full gradient"
        )
    return local


NOISE_DRAW_MAX = 2**26
"""Most entries one ``randn`` draws (256 MiB in float32), unless one parameter alone has more: bounds the
noise held at once under FSDP, where each rank draws every parameter's full noise and keeps its rows."""


def draw_noise(grads: Sequence[torch.Tensor], dp_seed: int, step: int) -> list[torch.Tensor]:
    """Standard normal noise shaped like each of ``grads``, in its dtype; for a sharded one (a DTensor)
    this rank's rows of the full-size noise (``shard_rows``).

    One ``randn`` per device and dtype for a run of consecutive parameters of at most ``NOISE_DRAW_MAX``
    entries together (one kernel launch for all of a small model's parameters instead of one each),
    split in parameter order: parameter p's noise is the next ``numel(p)`` draws of its device's stream,
    independent entries of N(0, 1) like separate draws. Devices get their stream ordinal in order of
    first appearance, and a device's groups draw in order of first appearance, so the noise depends on
    (dp_seed, step) and the parameter list only: a sharded and an unsharded run add the same noise. A
    sharded parameter keeps a copy of its rows, so a run's full draw is freed before the next."""
    generators: dict[torch.device, torch.Generator] = {}
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for k, grad in enumerate(grads):
        if grad.device not in generators:
            generators[grad.device] = noise_generator(dp_seed, step, grad.device, len(generators))
        groups.setdefault((grad.device, grad.dtype), []).append(k)
    noises: dict[int, torch.Tensor] = {}
    for (device, dtype), members in groups.items():
        for run in _runs(members, [grads[k].numel() for k in members]):
            sizes = [grads[k].numel() for k in run]
            flat = torch.randn(sum(sizes), generator=generators[device], device=device, dtype=dtype)
            for k, part in zip(run, flat.split(sizes), strict=True):
                full = as_shape(part, grads[k].shape)  # a bias's part is 1-D already
                noises[k] = shard_rows(full, grads[k]).clone() if isinstance(grads[k], DTensor) else full
    return [noises[k] for k in range(len(grads))]


def _runs(members: list[int], sizes: list[int]) -> list[list[int]]:
    """``members`` cut, in order, into runs of at most ``NOISE_DRAW_MAX`` entries (a larger one alone)."""
    runs: list[list[int]] = []
    total = NOISE_DRAW_MAX + 1
    for k, size in zip(members, sizes, strict=True):
        if total + size > NOISE_DRAW_MAX:
            runs.append([])
            total = 0
        runs[-1].append(k)
        total += size
    return runs


def privatize_gradients_(
    params: Sequence[nn.Parameter],
    *,
    noise_multiplier: float,
    clip_norm: float,
    expected_batch_size: float,
    dp_seed: int,
    step: int,
) -> None:
    """In place: ``p.grad <- (S_p + N(0, (sigma C)^2 I)) / B`` for every parameter, in order, with
    ``S_p`` the clipped sum (``clipped_sums.clipped_sums_for_noise``: ``p.grad``, or the float32 sum the
    engine keeps beside a bf16/fp16 parameter).

    Parameters are visited in the given order and each device draws from its own stream
    (``draw_noise``), so the same call gives the same noise on every rank. Low-precision parameters
    get the noise added in float32 and are rounded once afterwards: rounding after the mechanism is
    post-processing, while rounding the noise first would no longer be a Gaussian mechanism, and
    rounding the clipped sum first would no longer bound its sensitivity by C.
    """
    if not (np.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier!r}")
    if not (np.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm!r}")
    if not (np.isfinite(expected_batch_size) and expected_batch_size > 0):
        raise ValueError(f"expected_batch_size must be a positive finite number, got {expected_batch_size!r}")
    std = float(noise_multiplier) * float(clip_norm)
    with torch.no_grad():
        grads = clipped_sums_for_noise(params)
        # float32 at least: a bf16/fp16 parameter's sum is float32 here (clipped_sums)
        # (a sharded sum gets its rows of the full noise, ``shard_rows``)
        noises = draw_noise(grads, dp_seed, step) if std > 0 and grads else []
        local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        # One draw per device, dtype and run, two foreach kernels: not three kernels per parameter.
        if noises:
            torch._foreach_add_(local, noises, alpha=std)
        if local:
            torch._foreach_div_(local, float(expected_batch_size))
    round_into_grads_(params)
