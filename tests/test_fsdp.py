"""FSDP2 (``fully_shard``) on two CPU processes (gloo): ghost clipping with book-keeping on a sharded
model gives the parameters a single unsharded process gets. Each rank clips its own share of the batch;
the full-size clipped sums are reduce-scattered to the parameter shards; the noise of a shard is the
slice of the noise the unsharded run draws from the same secret seed; AdamW steps on the shards.

This covers the engine (``GhostClipper`` + ``privatize_gradients_``) driven by hand; the trainer under
FSDP2 is tests/test_trainer_fsdp.py."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from tests.launching import free_port
from tests.test_clipping_reference import lm_batch, tiny_gpt2

STEPS, SEED, SIGMA, CLIP, LR = 2, 424242, 0.7, 0.05, 1e-2


def train(model, share: slice, batch: int) -> None:
    """STEPS DP steps on ``share`` of a fixed batch: clip, noise (sum over ranks / B), AdamW."""
    from hush_hf.clipping import GhostClipper, per_example_lm_loss
    from hush_hf.trainer.noise import privatize_gradients_

    kwargs, labels = lm_batch(causal=True, batch=batch)
    kwargs, labels = {k: v[share] for k, v in kwargs.items()}, labels[share]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR)
    with GhostClipper(model, CLIP) as clipper:
        for step in range(STEPS):
            half = labels.shape[0] // 2  # two micro-batches per rank
            for part in (slice(0, half), slice(half, None)):
                logits = model(**{k: v[part] for k, v in kwargs.items()}).logits
                clipper.clipped_backward(per_example_lm_loss(logits, labels[part], causal=True))
            privatize_gradients_(
                params, noise_multiplier=SIGMA, clip_norm=CLIP, expected_batch_size=batch, dp_seed=SEED,
                step=step,
            )  # fmt: skip
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = tiny_gpt2(seed=0)
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
        assert isinstance(model.transformer.h[0].attn.c_attn.weight, DTensor)
        train(model, slice(2 * rank, 2 * rank + 2), batch=2 * world)
        named = model.named_parameters()
        full = {n: p.full_tensor() if isinstance(p, DTensor) else p.detach() for n, p in named}
        if rank == 0:
            torch.save(full, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes importing transformers: ~50 CPU-seconds
@pytest.mark.filterwarnings("ignore")
def test_fsdp2_on_two_processes_trains_the_unsharded_model(tmp_path) -> None:
    out = str(tmp_path / "params.pt")
    mp.spawn(worker, args=(2, free_port(), out), nprocs=2, join=True)
    sharded = torch.load(out)
    model = tiny_gpt2(seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train(model, slice(0, 4), batch=4)  # one process, the same 2 + 2 micro-batches
    for name, p in model.named_parameters():
        assert (p.detach() - before[name]).abs().max() > 1e-4  # every parameter moved
        torch.testing.assert_close(sharded[name], p.detach(), rtol=1e-5, atol=1e-6)
