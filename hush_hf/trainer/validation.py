"""Which ``TrainingArguments`` a DP step can run under; errors name the field and the value."""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

from torch import nn
from transformers import TrainingArguments


def check_positive(field: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{field} must be a positive finite number, got {value!r}")


def check_flag(field: str, value: Any) -> None:
    """True or False only: a string such as ``"false"`` is truthy and would turn the option on."""
    if not isinstance(value, bool):
        raise ValueError(f"{field} must be True or False, got {value!r}")


def check_name(field: str, value: Any) -> None:
    """A column name: a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field} must be a non-empty column name, got {value!r}")


def check_path(field: str, value: Any) -> None:
    """None or a non-empty path (``""`` would be the current folder, or no file at all)."""
    if value is None:
        return
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        shown = repr(value) if isinstance(value, str) else f"a {type(value).__name__}"
        raise ValueError(f"{field} must be None or a non-empty path, got {shown}")


def check_noise_multiplier(value: Any) -> None:
    """None (use the plan's) or a finite number >= 0."""
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"noise_multiplier must be None or a finite number >= 0, got {value!r}")


def check_dp_training_arguments(args: TrainingArguments) -> None:
    """ValueError for every setting that would break the DP step or its accounting.

    - ``gradient_accumulation_steps`` must be 1: one optimizer step is one DP step; the logical batch
      is split into micro-batches inside the step.
    - ``max_grad_norm`` must be 0: per-example clipping replaces batch clipping, and Trainer's norm
      of the pre-noise gradient would be logged.
    - ``max_steps`` is the T the noise is calibrated for.
    - ``fp16`` (its loss scaler does not see the DP step's backward passes), ``torch_compile``,
      DeepSpeed (it owns the backward and the gradient reduction), several GPUs in one process
      (DataParallel). FSDP: only FSDP2 in float32 or bf16 without offloading
      (:func:`hush_hf.trainer.fsdp.check_fsdp_arguments`), and without activation checkpointing.
    - ``activation_checkpointing`` (``gradient_checkpointing``, on by default in TRL's ``SFTConfig``) is
      supported: the clipping engine then takes each micro-batch in two backward passes, norms then
      clipped sum, recomputing the checkpointed layers in each (:mod:`hush_hf.clipping.recompute`).
      Under FSDP each of those passes would run FSDP's gradient reduce-scatter: not verified, refused.
    - ``auto_find_batch_size`` restarts training after an out-of-memory error and
      ``ignore_data_skip`` replays batches after a resume: both would reuse batches the accounting
      counts once. Pushing checkpoints to the Hub would publish their un-noised training logs
      (``trainer_state.json``) and optimizer state.
    - ``neftune_noise_alpha``: NEFTune adds U(-a, a) noise to the embeddings with a = alpha / sqrt(L d),
      L the micro-batch's padded width: example i's gradient then depends on the longest row drawn with
      it (the first-step independence check runs in eval mode, where NEFTune is off, and cannot see it).
    - ``label_smoothing_factor`` is not part of the per-example loss; a ``train_sampling_strategy``
      other than "random" would be ignored (the plan's sampler draws the batches).
    - ``parallelism_config`` with tensor, context or sequence parallelism (``PARALLEL_AXES``).
    - LOMO and layer-wise optimizers update parameters during the backward pass, before the noise.
    - Nothing logged may depend on the pre-noise step (see :func:`check_no_pre_noise_logging`).
    """
    ga = args.gradient_accumulation_steps
    if ga != 1:
        raise ValueError(
            f"gradient_accumulation_steps must be 1, got {ga}: the DP step accumulates micro-batches itself; "
            "set expected_batch_size (B) for the logical batch and per_device_train_batch_size for the "
            "micro-batch"
        )
    if args.max_grad_norm != 0:
        raise ValueError(
            f"max_grad_norm must be 0, got {args.max_grad_norm!r}: each example's gradient is clipped at "
            "per_example_clip_norm instead, and Trainer's batch-gradient norm would reveal the pre-noise "
            "gradient"
        )
    if (
        isinstance(args.max_steps, bool)
        or not isinstance(args.max_steps, numbers.Integral)
        or args.max_steps < 1
    ):
        raise ValueError(
            f"max_steps must be an integer >= 1 (the number of DP steps T the noise is calibrated for), "
            f"got {args.max_steps!r}; num_train_epochs is not used"
        )
    check_positive("per_device_train_batch_size", args.per_device_train_batch_size)
    unsupported = {
        "fp16": (args.fp16, "use bf16 or float32"),
        "torch_compile": (args.torch_compile, "the clipping hooks are not verified under torch.compile"),
        "deepspeed": (args.deepspeed, "DeepSpeed owns the backward and gradient reduction"),
        "auto_find_batch_size": (args.auto_find_batch_size, "it restarts training and would reuse batches"),
        "ignore_data_skip": (args.ignore_data_skip, "a resumed run would replay batches 0, 1, ..."),
        "label_smoothing_factor": (
            args.label_smoothing_factor,
            "the per-example loss has no label smoothing",
        ),
        "neftune_noise_alpha": (
            args.neftune_noise_alpha is not None and args.neftune_noise_alpha,
            "NEFTune's embedding noise scales with the micro-batch's padded width, so one example's "
            "gradient would depend on the other drawn rows' lengths",
        ),
        "train_sampling_strategy": (
            args.train_sampling_strategy != "random" and args.train_sampling_strategy,
            "batches are drawn by the plan's weighted Poisson sampler",
        ),
    }
    optim = str(getattr(args.optim, "value", args.optim))
    unsupported["optim"] = (
        ("lomo" in optim or "layerwise" in optim) and optim,
        "it updates parameters inside the backward pass, before the noise is added",
    )
    for field, (value, why) in unsupported.items():
        if value:
            raise ValueError(f"{field}={value!r} is not supported with DP training: {why}")
    config = getattr(args, "parallelism_config", None)
    for axis in ("tp", "cp", "sp"):
        size = getattr(config, f"{axis}_size", None) or 1
        if size > 1:
            raise ValueError(
                f"parallelism_config.{axis}_size={size} is not supported with DP training: "
                f"{PARALLEL_AXES[axis]}; use data parallelism (DDP) or FSDP2"
            )
    if args.fsdp and args.activation_checkpointing:
        raise ValueError(
            f"activation_checkpointing=True with fsdp={args.fsdp!r} is not supported with DP training: "
            "checkpointed clipping runs two backward passes per micro-batch and FSDP would reduce-scatter "
            "the gradients in each (not verified); turn checkpointing off under FSDP, or use DDP"
        )
    if args.fsdp:
        from hush_hf.trainer.fsdp import check_fsdp_arguments

        check_fsdp_arguments(args)
    if args.push_to_hub and str(getattr(args.hub_strategy, "value", args.hub_strategy)) in (
        "checkpoint",
        "all_checkpoints",
    ):
        raise ValueError(
            f"hub_strategy={args.hub_strategy!r} with push_to_hub would upload checkpoints, which hold "
            "the un-noised training logs (trainer_state.json); use hub_strategy='end' or 'every_save'"
        )
    check_no_pre_noise_logging(args)


PARALLEL_AXES = {
    "tp": "tensor parallelism gives every rank of a group the same rows and combines partial results of "
    "them, but the DP step gives each rank its own share of the drawn rows, so ranks would mix examples",
    "cp": "context parallelism splits each row's tokens across ranks, so no rank sees an example's whole "
    "gradient to clip",
    "sp": "sequence parallelism splits each row's tokens across ranks, so no rank sees an example's whole "
    "gradient to clip",
}


def check_model_not_tensor_parallel(model: Any) -> None:
    """A model loaded with a tensor-parallel plan (``tp_size`` > 1): see ``PARALLEL_AXES["tp"]``."""
    size = getattr(model, "tp_size", None) or 1
    if size > 1:
        raise ValueError(
            f"the model is tensor-parallel (tp_size={size}, loaded with tp_plan): not supported with DP "
            f"training: {PARALLEL_AXES['tp']}; load it without tp_plan and use DDP or FSDP2"
        )


def check_model_not_compiled(model: Any) -> None:
    """A model compiled with ``torch.compile`` (an ``OptimizedModule``, at the top or inside, or compiled in
    place by ``nn.Module.compile``): refused like ``torch_compile=True``, since the clipping hooks are not
    verified under torch.compile (it failed later, with an error that did not say so)."""
    import sys

    if not isinstance(model, nn.Module):
        return
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # never imported: nothing was compiled by it
    optimized = getattr(eval_frame, "OptimizedModule", ())
    for path, module in model.named_modules():
        if isinstance(module, optimized) or getattr(module, "_compiled_call_impl", None) is not None:
            where = "the model" if not path else f"its module '{path}'"
            raise ValueError(
                f"{where} is compiled with torch.compile ({type(module).__name__}): not supported with DP "
                "training: the clipping hooks are not verified under torch.compile; pass the uncompiled "
                "model (torch.compile(model)._orig_mod is the original)"
            )


WANDB_WATCH_GRADIENTS = ("gradients", "all")


def check_no_pre_noise_logging(args: TrainingArguments) -> None:
    """ValueError for logging that reads the batch or the gradient before the noise is added.

    - ``include_num_input_tokens_seen`` logs the token count of every drawn batch: it depends on which
      examples were sampled (and on their lengths), which the noise does not hide.
    - ``WANDB_WATCH`` set to ``gradients`` or ``all`` with ``report_to`` including wandb: ``wandb.watch``
      puts hooks on the parameters that log the clipped, not yet noised, gradients. (The environment
      variable is read when training starts; this runs then too.)
    """
    tokens_seen = args.include_num_input_tokens_seen
    if tokens_seen not in ("no", False, None):
        raise ValueError(
            f"include_num_input_tokens_seen={tokens_seen!r} is not supported with DP training: the logged "
            "token count depends on which examples were sampled and on their lengths; set it to 'no'"
        )
    report_to = args.report_to
    if isinstance(report_to, str):
        report_to = [report_to]
    watch = os.environ.get("WANDB_WATCH", "false")
    if watch.strip().lower() in WANDB_WATCH_GRADIENTS and {"wandb", "all"} & set(report_to or ()):
        raise ValueError(
            f"environment variable WANDB_WATCH={watch!r} with report_to={list(report_to)!r} is not supported "
            "with DP training: wandb.watch logs the gradients before the noise is added; unset WANDB_WATCH "
            "or set it to 'false' or 'parameters'"
        )


def check_single_process_devices(args: TrainingArguments) -> None:
    """DataParallel (several GPUs in one process) is not supported: launch one process per GPU."""
    if args.n_gpu > 1:
        raise ValueError(
            f"n_gpu={args.n_gpu}: several GPUs in one process (DataParallel) are not supported; "
            "use `accelerate launch` or `torchrun` with one process per GPU"
        )


def check_optimizer_params(optimizer: Any, model_param_ids: set[int]) -> None:
    """ValueError if the optimizer steps a trainable parameter that is not one of the model's.

    The DP step clips and noises the gradients of the model's trainable parameters only; any other
    parameter the optimizer holds (e.g. a temperature used by an overridden per-example loss) would
    be updated with its raw, unclipped and noise-free gradient. Matched by identity.
    """
    if optimizer is None:
        return
    for g, group in enumerate(optimizer.param_groups):
        for k, param in enumerate(group["params"]):
            if param.requires_grad and id(param) not in model_param_ids:
                raise ValueError(
                    f"optimizer param_groups[{g}]['params'][{k}] (shape {tuple(param.shape)}) is trainable "
                    "but is not one of the model's trainable parameters: the DP step clips and noises only "
                    "the model's gradients, so it would be updated without clipping or noise. Make it a "
                    "parameter of the model (in a layer ghost clipping supports), freeze it "
                    "(requires_grad=False) or leave it out of the optimizer"
                )
