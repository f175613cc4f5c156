"""Launches an experiment refuses before any work: what ``accelerate launch`` set up that the DP step cannot
run exactly (the trainer refuses the same, but only once built, after a planning that can take minutes)."""

from __future__ import annotations

from collections.abc import Mapping


def refuse_unsupported_launch(environ: Mapping[str, str] | None = None) -> None:
    """ValueError, before any work, when ``accelerate launch`` set up DeepSpeed or an FSDP setting the DP
    step cannot run exactly (the trainer refuses them too, but only once built, after the planning, which
    can take minutes). FSDP2 in float32 or bf16 without offloading runs (``configs/accelerate/fsdp.yaml``);
    the full list of refused FSDP options is :func:`hush_hf.trainer.fsdp.check_fsdp_plugin`.
    """
    import os

    environ = os.environ if environ is None else environ

    def requested(variable: str) -> bool:
        return str(environ.get(variable, "")).lower() in ("1", "true", "yes")

    if requested("ACCELERATE_USE_DEEPSPEED"):
        raise ValueError(
            f"ACCELERATE_USE_DEEPSPEED={environ['ACCELERATE_USE_DEEPSPEED']!r}: DeepSpeed is not supported "
            "with DP training (it owns the backward and the gradient reduction, which the DP step must "
            "drive); launch with configs/accelerate/fsdp.yaml (FSDP2), multi_gpu.yaml (DDP) or "
            "single_gpu.yaml instead"
        )
    if not requested("ACCELERATE_USE_FSDP"):
        return
    version = environ.get("FSDP_VERSION", "1")  # accelerate's default
    if version != "2":
        raise ValueError(
            f"FSDP_VERSION={version!r}: FSDP1 is not supported with DP training (it flattens the parameters, "
            "which per-layer ghost clipping cannot see); set fsdp_version: 2 (configs/accelerate/fsdp.yaml)"
        )
    for variable, why in (
        ("FSDP_OFFLOAD_PARAMS", "offloaded shards are not verified"),
        (
            "FSDP_ACTIVATION_CHECKPOINTING",
            "checkpointed clipping runs two backward passes per micro-batch and FSDP would reduce-scatter "
            "the gradients in each (not verified); use DDP with gradient_checkpointing=True",
        ),
    ):
        if requested(variable):
            raise ValueError(
                f"{variable}={environ[variable]!r} is not supported with DP training under FSDP: {why}"
            )
    precision = str(environ.get("ACCELERATE_MIXED_PRECISION", "no")).lower()
    if precision not in ("no", "fp32", "bf16"):
        raise ValueError(
            f"ACCELERATE_MIXED_PRECISION={precision!r} is not supported with DP training under FSDP: use "
            "mixed_precision: bf16 or 'no' (fp16's loss scaler does not see the DP step's backward passes)"
        )
