"""Per-example clipping under gradient checkpointing (``hush_hf.clipping.recompute``).

Against torch.func per-example gradients (float64): the norms and the clipped sum of checkpointed
models, reentrant and not, tied weights included; through the trainer, the update with checkpointing
equals the one without on Llama, GPT-2 (tied), Gemma-2 and a LoRA model, and TRL's default
(``SFTConfig`` turns checkpointing on) trains exactly. What checkpointing is for stays true: the inputs
of checkpointed layers are not kept by the clipper. A parameter read directly inside a checkpointed
layer is refused, and so is a checkpoint the engine cannot follow.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from hush_hf.clipping import GhostClipper, UnsupportedLayerError, example_cross_entropy
from hush_hf.trainer import GhostClippingCallback, SecretProtectionTrainer
from tests.model_families import family_named
from tests.test_clipping_reference import (
    clipped_sum,
    lm_batch,
    norms_of,
    per_example_grads,
    reference_lm_loss,
    tiny_bert,
    tiny_gemma2,
    tiny_gpt2,
)
from tests.test_model_families import CLIP, N, pad_collator, rows
from tests.test_trainer_helpers import dp_config, make_plan, sgd, single_thread  # noqa: F401  (autouse)

pytestmark = pytest.mark.filterwarnings(
    "ignore:dp_seed was given", "ignore:noise_multiplier=0", "ignore::FutureWarning", "ignore::UserWarning"
)


def tiny_llama_lora() -> nn.Module:
    return family_named("Llama + LoRA (peft)").build(True)


MODELS = {
    "gpt2-tied": (tiny_gpt2, True),
    "gemma2-tied": (tiny_gemma2, True),
    "bert-masked-tied": (tiny_bert, False),
    "llama-lora": (tiny_llama_lora, True),
}


def batch_for(model: nn.Module, causal: bool) -> tuple[dict[str, Tensor], Tensor]:
    """``lm_batch`` with its real tokens folded into the model's vocabulary (ids >= 3; pads stay 0)."""
    kwargs, labels = lm_batch(causal)
    real, vocab = kwargs["attention_mask"] == 1, model.config.vocab_size
    kwargs["input_ids"] = torch.where(real, (kwargs["input_ids"] - 3) % (vocab - 3) + 3, kwargs["input_ids"])
    labels = torch.where(labels >= 0, (labels - 3) % (vocab - 3) + 3, labels)
    return kwargs, labels


def close(got: dict[str, Tensor], expected: dict[str, Tensor], rtol: float) -> None:
    """Per parameter, relative to the whole update's norm (a key bias's true gradient is ~1e-20)."""
    scale = torch.sqrt(sum((v.double() ** 2).sum() for v in expected.values()))
    for name, value in expected.items():
        err = float((got[name].double() - value.double()).norm())
        assert err <= rtol * float(value.norm()) + 1e-12 * float(scale), (name, err)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_checkpointed_step_matches_reference(name: str, reentrant: bool) -> None:
    make, causal = MODELS[name]
    model = make().double()
    kwargs, labels = batch_for(model, causal)
    loss_of = lambda out: reference_lm_loss(out.logits, labels, causal)  # noqa: E731
    grads = per_example_grads(copy.deepcopy(model), kwargs, loss_of)
    max_norm = float(norms_of(grads).median())  # clips some examples, not others
    expected = clipped_sum(grads, max_norm)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    with GhostClipper(model, max_norm) as clipper:
        for _ in range(2):  # the first call runs the self-check too
            model.zero_grad(set_to_none=True)
            loss = example_cross_entropy(model(**kwargs).logits, labels, causal=causal)
            norms = clipper.clipped_backward(loss)
            assert clipper.verified
    torch.testing.assert_close(norms, norms_of(grads), rtol=1e-6, atol=0)  # the loss is taken in float32
    close({n: p.grad for n, p in model.named_parameters() if p.requires_grad}, expected, rtol=1e-5)


def test_checkpointed_per_example_norms_leave_grads_and_graph() -> None:
    model = tiny_gpt2().double()
    kwargs, labels = lm_batch(True)
    loss_of = lambda out: reference_lm_loss(out.logits, labels, True)  # noqa: E731
    grads = per_example_grads(copy.deepcopy(model), kwargs, loss_of)
    plain = copy.deepcopy(model)
    example_cross_entropy(plain(**kwargs).logits, labels, causal=True).sum().backward()
    model.gradient_checkpointing_enable()
    with GhostClipper(model, 1.0) as clipper:
        loss = example_cross_entropy(model(**kwargs).logits, labels, causal=True)
        norms = clipper.per_example_norms(loss)
        assert all(p.grad is None for p in model.parameters())
        loss.sum().backward()  # the graph is still there, and the taps pass gradients through unchanged
    torch.testing.assert_close(norms, norms_of(grads), rtol=1e-6, atol=0)
    close({n: p.grad for n, p in model.named_parameters()}, {n: p.grad for n, p in plain.named_parameters()},
          rtol=1e-10)  # fmt: skip


def test_once_verified_a_checkpointed_step_computes_no_parameter_gradient(monkeypatch) -> None:
    """Non-reentrant: each pass is ``autograd.grad`` towards the calls' scalar anchors only (no weight
    gradient is computed by autograd, none lands in ``p.grad``); reentrant checkpointing needs
    ``Tensor.backward``, with the parameters' gradients set aside."""
    model = tiny_gpt2().double()
    kwargs, labels = lm_batch(True)
    model.gradient_checkpointing_enable()
    inputs: list[list[Tensor]] = []
    original = torch.autograd.grad

    def recorded(outputs, wrt, *args, **kw):
        inputs.append(list(wrt))
        return original(outputs, wrt, *args, **kw)

    with GhostClipper(model, 1.0) as clipper:
        clipper.clipped_backward(example_cross_entropy(model(**kwargs).logits, labels, causal=True))
        assert clipper.verified
        first = {n: p.grad.clone() for n, p in model.named_parameters()}
        monkeypatch.setattr(torch.autograd, "grad", recorded)
        monkeypatch.setattr(torch.Tensor, "backward", lambda *a, **k: pytest.fail("Tensor.backward ran"))
        clipper.clipped_backward(example_cross_entropy(model(**kwargs).logits, labels, causal=True))
    assert len(inputs) == 2 and all(t.shape == torch.Size([]) for wrt in inputs for t in wrt)  # anchors only
    assert 0 < len(inputs[1]) < len(inputs[0])  # one per call; the sum pass's stop above the kept ones
    assert not any(t is p for wrt in inputs for t in wrt for p in model.parameters())
    for n, p in model.named_parameters():  # the second call accumulated the same clipped sum
        torch.testing.assert_close(p.grad, 2 * first[n], rtol=1e-10, atol=1e-14)


def saved_bytes(model: nn.Module, kwargs: dict[str, Tensor], labels: Tensor) -> int:
    """Bytes autograd keeps for the backward pass of one forward, outside checkpointed segments (the
    checkpoint's own hooks take the tensors saved inside them, and keep none)."""
    total = 0

    def pack(t: Tensor) -> Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        example_cross_entropy(model(**kwargs).logits, labels, causal=True)
    return total


def test_the_clipper_keeps_no_input_of_a_checkpointed_layer() -> None:
    """With checkpointing, what the clipper adds to the saved tensors is the inputs of the layers outside
    the checkpointed blocks (token ids, final norm, output projection): nothing per block, so the memory
    checkpointing saves stays saved. (Without checkpointing the engine keeps every layer's input.)"""
    model = tiny_gpt2().double()
    kwargs, labels = lm_batch(True)
    model.gradient_checkpointing_enable()
    alone = saved_bytes(model, kwargs, labels)
    with GhostClipper(model, 1.0) as clipper:
        clipped = saved_bytes(model, kwargs, labels)
        clipper.reset()
    hidden = kwargs["input_ids"].numel() * model.config.n_embd * 8  # one (b, T, d) float64 tensor
    outside = 2 * hidden + kwargs["input_ids"].numel() * 8 * 2  # ln_f and lm_head inputs; wte and wpe ids
    assert clipped - alone <= outside
    model.gradient_checkpointing_disable()
    assert saved_bytes(model, kwargs, labels) > alone + 4 * hidden  # what checkpointing saves


class Block(nn.Module):
    """A checkpointed block, flagged like transformers' layers; optionally reads ``proj.weight`` directly."""

    def __init__(self, direct: bool, flagged: bool, reentrant: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.direct, self.reentrant, self.checkpointed = direct, reentrant, True
        if flagged:
            self.gradient_checkpointing = True

    def _run(self, h: Tensor) -> Tensor:
        out = torch.tanh(self.proj(h))
        return out + F.linear(h, self.proj.weight) if self.direct else out

    def forward(self, h: Tensor) -> Tensor:
        return checkpoint(self._run, h, use_reentrant=self.reentrant) if self.checkpointed else self._run(h)


class Stack(nn.Module):
    def __init__(self, **block: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.block = Block(**block)
        self.head = nn.Linear(8, 20)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.block(self.emb(ids)))


IDS = torch.randint(0, 20, (3, 5), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_parameter_read_directly_inside_a_checkpointed_layer_is_refused(reentrant: bool) -> None:
    torch.manual_seed(0)
    model = Stack(direct=True, flagged=True, reentrant=reentrant)
    with GhostClipper(model, 1.0) as clipper:
        loss = example_cross_entropy(model(IDS), IDS, causal=True)
        with pytest.raises(UnsupportedLayerError, match=r"'block\.proj\.weight'"):
            clipper.clipped_backward(loss)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_checkpoint_without_the_flag_is_refused(reentrant: bool) -> None:
    """Untapped, the engine would miss the layers a checkpoint re-runs: refused, naming the fix."""
    torch.manual_seed(0)
    model = Stack(direct=False, flagged=False, reentrant=reentrant)
    with GhostClipper(model, 1.0) as clipper:
        loss = example_cross_entropy(model(IDS), IDS, causal=True)
        with pytest.raises(RuntimeError, match="gradient_checkpointing_enable"):
            clipper.clipped_backward(loss)
    assert all(p.grad is None for p in model.parameters())
    model.block.gradient_checkpointing = True  # flagged: followed, and exact
    unchecked = copy.deepcopy(model)
    unchecked.block.checkpointed = False  # (torch.func does not run checkpoints)
    grads = per_example_grads(unchecked, {"ids": IDS}, lambda out: reference_lm_loss(out, IDS, True))
    with GhostClipper(model, 1e-3) as clipper:
        norms = clipper.clipped_backward(example_cross_entropy(model(IDS), IDS, causal=True))
    torch.testing.assert_close(norms, norms_of(grads), rtol=1e-5, atol=0)
    close({n: p.grad for n, p in model.named_parameters()}, clipped_sum(grads, 1e-3), rtol=1e-4)


# ----------------------------------------------------------------------------- mixture of experts
@pytest.mark.parametrize(
    ("reentrant", "trained"),
    [(False, "all"), (True, "all"), (False, "last block's experts and router")],
    ids=["non-reentrant", "reentrant", "non-reentrant-last-moe-only"],
)
def test_checkpointed_mixture_of_experts_matches_per_example_autograd(reentrant: bool, trained: str) -> None:
    """Mixtral (float64, eager experts) checkpointed: its routers return (logits, scores, indices) and
    compute the scores from the logits inside the call, so a tap after the call would see only the part
    of the logits' gradient that flows outside; the logits' own gradient hook sees all of it. Two calls,
    the first with the self-check, the second after it, where autograd reaches a router only because its
    weight is an input of the pass: with only the last block's MoE trained, the router's input comes from
    frozen layers. Norms and clipped sum equal per-example autograd without checkpointing, both calls."""
    from tests.test_clipping_moe import batch_of, clipped_steps, reference

    model = family_named("Mixtral").build(False).double()
    if trained != "all":
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("model.layers.1.mlp."))
    ids = batch_of()
    norms, _ = reference(model, ids, 1.0)
    clip = float(norms.median())  # clips some examples, not others
    norms, expected = reference(model, ids, clip)
    model.zero_grad(set_to_none=True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    routers = [n for n, p in model.named_parameters() if p.requires_grad and n.endswith("mlp.gate.weight")]
    assert routers
    for got in clipped_steps(model, ids, clip):
        torch.testing.assert_close(got, norms, rtol=1e-10, atol=0)
        grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        assert all(float(grads[n].norm()) > 0 for n in routers)
        close(grads, expected, rtol=1e-5)  # the reference clips to C(1 - 2^-20)


# ----------------------------------------------------------------------------- through the trainer
def train_once(tmp_path, model: nn.Module, **args) -> dict[str, Tensor]:
    """One DP step, padded and micro-batched, no noise, SGD with lr 1: the update, per parameter."""
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    dataset = rows("causal", padded=True)
    plan = make_plan(np.ones(N), steps=1, noise_multiplier=1.0, rows=dataset)
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(tmp_path, max_steps=1, per_example_clip_norm=CLIP, noise_multiplier=0.0,
                       per_device_train_batch_size=2, **args),
        train_dataset=plan.attach(dataset),
        data_collator=pad_collator(0),
        plan=plan,
        optimizers=sgd(model, lr=1.0),
    )  # fmt: skip
    trainer.train()
    return {n: before[n] - p.detach() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("name", ["Llama", "GPT-2", "Gemma-2", "Llama + LoRA (peft)"])
def test_checkpointed_update_equals_the_update_without(tmp_path, name: str) -> None:
    family = family_named(name)
    without = train_once(tmp_path / "plain", family.build(family.ties[0]).double())
    model = family.build(family.ties[0]).double()
    with_checkpointing = train_once(tmp_path / "ckpt", model, gradient_checkpointing=True)
    assert any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
    assert set(with_checkpointing) == set(without)
    close(with_checkpointing, without, rtol=1e-10)


def test_trl_default_gradient_checkpointing_trains_exactly(tmp_path) -> None:
    """TRL's ``SFTConfig`` turns gradient checkpointing on by default; left so, one step equals the
    torch.func reference of each prepared row's own loss."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    from hush_hf.assets import gpt2_tokenizer
    from tests.test_trl import COMPLETIONS, PROMPTS, reference_update, tiny_gpt2

    tokenizer = gpt2_tokenizer()
    model = tiny_gpt2(len(tokenizer))
    args = SFTConfig(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, max_grad_norm=0.0, report_to=[],
        use_cpu=True, disable_tqdm=True, bf16=False, completion_only_loss=True,
    )  # fmt: skip
    assert args.gradient_checkpointing  # TRL's default
    data = datasets.Dataset.from_dict({"prompt": PROMPTS, "completion": COMPLETIONS})
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                         optimizers=sgd(model, lr=1.0))  # fmt: skip
    rows_ = trainer.train_dataset
    plan = make_plan(np.ones(len(rows_)), steps=1, noise_multiplier=1.0, rows=rows_)
    trainer.train_dataset = plan.attach(rows_)
    expected = reference_update(model, rows_, len(rows_))
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    GhostClippingCallback.attach(trainer, plan, clip_norm=CLIP, noise_multiplier=0.0, dp_seed=7)
    trainer.train()
    assert any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
    close({n: before[n] - p.detach() for n, p in model.named_parameters()}, expected, rtol=1e-5)


def test_the_graph_is_walked_for_a_reentrant_checkpoint_once_per_checkpoint_configuration(
    monkeypatch,
) -> None:
    """The walk of the autograd graph that finds a reentrant checkpoint runs at the first checkpointed step
    and again only when the checkpointing is configured anew: turned to reentrant mid-run, the next step
    walks, finds it, and still gives the reference's norms and clipped sum."""
    import hush_hf.clipping.checkpointed_step as checkpointed_step

    walks: list[bool] = []

    def counted(loss: Tensor) -> tuple[set[int], bool]:
        found = checkpointed_step_walk(loss)
        walks.append(found[1])
        return found

    checkpointed_step_walk = checkpointed_step._walk_graph
    monkeypatch.setattr(checkpointed_step, "_walk_graph", counted)
    model = tiny_gpt2().double()
    kwargs, labels = batch_for(model, True)
    loss_of = lambda out: reference_lm_loss(out.logits, labels, True)  # noqa: E731
    grads = per_example_grads(copy.deepcopy(model), kwargs, loss_of)
    max_norm = float(norms_of(grads).median())
    expected = clipped_sum(grads, max_norm)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with GhostClipper(model, max_norm) as clipper:
        for reentrant in (False, False, False, True, True):
            if reentrant and not walks[-1]:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
            model.zero_grad(set_to_none=True)
            loss = example_cross_entropy(model(**kwargs).logits, labels, causal=True)
            norms = clipper.clipped_backward(loss)
            torch.testing.assert_close(norms, norms_of(grads), rtol=1e-6, atol=0)
            close({n: p.grad for n, p in model.named_parameters()}, expected, rtol=1e-5)
    assert walks == [False, True]


def test_a_reentrant_checkpoint_the_configuration_misses_is_refused_before_any_gradient(monkeypatch) -> None:
    """Were a reentrant checkpoint to come in unseen (the configuration unchanged), ``autograd.grad`` refuses
    it: the step raises, and no parameter has a gradient."""
    import hush_hf.clipping.recording as recording

    monkeypatch.setattr(recording, "checkpoint_configuration", lambda segments: ())
    model = tiny_gpt2().double()
    kwargs, labels = batch_for(model, True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with GhostClipper(model, 1.0) as clipper:
        clipper.clipped_backward(example_cross_entropy(model(**kwargs).logits, labels, causal=True))
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.zero_grad(set_to_none=True)
        loss = example_cross_entropy(model(**kwargs).logits, labels, causal=True)
        with pytest.raises(RuntimeError, match="use_reentrant=True"):
            clipper.clipped_backward(loss)
    assert all(p.grad is None for p in model.parameters())
