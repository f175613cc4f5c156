"""Device-to-host reads in the DP step: none to drop the zero steps of uses that are materialised anyway.

On a GPU a read of a device value (``.item()``, ``int(t)``) waits for the whole queue, and the host then
issues the next kernels to an idle device. Under gradient checkpointing each layer call's gradient
arrives on its own, and deciding whether to drop its zero steps took one read per use: hundreds a
step on Llama-1B with LoRA, which an H200 ran at 3.6x the plain step (device time 1.75x). A use whose
per-example gradient is materialised (``norm_strategy``: a LoRA adapter's) costs about the same
either way, so it is no longer checked; a large (ghost) use still is, exactly as before. Without
checkpointing the whole step's check was one read, now none when every use is materialised; the
compacted widths of many uses are read together. And the norms' finiteness check, a read between the
backward pass (or the norm pass) and the clipped sums, comes once the sums are queued, still before
anything reaches a gradient.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hush_hf.clipping import GhostClipper, example_cross_entropy
from tests.model_families import VOCAB, family_named

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import op_census  # noqa: E402


def host_reads():
    """Counts the reads of a device value back on the host (``.item()``, ``int(t)``, ``nonzero``,
    ``.tolist()``; on a GPU each one waits for the queue): ``bench/op_census.py``'s census, its ``syncs``."""
    return op_census.counted()


def reads_of_one_step(name: str, seq: int, checkpointing: bool = True) -> tuple[int, torch.Tensor]:
    torch.manual_seed(0)
    model = family_named(name).build(False).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(3, VOCAB, (2, seq), generator=torch.Generator().manual_seed(1))
    position_ids = torch.arange(seq).expand(2, seq).contiguous()
    with GhostClipper(model, 1.0) as clipper:
        for _ in range(2):  # the first call runs the self-check
            loss = example_cross_entropy(
                model(input_ids=ids, position_ids=position_ids).logits, ids, causal=True
            )
            with host_reads() as reads:
                norms = clipper.clipped_backward(loss)
    return reads.syncs, norms


FINITE_CHECKS = 2  # the per-example losses' and the norms' (``GhostClipper``): refused loudly when not finite


def test_a_checkpointed_lora_step_reads_back_only_its_finiteness_checks() -> None:
    reads, norms = reads_of_one_step("Llama + LoRA (peft)", seq=128)
    assert reads == FINITE_CHECKS  # was 14: one zero-step check per use
    _, reference = reads_of_one_step("Llama + LoRA (peft)", seq=128, checkpointing=False)
    torch.testing.assert_close(norms, reference)  # the same norms as the one-pass step


def test_a_lora_step_reads_back_only_its_finiteness_checks() -> None:
    """Without checkpointing too: the one read of the whole step's zero-step bounds is skipped when
    every use is materialised anyway; on a GPU it held the host until the backward pass had run."""
    reads, _ = reads_of_one_step("Llama + LoRA (peft)", seq=128, checkpointing=False)
    assert reads == FINITE_CHECKS  # was 3


def test_a_checkpointed_full_fine_tune_still_drops_zero_steps_of_its_large_uses() -> None:
    """Llama at seq 4 (tiny widths): its weights take the ghost route, and their uses are still checked
    for zero steps (and compacted: the last position has no target), with or without checkpointing."""
    for checkpointing in (True, False):
        reads, _ = reads_of_one_step("Llama", seq=4, checkpointing=checkpointing)
        assert reads > FINITE_CHECKS


class _Sequence(TorchDispatchMode):
    """The aten operations dispatched, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("checkpointing", [False, True], ids=["one-pass", "checkpointed"])
def test_a_first_micro_batch_reads_its_norms_back_after_queueing_its_sums(checkpointing: bool) -> None:
    """The norms' finiteness check reads them back; a first micro-batch does that once every clipped sum
    is queued (no matrix product after it), not between the backward pass and the sums (under
    checkpointing: between the norm pass and the sum pass)."""
    torch.manual_seed(0)
    model = family_named("Llama").build(False).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(3, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    position_ids = torch.arange(16).expand(2, 16).contiguous()
    with GhostClipper(model, 1.0) as clipper:
        for _ in range(2):  # the first call runs the self-check
            model.zero_grad(set_to_none=True)
            loss = example_cross_entropy(
                model(input_ids=ids, position_ids=position_ids).logits, ids, causal=True
            )
            with _Sequence() as seen:
                clipper.clipped_backward(loss)
    products = [k for k, op in enumerate(seen.ops) if op in ("mm", "bmm", "addmm", "baddbmm")]
    reads = [k for k, op in enumerate(seen.ops) if op == "nonzero"]
    assert len(reads) == FINITE_CHECKS and reads[-1] > products[-1]
    assert reads[0] < products[0]  # the losses' check: before the backward pass


def _overflowing_linear() -> tuple[torch.nn.Linear, torch.Tensor]:
    """A finite loss whose per-example gradient norm overflows float32 (inputs of 1e20)."""
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():
        model.weight.fill_(1e-20)
    return model, torch.full((2, 3), 1e20)


def test_a_non_finite_norm_is_refused_before_anything_reaches_the_gradients(monkeypatch) -> None:
    """Checked late (a first micro-batch once verified: its sums are built, then dropped) and early (a
    later micro-batch, holding sums): either way the gradients are as before the call."""
    finite_checks: list[bool] = []
    first_pass = GhostClipper._first_pass

    def spied(self, *args, **kwargs):
        finite_checks.append(kwargs.get("check_finite", True))
        return first_pass(self, *args, **kwargs)

    monkeypatch.setattr(GhostClipper, "_first_pass", spied)
    model, x = _overflowing_linear()
    with GhostClipper(model, 1.0) as clipper:
        clipper.clipped_backward(model(torch.ones(2, 3))[:, 0])  # runs the self-check: checked first
        model.zero_grad(set_to_none=True)
        loss = model(x)[:, 0]
        assert bool(torch.isfinite(loss).all())
        with pytest.raises(FloatingPointError, match=r"not finite for example\(s\) \[0, 1\]"):
            clipper.clipped_backward(loss)  # a first micro-batch: checked after its sums are built
        assert model.weight.grad is None and model.bias.grad is None
        clipper.clipped_backward(model(torch.ones(2, 3))[:, 0])  # a good micro-batch
        held = model.weight.grad.clone()
        with pytest.raises(FloatingPointError, match="not finite"):
            clipper.clipped_backward(model(x)[:, 0])  # accumulating: checked before its sums
        assert torch.equal(model.weight.grad, held)
    assert finite_checks == [True, False, False, True]


def test_a_non_finite_norm_under_checkpointing_is_refused_after_the_sum_pass(monkeypatch) -> None:
    """The checkpointed step checks its norms after the sum pass: an overflow in the norm pass (planted in
    its squared norms) is refused there, with nothing added to any gradient."""
    from hush_hf.clipping import recompute

    close = recompute.NormPass.close

    def overflowing(self, shapes):
        close(self, shapes)
        if poison:
            self.squared[1] = float("inf")

    monkeypatch.setattr(recompute.NormPass, "close", overflowing)
    torch.manual_seed(0)
    model = family_named("Llama").build(False).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(3, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    position_ids = torch.arange(16).expand(2, 16).contiguous()

    def loss() -> torch.Tensor:
        return example_cross_entropy(model(input_ids=ids, position_ids=position_ids).logits, ids, causal=True)

    with GhostClipper(model, 1.0) as clipper:
        poison = False
        clipper.clipped_backward(loss())  # the self-check's call
        held = {n: p.grad.clone() for n, p in model.named_parameters()}
        poison = True
        with pytest.raises(FloatingPointError, match=r"not finite for example\(s\) \[1\]"):
            clipper.clipped_backward(loss())
        for n, p in model.named_parameters():
            assert torch.equal(p.grad, held[n]), n
        model.zero_grad(set_to_none=True)
        with pytest.raises(FloatingPointError, match="not finite"):
            clipper.clipped_backward(loss())
        assert all(p.grad is None for p in model.parameters())


def test_compacting_many_uses_reads_back_twice_in_all() -> None:
    """The zero-step bounds of all uses, then the kept widths of those worth compacting: two reads,
    however many uses are compacted (was one more per compacted use)."""
    from hush_hf.clipping.factors import DenseFactor, OuterSum, materialize, norm_strategy
    from hush_hf.clipping.zero_steps import drop_zero_steps, drop_zero_steps_all
    from tests.test_clipping_factors import with_zero_steps

    g = torch.Generator().manual_seed(5)

    def wide_use() -> OuterSum:  # 64 x 64 over 12 steps: the ghost route, so worth compacting
        return OuterSum(
            DenseFactor(torch.randn(3, 12, 64, generator=g)), DenseFactor(torch.randn(3, 12, 64, generator=g))
        )

    keeps = [[3, 0, 1], [1, 1, 1], [5, 2, 0], [2, 4, 1]]  # each use its own width: 3, 1, 5, 4
    uses = [with_zero_steps(wide_use(), keep=keep, gen=g) for keep in keeps]
    assert norm_strategy(uses[:1]) == "ghost"
    with host_reads() as reads:
        together = drop_zero_steps_all(uses)
    assert reads.syncs == 2
    for one, original, keep in zip(together, uses, keeps, strict=True):
        assert one.row.values.shape[1] == max(keep)  # compacted to its widest example's nonzero steps
        torch.testing.assert_close(
            materialize(one).values, materialize(drop_zero_steps(original)).values, rtol=0, atol=0
        )


def _wide_llama() -> torch.nn.Module:
    """A 2-layer Llama wide enough (256) that at 32 steps every weight takes the ghost route, in float64."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config).double().train()


def _wide_llama_reads(padded: bool, checkpointing: bool) -> tuple[int, torch.Tensor]:
    """``_wide_llama``'s reads and norms in its second (verified) step: its weights' uses are checked for
    zero steps; ``padded``: each example's last 12 positions are padding (masked out, no target)."""
    model = _wide_llama()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(3, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    labels = ids.clone()
    if padded:
        mask[:, 20:] = 0
        labels[:, 20:] = -100
    with GhostClipper(model, 1.0) as clipper:
        for _ in range(2):
            logits = model(input_ids=ids, attention_mask=mask).logits
            loss = example_cross_entropy(logits, labels, causal=True)
            with host_reads() as reads:
                norms = clipper.clipped_backward(loss)
    return reads.syncs, norms


def test_a_checkpointed_pass_stops_checking_zero_steps_once_a_use_has_too_few() -> None:
    """Without padding the output layer's use has one zero step in 32 (the last position's), too few to
    compact, and so has every layer below: the step checks once, and the sum pass not again (was a read
    per use in each pass: 24 in all). With 12 of 32 steps padded every use is still checked and
    compacted. Norms as without checkpointing, either way."""
    reads, norms = _wide_llama_reads(padded=False, checkpointing=True)
    assert reads == FINITE_CHECKS + 1
    _, reference = _wide_llama_reads(padded=False, checkpointing=False)
    torch.testing.assert_close(norms, reference, rtol=1e-10, atol=0)
    reads, norms = _wide_llama_reads(padded=True, checkpointing=True)
    assert reads > 16  # each use's check and compacted width (34)
    _, reference = _wide_llama_reads(padded=True, checkpointing=False)
    torch.testing.assert_close(norms, reference, rtol=1e-10, atol=0)


def test_the_sum_pass_drops_the_zero_steps_the_norm_pass_dropped(monkeypatch) -> None:
    """Prompt-masked labels (only the last 8 of 32 positions have targets): the output layer's use is
    compacted to 8 steps in the norm pass, and a layer below then finds too few zero steps to compact.
    The sum pass follows the norm pass's decision per call, so the output layer's clipped sum is again
    taken over 8 steps (not 32, as when it inherited the shapes the layers below settled)."""
    from hush_hf.clipping import recompute
    from hush_hf.clipping.factors import OuterSum

    steps: list[tuple[str, int]] = []
    for cls, tag in ((recompute.NormPass, "norm"), (recompute.SumPass, "sum")):
        original = cls.add

        def add(self, name, use, shape, call, original=original, tag=tag):
            if "lm_head" in name and isinstance(use, OuterSum):
                steps.append((tag, use.row.values.shape[1]))
            return original(self, name, use, shape, call)

        monkeypatch.setattr(cls, "add", add)
    monkeypatch.setattr(recompute, "KEEP_SEGMENTS", 0.0)  # nothing kept: every call reaches the sum pass
    model = _wide_llama()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(3, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :24] = -100
    with GhostClipper(model, 1.0) as clipper:
        for _ in range(2):
            steps.clear()
            clipper.clipped_backward(example_cross_entropy(model(input_ids=ids).logits, labels, causal=True))
    assert steps == [("norm", 8), ("sum", 8)]
