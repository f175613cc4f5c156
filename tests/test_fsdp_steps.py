"""The pure logic of DP steps under FSDP2 (fast; the 2-process runs are in test_fsdp.py and
test_trainer_fsdp.py): aligned micro-batch counts, fillers that add exactly zero, refused settings."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hush_hf.clipping import GhostClipper, example_cross_entropy
from hush_hf.sampling import WeightedPoissonSampler
from hush_hf.trainer.fsdp import (
    check_fsdp_plugin,
    filler_micro_batches,
    max_across_ranks,
    micro_batch_count,
)
from hush_hf.trainer.micro_batches import split_micro_batches
from tests.test_clipping_reference import lm_batch, tiny_bert, tiny_gpt2


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("micro", [1, 2, 3])
def test_fillers_give_every_rank_the_busiest_ranks_micro_batch_count(world, micro):
    probs = np.linspace(0.005, 0.3, 20)  # B ~ 3: empty, small and uneven batches all occur
    samplers = [
        WeightedPoissonSampler(probs, num_steps=60, seed=77, num_replicas=world, rank=r) for r in range(world)
    ]
    seen_fillers = seen_empty_rank = seen_empty_batch = False
    for step in range(60):
        batch = samplers[0].batch(step)
        shares = [s.share(batch) for s in samplers]
        assert sorted(np.concatenate(shares).tolist()) == batch.tolist()  # disjoint, cover the batch
        counts = [micro_batch_count(len(share), micro) for share in shares]
        for share, count in zip(shares, counts, strict=True):  # what training_step splits
            rows = {"input_ids": torch.zeros(len(share), 3, dtype=torch.long)}
            assert len(split_micro_batches(rows, micro)) == count
        busiest = max(counts)
        fillers = [filler_micro_batches(c, busiest) for c in counts]
        assert [c + f for c, f in zip(counts, fillers, strict=True)] == [busiest] * world
        assert max(fillers) <= 1  # shares differ by at most one row
        seen_fillers |= any(fillers)
        seen_empty_rank |= 0 < len(batch) < world
        seen_empty_batch |= len(batch) == 0 and busiest == 0
    assert seen_fillers and seen_empty_rank and seen_empty_batch


def test_filler_and_count_arguments_are_checked():
    assert micro_batch_count(0, 4) == 0 and micro_batch_count(5, 2) == 3
    assert max_across_ranks(3, torch.device("cpu")) == 3  # one process: the value itself
    with pytest.raises(ValueError, match="max_size=0"):
        micro_batch_count(3, 0)
    with pytest.raises(ValueError, match="local=3, busiest=2"):
        filler_micro_batches(3, 2)


@pytest.mark.parametrize("causal", [True, False])
def test_a_filler_micro_batch_adds_exactly_zero(causal):
    """The gradient of 0 * loss_i is exactly 0 at every layer output, so the norm is 0, the clip factor 1
    and every clipped sum exactly 0: the accumulated gradient is unchanged bit for bit."""
    model = tiny_gpt2() if causal else tiny_bert()
    kwargs, labels = lm_batch(causal=causal)
    with GhostClipper(model, 0.05) as clipper:
        logits = model(**{k: v[:3] for k, v in kwargs.items()}).logits
        clipper.clipped_backward(example_cross_entropy(logits, labels[:3], causal=causal))
        assert clipper.verified  # a real micro-batch ran the self-check
        before = {n: p.grad.clone() for n, p in model.named_parameters()}
        assert all(g.abs().sum() > 0 for g in before.values())
        for filler in (slice(3, 4), slice(0, 2)):  # one row, and rows another micro-batch already had
            logits = model(**{k: v[filler] for k, v in kwargs.items()}).logits
            losses = example_cross_entropy(logits, labels[filler], causal=causal)
            norms = clipper.clipped_backward(losses * 0.0)
            assert torch.equal(norms, torch.zeros_like(norms))
        for name, p in model.named_parameters():
            assert torch.equal(p.grad, before[name]), name


def test_the_self_check_does_not_pass_on_a_filler():
    """Why the trainer runs the self-check on every rank at once: a zero-weight call verifies nothing."""
    model = tiny_gpt2()
    kwargs, labels = lm_batch(causal=True)
    with GhostClipper(model, 0.05) as clipper:
        logits = model(**kwargs).logits
        clipper.clipped_backward(example_cross_entropy(logits, labels, causal=True) * 0.0)
        assert not clipper.verified


def accepted_plugin(**overrides):
    from torch.distributed.fsdp import OffloadPolicy

    values = dict(
        fsdp_version=2,
        cpu_offload=OffloadPolicy(),
        mixed_precision_policy=None,
        activation_checkpointing=False,
        ignored_modules=None,
    )
    return SimpleNamespace(**{**values, **overrides})


def test_fsdp_plugins_that_cannot_run_exactly_are_refused_naming_the_option():
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    check_fsdp_plugin(FullyShardedDataParallelPlugin(fsdp_version=2))  # accelerate's defaults pass
    check_fsdp_plugin(accepted_plugin())
    check_fsdp_plugin(accepted_plugin(mixed_precision_policy=MixedPrecisionPolicy(param_dtype=torch.float32)))
    bf16 = FullyShardedDataParallelPlugin(fsdp_version=2)
    bf16.set_mixed_precision("bf16")  # what accelerate's mixed_precision: bf16 sets: bf16 compute and reduce
    assert (bf16.mixed_precision_policy.param_dtype, bf16.mixed_precision_policy.reduce_dtype) == (
        torch.bfloat16,
        torch.bfloat16,
    )
    check_fsdp_plugin(bf16)
    for reduce_dtype in (torch.float32, None):
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
        check_fsdp_plugin(accepted_plugin(mixed_precision_policy=policy))
    fp16 = FullyShardedDataParallelPlugin(fsdp_version=2)
    fp16.set_mixed_precision("fp16")
    refused = [
        (dict(fsdp_version=1), "fsdp_version=1 is not supported"),
        (dict(cpu_offload=CPUOffloadPolicy()), "fsdp_offload_params=True"),
        (
            dict(mixed_precision_policy=MixedPrecisionPolicy(param_dtype=torch.float16)),
            "param_dtype=torch.float16 is not supported",
        ),
        (
            dict(mixed_precision_policy=MixedPrecisionPolicy(reduce_dtype=torch.float16)),
            "reduce_dtype=torch.float16 is not supported",
        ),
        (
            dict(mixed_precision_policy=fp16.mixed_precision_policy),
            "param_dtype=torch.float16 is not supported",
        ),
        (dict(activation_checkpointing=True), "fsdp_activation_checkpointing=True"),
        (dict(ignored_modules=[torch.nn.Linear(2, 2)]), "ignored_modules is not supported"),
    ]
    for overrides, match in refused:
        with pytest.raises(ValueError, match=match):
            check_fsdp_plugin(accepted_plugin(**overrides))


def test_token_counts_are_never_gathered_across_ranks():
    """Trainer gathers the batch's token count across ranks only on ranks whose batch has labels: a rank
    with an empty Poisson share skipped the collective and the others waited forever (found under FSDP,
    step 0 of tests/test_trainer_fsdp.py; DDP has the same path). The DP step does not use the count."""
    from hush_hf.trainer.routing import ROUTES
    from hush_hf.trainer.transformers_api import NUM_ITEMS

    batches = [{"labels": torch.ones(2, 3, dtype=torch.long)}]
    never = {NUM_ITEMS: lambda *a, **k: pytest.fail("Trainer's token count was called")}
    # the route both SecretProtectionTrainer and GhostClippingCallback.attach use (routing.py's table)
    assert ROUTES[NUM_ITEMS](None, None, never, batches, torch.device("cpu")) is None
