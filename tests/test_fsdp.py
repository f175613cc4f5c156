"""FSDP2 (``fully_shard``) on two CPU processes (gloo): ghost clipping with book-keeping on a sharded
model gives the parameters a single unsharded process gets. Each rank clips its own share of the batch;
the full-size clipped sums are reduce-scattered to the parameter shards; the noise of a shard is the
slice of the noise the unsharded run draws from the same secret seed; AdamW steps on the shards.

bf16 (gloo all-gathers and reduce-scatters bf16 here): FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16)``
over float32 master weights, with float32 and with bf16 ``reduce_dtype``, and a model loaded in bf16. The
reference is the same sharded run on one process (world size 1: the same bf16 arithmetic, no split of
the batch over ranks), and the property the guarantee rests on is measured under FSDP itself: each
example's applied clipped gradient, summed over the ranks, stays within C.

This covers the engine (``GhostClipper`` + ``privatize_gradients_``) driven by hand; the trainer under
FSDP2 is tests/test_trainer_fsdp.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.multiprocessing as mp

from tests.launching import free_port
from tests.test_clipping_reference import lm_batch, tiny_gpt2

STEPS, SEED, SIGMA, CLIP, LR = 2, 424242, 0.7, 0.05, 1e-2
PRECISIONS = ("float32", "bf16", "bf16-reduce-bf16", "bf16-params")
"""float32; bf16 compute over float32 master weights, reduced in float32 or (accelerate's
``mixed_precision: bf16``) bf16; a model loaded in bf16 (no policy)."""


def train(model, share: slice, batch: int) -> None:
    """STEPS DP steps on ``share`` of a fixed batch: clip, noise (sum over ranks / B), AdamW."""
    from hush_hf.clipping import GhostClipper, example_cross_entropy
    from hush_hf.trainer.noise import privatize_gradients_

    kwargs, labels = lm_batch(causal=True, batch=batch)
    kwargs, labels = {k: v[share] for k, v in kwargs.items()}, labels[share]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR)
    with GhostClipper(model, CLIP) as clipper:
        for step in range(STEPS):
            half = labels.shape[0] // 2  # two micro-batches per rank (one or none with a share of 1)
            for part in (slice(0, half), slice(half, None)):
                if part.stop == 0:
                    continue
                logits = model(**{k: v[part] for k, v in kwargs.items()}).logits
                clipper.clipped_backward(example_cross_entropy(logits, labels[part], causal=True))
            privatize_gradients_(
                params, noise_multiplier=SIGMA, clip_norm=CLIP, expected_batch_size=batch, dp_seed=SEED,
                step=step,
            )  # fmt: skip
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def applied_norms(model, batch: int) -> list[float]:
    """||clipped gradient of example i alone, summed over ranks|| / C for every example: rank 0 clips it,
    the other ranks run it as a zero-weight filler (as the trainer does). The first call runs the
    self-check on every rank at once (it runs collectives)."""
    import torch.distributed as dist

    from hush_hf.clipping import GhostClipper, example_cross_entropy
    from hush_hf.clipping.clipped_sums import clipped_sums_for_noise, discard_

    kwargs, labels = lm_batch(causal=True, batch=batch)
    params = [p for p in model.parameters() if p.requires_grad]
    ratios = []
    with GhostClipper(model, CLIP) as clipper:
        for i in range(batch):
            one = {k: v[i : i + 1] for k, v in kwargs.items()}
            loss = example_cross_entropy(model(**one).logits, labels[i : i + 1], causal=True)
            if not clipper.verified:
                clipper.per_example_norms(loss)  # the self-check, on every rank, p.grad untouched
                loss = example_cross_entropy(model(**one).logits, labels[i : i + 1], causal=True)
            first = dist.get_rank() == 0
            norm = float(clipper.clipped_backward(loss if first else loss * 0.0)[0])
            assert norm > CLIP if first else norm == 0.0  # clipped on rank 0; 0 from the fillers
            # (the float32 sum beside a bf16 parameter, else p.grad: where the noise is added)
            square = sum(float(s.full_tensor().double().pow(2).sum()) for s in clipped_sums_for_noise(params))
            ratios.append(math.sqrt(square) / CLIP)
            discard_(params)
    return ratios


def sharded_refusal(family: str, layers: str) -> str:
    """The error a GhostClipper gets on a model whose layers FSDP2 shards, where a rule replays weights
    after the backward, when they are resharded (Mixtral's experts, DeBERTa's encoder for its table):
    refused at construction."""
    from torch.distributed.fsdp import fully_shard

    from hush_hf.clipping import GhostClipper, UnsupportedLayerError
    from tests.model_families import FAMILIES

    model = next(f for f in FAMILIES if f.name == family).build(False)
    for layer in model.get_submodule(layers):
        fully_shard(layer)
    fully_shard(model)
    try:
        GhostClipper(model, 1.0)
    except UnsupportedLayerError as error:
        return str(error)
    return "not refused"


def worker(rank: int, world: int, port: int, out: str, precision: str = "float32") -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = tiny_gpt2(seed=0)
        options = {}
        if precision == "bf16-params":
            model = model.to(torch.bfloat16)
        elif precision != "float32":
            reduce_dtype = torch.bfloat16 if precision == "bf16-reduce-bf16" else torch.float32
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
        for block in model.transformer.h:
            fully_shard(block, **options)
        fully_shard(model, **options)
        assert isinstance(model.transformer.h[0].attn.c_attn.weight, DTensor)
        ratios = applied_norms(model, batch=4) if precision != "float32" else []
        per_rank = 4 // world
        train(model, slice(per_rank * rank, per_rank * (rank + 1)), batch=4)
        named = model.named_parameters()
        full = {n: p.full_tensor() if isinstance(p, DTensor) else p.detach() for n, p in named}
        refusals = {}
        if precision == "float32":
            refusals["moe"] = sharded_refusal("Mixtral", "model.layers")
            refusals["deberta"] = sharded_refusal("DeBERTa-v3 (MLM), share_att_key", "deberta.encoder.layer")
        if rank == 0:
            torch.save({"params": full, "ratios": ratios, "refusals": refusals}, out)
    finally:
        dist.destroy_process_group()


def run(tmp_path, world: int, precision: str) -> dict:
    out = str(tmp_path / f"{precision}-{world}.pt")
    mp.spawn(worker, args=(world, free_port(), out, precision), nprocs=world, join=True)
    return torch.load(out)


@pytest.mark.slow  # two spawned processes importing transformers: ~50 CPU-seconds
@pytest.mark.filterwarnings("ignore")
def test_fsdp2_on_two_processes_trains_the_unsharded_model(tmp_path) -> None:
    result = run(tmp_path, 2, "float32")
    sharded = result["params"]
    refusals = result["refusals"]
    moe = "mlp.experts' (MixtralExperts) is not supported: expert weights sharded by FSDP2"
    assert moe in refusals["moe"]
    assert "'deberta.encoder' (DebertaV2Encoder) is not supported" in refusals["deberta"]
    assert "after the backward, when FSDP2 (fully_shard) has resharded its weights" in refusals["deberta"]
    model = tiny_gpt2(seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train(model, slice(0, 4), batch=4)  # one process, the same 2 + 2 micro-batches
    for name, p in model.named_parameters():
        assert (p.detach() - before[name]).abs().max() > 1e-4  # every parameter moved
        torch.testing.assert_close(sharded[name], p.detach(), rtol=1e-5, atol=1e-6)


def bf16_spacing(x: torch.Tensor) -> torch.Tensor:
    """The gap between x and the next bf16 number away from 0 (one unit in the last place)."""
    x = torch.as_tensor(x).float().abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(x)) - 7)


@pytest.mark.slow  # five spawned runs (2 + 1 processes per precision, reduce_dtype bf16 on 2): ~2 CPU-minutes
@pytest.mark.filterwarnings("ignore")
def test_fsdp2_in_bf16_on_two_processes_trains_the_one_process_model_each_example_within_c(tmp_path):
    """Two processes against one (the same sharded bf16 arithmetic): with float32 master weights the
    models agree to float32 summation order (measured: 4e-9), and FSDP's reduce_dtype does not enter the
    DP step at all (bf16 and float32 reduce_dtype: bit-identical models; the engine reduce-scatters the
    clipped sums itself, in float32). A model loaded in bf16 agrees to one bf16 rounding at each tensor's
    scale (measured: at most 2.4e-4, one unit in the last place of entries in [2^-5, 2^-4), against a mean
    movement of 1.4e-2; its gradient is rounded to bf16 after each micro-batch, and the runs split the
    batch into different micro-batches, so AdamW sees slightly different gradients). Under FSDP each
    example's applied clipped gradient, summed over both ranks, is within C: C (1 - 2^-6) with the bf16
    margin (measured: 0.98439 to 0.98453)."""
    initial = dict(tiny_gpt2(seed=0).named_parameters())
    results = {p: (run(tmp_path, 2, p), run(tmp_path, 1, p)) for p in ("bf16", "bf16-params")}
    reduced_bf16 = run(tmp_path, 2, "bf16-reduce-bf16")
    for precision, (two, one) in results.items():
        assert len(two["ratios"]) == 4 and all(1 - 2**-5 <= r <= 1.0 for r in two["ratios"] + one["ratios"])
        dtype = torch.bfloat16 if precision == "bf16-params" else torch.float32
        for name, value in one["params"].items():
            assert value.dtype == dtype
            assert (value.float() - initial[name].float()).abs().max() > 1e-3  # every parameter moved
            if precision == "bf16":
                torch.testing.assert_close(two["params"][name], value, rtol=0, atol=1e-6)
                assert torch.equal(reduced_bf16["params"][name], two["params"][name]), name
            else:
                gap = (two["params"][name].float() - value.float()).abs().max()
                assert gap <= bf16_spacing(value.abs().max()), name
