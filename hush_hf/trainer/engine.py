"""The DP step, top to bottom (Hush Alg. 2, lines 8-11): one optimizer step of a protection plan.

1. **draw** (:meth:`DPStep.data_loader`): the weighted Poisson sampler's logical batch, this rank's share,
   collated by the user's collator into one row per drawn example (:mod:`hush_hf.trainer.example_rows`;
   left padding moved right, :mod:`hush_hf.trainer.padding`).
2. **micro-batches** (:meth:`DPStep.run`): the share cut into ``per_device_train_batch_size`` rows
   (:mod:`hush_hf.trainer.micro_batches`); under FSDP2 every rank runs as many as the busiest one.
3. **per-example losses**: ``loss_i`` of each row (:mod:`hush_hf.trainer.losses`); the first step of a run
   checks that each depends on its example alone (:mod:`hush_hf.trainer.independence`), and every step that
   its forwards write no buffer (:mod:`hush_hf.trainer.buffer_writes`).
4. **clipped sums**: ``sum_i min(1, C/||g_i||) g_i`` by ghost clipping
   (:class:`hush_hf.clipping.GhostClipper`), accumulated beside each parameter (float32 for bf16/fp16,
   :mod:`hush_hf.clipping.clipped_sums`).
5. **noise** (:meth:`DPStep.privatize`): summed over ranks, ``N(0, sigma^2 C^2 I)`` added once from the
   secret seed, divided by the *expected* batch size B (:mod:`hush_hf.trainer.noise`). A check that failed
   on one rank is held to the first sum, which tells every rank, and every rank raises (:meth:`DPStep.hold`).
6. **record**: the drawn count of the step, for the logs (``dp_batch_size``).

CRT public steps (:mod:`hush_hf.trainer.crt`) take 2-3 with a plain backward and 5 without noise: a mean.
What the plan certifies (sigma, T, the seed, the schedule) is the callback's
(:class:`hush_hf.trainer.GhostClippingCallback`); this class only runs steps.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader
from transformers import Trainer
from transformers.trainer_utils import seed_worker

from hush_hf.clipping import GhostClipper, clipped_sums
from hush_hf.clipping.padding_readers import padded_batch_problem, padded_dataset_problem, padding_readers
from hush_hf.trainer import transformers_api
from hush_hf.trainer.buffer_writes import buffer_state, buffer_write_error, restore_buffers_, written_buffers
from hush_hf.trainer.distributed import (
    all_reduce_sum_,
    check_replicas_agree,
    is_distributed,
    rank_and_world_size,
    reduce_or_refuse,
    replicated,
)
from hush_hf.trainer.example_rows import ExampleRowsCollator, pad_token_id
from hush_hf.trainer.fsdp import filler_micro_batches, is_sharded
from hush_hf.trainer.gradient_writes import GradientStamps, optimizer_step_guard
from hush_hf.trainer.independence import (
    RTOL,
    alone,
    check_rows,
    coupled_rows,
    precision,
    same_batch,
    seed_random_states,
)
from hush_hf.trainer.losses import PerExampleLoss, model_inputs, unwrap_model
from hush_hf.trainer.micro_batches import batch_size, split_micro_batches
from hush_hf.trainer.noise import privatize_gradients_
from hush_hf.trainer.padding import right_align
from hush_hf.trainer.plan_setup import is_plan_column
from hush_hf.trainer.validation import check_model_not_compiled

logger = logging.getLogger(__name__)


class DPStep:
    """Runs DP steps on one model: ``data_loader`` once per run, ``begin`` when training starts, then per
    optimizer step ``run`` (every micro-batch of the share) and ``privatize`` (before the optimizer),
    ``end`` when training stops.

    ``clip_norm``: C. ``per_example_loss(model, inputs) -> Tensor[b]``. ``dropped_columns``: dataset
    columns that never reach the model beyond the plan's (the CRT public flag).
    """

    def __init__(
        self, clip_norm: float, per_example_loss: PerExampleLoss, dropped_columns: tuple[str, ...]
    ) -> None:
        self.clip_norm = clip_norm
        self.per_example_loss = per_example_loss
        self.dropped_columns = dropped_columns
        self.clipper: GhostClipper | None = None
        self.model: nn.Module | None = None
        self.params: list[nn.Parameter] = []
        self.param_ids: set[int] = set()
        self.sharded = False  # FSDP2: the model's parameters are shards
        self.pending: tuple[int, int, bool] | None = None  # (step, examples on this rank, public)
        self.clipped: GradientStamps | None = None  # the gradients as the clipped backward left them
        self.noised: GradientStamps | None = None  # the gradients as the noise left them
        self._optimizer_guard: Any = None
        self.failure: Exception | None = None  # this rank's error, raised where the ranks next meet (hold)
        self._source: tuple[Any, Any] | None = None  # (dataset, collator): check rows and fillers
        self._independence_checked = False
        self._told_left_padding = False
        self._padding_readers: list[tuple[str, str, str]] = []

    # ------------------------------------------------------------------------- 1. draw
    def data_loader(self, trainer: Trainer, batch_sampler: Any) -> DataLoader:
        """This rank's batches of ``batch_sampler``, one row per drawn example; ``len`` = its steps.

        Not passed through ``accelerator.prepare``: its ``BatchSamplerShard`` would split and pad the
        batches. Trainer's resume skips the first k batches with accelerate's ``SkipBatchSampler``,
        which draws and discards them, so batch t still meets step t.
        """
        import datasets

        args, dataset, collate_fn = trainer.args, trainer.train_dataset, trainer.data_collator
        if isinstance(dataset, datasets.Dataset):
            dataset = transformers_api.remove_unused_columns(trainer, dataset)
            dropped = [c for c in dataset.column_names if is_plan_column(c) or c in self.dropped_columns]
            dataset = dataset.remove_columns(dropped)
        else:
            collate_fn = transformers_api.collator_with_removed_columns(trainer, collate_fn)
        # One row per drawn example whatever the collator's layout (padding-free included): example_rows.py
        collate_fn = ExampleRowsCollator(collate_fn, pad_token_id(trainer))
        self._source = (dataset, collate_fn)
        workers = args.dataloader_num_workers
        rank = rank_and_world_size()[0]
        return DataLoader(
            dataset,
            batch_sampler=batch_sampler,
            collate_fn=collate_fn,
            num_workers=workers,
            pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers and workers > 0,
            prefetch_factor=args.dataloader_prefetch_factor if workers > 0 else None,
            worker_init_fn=functools.partial(seed_worker, num_workers=workers, rank=rank),
        )

    def begin(self, model: nn.Module, params: list[nn.Parameter], optimizer: Any = None) -> None:
        """Hook the model: the clipping engine records every layer call of the steps to come; and
        ``optimizer``: each of its steps must apply the gradients the noise left
        (:mod:`hush_hf.trainer.gradient_writes`)."""
        check_model_not_compiled(model)  # e.g. made by model_init, after the trainer was built
        self.end()
        self.sharded = is_sharded(model)
        self.clipper = GhostClipper(model, self.clip_norm)
        self._padding_readers = padding_readers(model)  # layers a padded row is refused for
        self._independence_checked = False
        self.model, self.params, self.param_ids = model, params, {id(p) for p in params}
        self.clipped = self.noised = self.failure = None
        self._optimizer_guard = optimizer_step_guard(optimizer, self._before_optimizer_step)

    def end(self) -> None:
        """Take the hooks off the model (also after an error)."""
        if self.clipper is not None:
            self.clipper.remove()
        if self._optimizer_guard is not None:
            self._optimizer_guard.remove()
        self.clipper, self.pending, self._optimizer_guard = None, None, None

    def hold(self, error: Exception) -> None:
        """This rank's ``error``, raised where the ranks next synchronise (the first step's checks, the FSDP
        micro-batch count, the drawn count in :meth:`privatize`), where every rank raises with it
        (:func:`~hush_hf.trainer.distributed.reduce_or_refuse`): raised here, another rank would wait in
        that collective until the process group's timeout. Raised at once in a single process; the first
        error of a step is the one kept."""
        if not is_distributed():
            raise error
        self.failure = self.failure or error

    def _hold_unless_sharded(self, error: Exception) -> None:
        """:meth:`hold` ``error``; under FSDP raise it at once: it interrupted a forward or backward whose
        collectives the other ranks run in full, which this rank cannot match from here."""
        if self.sharded:
            raise error
        self.hold(error)

    def _reduce_or_refuse(self, values: list[float], op: Any, device: torch.device) -> list[float]:
        """``values`` reduced over ranks, every rank raising if a rank holds an error (then cleared)."""
        failure, self.failure = self.failure, None
        return reduce_or_refuse(values, failure, op=op, device=device)

    # ------------------------------------------------------------------------- 2-4. one share, clipped
    def run(self, trainer: Trainer, model: nn.Module, inputs: dict[str, Any], *, public: bool) -> Tensor:
        """Accumulate this rank's ``sum_i clip(g_i, C)`` beside each parameter; return its mean loss (NaN
        for an empty share, which Trainer's ``logging_nan_inf_filter`` skips). ``public``: a CRT public
        step (plain backward, no clipping). The forward runs on the unwrapped model under DDP's
        ``no_sync``: DDP's averaging hook must not touch the clipped sums.

        Several processes: a check failing here on one rank (a padded row, the loss's shape, a buffer
        written, any error of a micro-batch) is held (:meth:`hold`); the rank stops its micro-batches and
        returns NaN, and every rank raises at :meth:`privatize`'s first collective, before any optimizer
        step. Under FSDP the micro-batches' forwards and backwards are collectives: a row refused before
        its forward turns this rank's remaining micro-batches into zero-weight fillers; an error once a
        forward started is raised at once (its collectives cannot be matched from there)."""
        if self.clipper is None or self.model is None:
            raise RuntimeError("the DP step is not set up: train through trainer.train()")
        module = self.model
        if trainer.accelerator.unwrap_model(model) is not module:
            raise RuntimeError("training_step got a different model than the one the clipping hooks are on")
        module.train()
        if callable(getattr(trainer.optimizer, "train", None)):
            trainer.optimizer.train()
        clipped_sums.discard_(self.params)  # only this step's clipped sum may reach the optimizer
        self.clipped = self.noised = None
        self.clipper.reset()
        if not self._independence_checked:
            self._check_padding_readers(trainer)
            self._check_buffers_unwritten(trainer)
            self._check_independence(trainer)
            self._independence_checked = True
        buffers = buffer_state(module, values=False)  # no layer may write one in the forwards below
        inputs = self._right_aligned({k: v for k, v in inputs.items() if not is_plan_column(k)})
        for name in self.dropped_columns:
            inputs.pop(name, None)
        micros = split_micro_batches(inputs, trainer.args.per_device_train_batch_size)
        real = len(micros)
        sharded = self.sharded and not public
        if sharded:
            # FSDP's all-gathers and the engine's reduce-scatters are collectives: every rank runs as many
            # micro-batches as the busiest one, padding with zero-weight fillers (exactly 0, see fsdp.py).
            # The count's reduction also raises, on every rank, an error held before (callback.py's).
            busiest = int(self._reduce_or_refuse([real], dist.ReduceOp.MAX, trainer.args.device)[0])
            if busiest and not self.clipper.verified:
                self._self_check_on_filler(trainer)
            micros += [self._filler_batch()] * filler_micro_batches(real, busiest)
        loss_sum = torch.zeros((), dtype=torch.float64, device=trainer.args.device)
        count = 0
        with trainer.accelerator.no_sync(model):
            for k, micro in enumerate(micros):
                filler = k >= real  # its examples weigh 0
                if sharded:  # checked before the forward, where a refusal still lets the collectives match
                    try:
                        if self.failure is None:
                            self._check_padded_rows(trainer, micro)
                    except ValueError as error:
                        self.hold(error)
                    if self.failure is not None:  # the other ranks' forwards all-gather: keep up, weight 0
                        micro, filler = self._filler_batch(), True
                elif self.failure is not None:
                    break  # no collective in a DDP micro-batch: the ranks meet again in privatize
                try:
                    losses = self.losses(trainer, micro)
                    if public:
                        self.clipper.reset()  # the hooks recorded this forward; a public step does not clip
                        losses.sum().backward()
                    elif filler:
                        self.clipper.clipped_backward(losses * 0.0)
                        continue
                    else:
                        self.clipper.clipped_backward(losses)
                except Exception as error:
                    self._hold_unless_sharded(error)
                    break
                loss_sum += losses.detach().sum().to(torch.float64)
                count += losses.shape[0]
        written = written_buffers(module, buffers)
        if written:  # before the optimizer step: the step's gradients are discarded with the run
            self.hold(ValueError(buffer_write_error(module, written)))
        self.pending = (trainer.state.global_step, count, public)
        self.clipped = GradientStamps(self.params, "after the DP step's backward passes")
        nan = torch.tensor(math.nan, dtype=torch.float64, device=trainer.args.device)
        return (loss_sum / count if count and self.failure is None else nan).to(torch.float32)

    def losses(self, trainer: Trainer, micro: dict[str, Any]) -> Tensor:
        """``per_example_loss`` of one micro-batch, as the DP step computes it (shape checked: (rows,))."""
        rows = batch_size(micro)
        self._check_padded_rows(trainer, micro)
        batch = model_inputs(self.model, micro, trainer.args.device)
        with trainer.compute_loss_context_manager():
            losses = self.per_example_loss(self.model, batch)
        if not isinstance(losses, Tensor) or tuple(losses.shape) != (rows,):
            shape = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
            raise ValueError(f"per_example_loss must return a tensor of shape ({rows},), got {shape}")
        return losses

    def _check_padded_rows(self, trainer: Trainer, micro: dict[str, Any]) -> None:
        """ValueError if ``micro`` pads a row for a layer that reads padded positions
        (:mod:`hush_hf.clipping.padding_readers`)."""
        if self._padding_readers:
            problem = padded_batch_problem(self._padding_readers, micro, pad_token_id(trainer))
            if problem is not None:
                raise ValueError(problem)

    # ------------------------------------------------------------------------- 5-6. noise, record
    def privatize(
        self, step: int, *, noise_multiplier: float, expected_batch_size: float, dp_seed: int, noise_step: int
    ) -> tuple[int, bool]:
        """Before optimizer step ``step``: the clipped sums of all ranks, plus N(0, sigma^2 C^2 I) drawn
        from ``dp_seed`` at ``noise_step``, divided by B; a CRT public step's sum divided by its rows (a
        mean, no noise). Returns (rows drawn over all ranks, whether the step was public).

        Several processes: the first collective (the drawn count's sum) also carries whether this rank
        holds an error (its own step's, or one of the checks here); if any rank does, every rank raises
        there, before any gradient is summed, noised or applied."""
        if self.pending is None or self.pending[0] != step:
            self.hold(RuntimeError(
                f"optimizer step {step} was not preceded by a DP training step; refusing to apply gradients "
                "that were not clipped and noised"
            ))
        _, count, public = self.pending or (step, 0, False)
        self.pending = None
        if self.clipped is not None and self.failure is None:
            try:
                self.clipped.check(self.model, "the noise was added")
            except RuntimeError as error:
                self.hold(error)
        count = self._reduce_across_ranks(count)  # every rank raises here if one holds an error
        sums = clipped_sums.clipped_sums_for_noise(self.params)  # float32 for bf16/fp16 parameters
        all_reduce_sum_(replicated(sums))  # FSDP2 shards already hold the sum over ranks (fsdp.py)
        if public:
            with torch.no_grad():
                for grad in sums:
                    grad.div_(max(count, 1))
            clipped_sums.round_into_grads_(self.params)
            self.noised = GradientStamps(self.params, "after the public step's mean")
            return count, True
        privatize_gradients_(
            self.params,
            noise_multiplier=noise_multiplier,
            clip_norm=self.clip_norm,
            expected_batch_size=expected_batch_size,
            dp_seed=dp_seed,
            step=noise_step,
        )
        check_replicas_agree(replicated([p.grad for p in self.params]))  # FSDP2 shards differ by design
        self.noised = GradientStamps(self.params, "after the noise was added")
        return count, False

    def _before_optimizer_step(self) -> None:
        """The optimizer step pre-hook: it applies the gradients ``privatize`` left. Not consumed: torch
        runs the hook again for an optimizer subclass whose ``step`` calls ``super().step``, and applying
        the noised gradient twice is post-processing.

        Several processes: the ranks already met in :meth:`privatize` and the next collective is the next
        step's (or the run's end, :meth:`settle`); so a refusal here is held to that point, and this rank's
        optimizer step finds no gradient to apply (torch optimizers skip a parameter whose ``grad`` is None;
        whatever another does, it cannot apply the written gradient). No collective is added per step.
        """
        try:
            if self.noised is None:
                raise RuntimeError(
                    "the optimizer stepped before this step's noise was added (optimizer.step() called "
                    "outside Trainer's optimizer step); refusing to apply gradients that were not clipped "
                    "and noised"
                )
            self.noised.check(self.model, "the optimizer step")
        except RuntimeError as refusal:
            self.hold(refusal)  # raised here in a single process
            clipped_sums.discard_(self.params)

    def settle(self, device: torch.device) -> None:
        """At the end of a run (one collective): every rank raises if a rank still holds an error (a
        refusal in the last step's optimizer pre-hook)."""
        if rank_and_world_size()[1] > 1:
            self._reduce_or_refuse([], dist.ReduceOp.MAX, device)

    def _reduce_across_ranks(self, count: int) -> int:
        """The drawn-row count summed over ranks; raises on every rank if a rank holds an error (:meth:`hold`,
        the flag rides on this sum: no collective of its own)."""
        if rank_and_world_size()[1] == 1:
            return count
        return int(self._reduce_or_refuse([count], dist.ReduceOp.SUM, self.params[0].device)[0])

    # ------------------------------------------------------------------------- every example alone
    @property
    def _encoder_decoder(self) -> bool:
        return bool(getattr(getattr(unwrap_model(self.model), "config", None), "is_encoder_decoder", False))

    def _right_aligned(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch with left padding moved to the right (exact; refused where it cannot be, see
        :mod:`hush_hf.trainer.padding`); said once per run."""
        aligned = right_align(batch, encoder_decoder=self._encoder_decoder)
        if aligned is not batch and not self._told_left_padding:
            logger.info(
                "left-padded batches are re-padded to the right before the DP step (a left-padded row's "
                "loss depends on the other rows' lengths); set tokenizer.padding_side = 'right' to skip this"
            )
            self._told_left_padding = True
        return aligned

    def _collated(self, rows: list[Any]) -> dict[str, Any]:
        """Training rows collated like every batch (one row per example, see example_rows.py), plan
        columns dropped, right-aligned."""
        if self._source is None:
            raise RuntimeError("the DP data loader is built inside train(); call trainer.train()")
        _, collate_fn = self._source
        batch = collate_fn(rows).items()
        return self._right_aligned(
            {k: v for k, v in batch if not is_plan_column(k) and k not in self.dropped_columns}
        )

    def _filler_batch(self) -> dict[str, Any]:
        """Row 0 of the training set, collated like every batch: the input of a filler micro-batch."""
        if self._source is None:
            raise RuntimeError("the DP data loader is built inside train(); call trainer.train()")
        return split_micro_batches(self._collated([self._source[0][0]]), 1)[0]

    def _check_padding_readers(self, trainer: Trainer) -> None:
        """ValueError before any forward when the dataset's rows will be padded in training and the model
        has a layer that reads padded positions (clipping.padding_readers); every rank reads the same
        dataset, so every rank raises alike. Each micro-batch is checked again before its forward."""
        if self._padding_readers and self._source is not None:
            size = trainer.args.per_device_train_batch_size
            problem = padded_dataset_problem(self._padding_readers, self._source[0], size)
            if problem is not None:
                raise ValueError(problem)

    def _check_buffers_unwritten(self, trainer: Trainer) -> None:
        """ValueError before any gradient if a training-mode forward writes a buffer of the model.

        See :mod:`hush_hf.trainer.buffer_writes`: one forward in train mode (no gradient, dropout's draws
        undone) of the first micro-batch of the independence check's rows, the same on every rank, and
        every rank raises if any rank found a buffer written; the buffers are restored either way.
        """
        if self._source is None:
            raise RuntimeError("the DP data loader is built inside train(); call trainer.train()")
        dataset, _ = self._source
        rows = [dataset[i] for i in check_rows(dataset)]
        module = self.model
        before = buffer_state(module, values=True)
        written: list[str] = []
        try:
            with preserved_random_state(trainer.args.device):
                seed_random_states(0)
                micro = split_micro_batches(self._collated(rows), trainer.args.per_device_train_batch_size)[0]
                module.train()
                with torch.no_grad():
                    self.losses(trainer, micro)
            written = written_buffers(module, before)
        except Exception as error:
            self._hold_unless_sharded(error)
        finally:
            restore_buffers_(module, before)
        if self._reduce_or_refuse([bool(written)], dist.ReduceOp.MAX, trainer.args.device)[0]:
            raise ValueError(buffer_write_error(module, written))

    def _check_independence(self, trainer: Trainer) -> None:
        """ValueError unless each check row's per-example loss is the same inside a batch and alone.

        See :mod:`hush_hf.trainer.independence`. Runs at the first step of a run, before any gradient,
        on every rank at once (the rows do not depend on the draw; under FSDP the forwards are
        collectives) and every rank raises if any rank found a difference.
        """
        if self._source is None:
            raise RuntimeError("the DP data loader is built inside train(); call trainer.train()")
        indices = check_rows(self._source[0])
        module, args = self.model, trainer.args
        tf32 = args.device.type == "cuda" and torch.get_float32_matmul_precision() != "highest"
        mixed = trainer.accelerator.mixed_precision not in (None, "no") or args.bf16 or args.fp16
        kind = precision([p.dtype for p in module.parameters()], mixed_precision=bool(mixed), tf32=tf32)
        coupled: list[int] = []
        try:
            coupled = self._coupled_check_rows(trainer, indices, RTOL[kind])
        except Exception as error:
            self._hold_unless_sharded(error)
        if self._reduce_or_refuse([bool(coupled)], dist.ReduceOp.MAX, args.device)[0]:
            rows_named = sorted(indices[i] for i in coupled)
            where = f"training rows {rows_named}" if coupled else "another rank's rows"
            raise ValueError(
                f"example independence check failed: {where} get a different per_example_loss inside a batch "
                f"of {len(indices)} than alone (beyond {RTOL[kind]:g} relative, {kind} precision), so one "
                "example's clipped gradient depends on the others and C no longer bounds its influence; look "
                "for a per_example_loss normalised over the batch, labels on padding positions (make them "
                "-100), packed rows without a per-row attention mask, or a model whose forward mixes rows"
            )

    def _coupled_check_rows(self, trainer: Trainer, indices: list[int], rtol: float) -> list[int]:
        """Positions in ``indices`` whose loss inside their batch differs from alone beyond ``rtol``."""
        rows = [self._source[0][i] for i in indices]
        with preserved_random_state(trainer.args.device):  # a masking collator draws from the global RNGs
            seed_random_states(0)
            batch = self._collated(rows)
            # A deterministic collator collates each row alone too (whatever its layout: padded either
            # side, with or without a mask, flattened); a random one (MLM masking) would draw other
            # masks alone, so its rows are cut from the batch instead (independence.alone).
            seed_random_states(1)
            deterministic = same_batch(batch, self._collated(rows))
            singles = [self._collated([row]) for row in rows] if deterministic else None
        module, args = self.model, trainer.args
        in_batch: list[float] = []
        by_itself: list[float] = []
        module.eval()  # dropout would make the two forwards differ
        try:
            with torch.no_grad():
                for micro in split_micro_batches(batch, args.per_device_train_batch_size):
                    in_batch += self.losses(trainer, micro).double().tolist()
                    if singles is not None:
                        continue
                    for row in range(batch_size(micro)):
                        single = alone(micro, row, encoder_decoder=self._encoder_decoder)
                        by_itself += self.losses(trainer, single).double().tolist()
                for single in singles or ():
                    by_itself += self.losses(trainer, single).double().tolist()
        finally:
            module.train()
        return coupled_rows(in_batch, by_itself, rtol)

    def _self_check_on_filler(self, trainer: Trainer) -> None:
        """FSDP: run the clipper's first-call self-check on every rank at once, on the same row.

        The self-check runs one extra backward (FSDP all-gathers in it) on the first call whose gradient
        is nonzero; a rank whose first micro-batch is a filler (gradient 0) would run it later than the
        others and the collectives would no longer match. Checked here on the filler row with weight 1,
        identically on every rank; ``p.grad`` is not touched (``per_example_norms``).
        """
        losses = self.losses(trainer, self._filler_batch())
        self.clipper.per_example_norms(losses)
        del losses
        if not self.clipper.verified:
            raise RuntimeError(
                "FSDP: the clipping self-check could not run on row 0 of the training set (its loss has a "
                "zero gradient); every rank must run it at the same step: put a row with a nonzero loss first"
            )


@contextlib.contextmanager
def preserved_random_state(device: torch.device) -> Iterator[None]:
    """Python's, NumPy's and torch's global random states (CPU and ``device``) are restored on exit: a
    check that calls the collator once more leaves the training batches (e.g. MLM masks) as they were."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = []
    if device.type == "cuda":
        devices = [torch.cuda.current_device() if device.index is None else device.index]
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
