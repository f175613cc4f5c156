"""Mixture-of-experts layers: routed per-example gradients against independent references, the cost
claim (no per-example copy of all experts), and what is refused.

The one-step trainer test of every MoE family (float64, eager expert loop) is in
tests/test_model_families.py; here: the routed algebra against dense per-example gradients built by
index_add, the models' default ``grouped_mm`` experts in float32 against per-example autograd, the
shapes every tensor of a clipped backward has, bf16, and the refusals.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor, nn

from hush_hf.clipping import GhostClipper, UnsupportedLayerError, clipped_sums, example_cross_entropy
from hush_hf.clipping.factors import squared_norm_of_sum, weighted_sum
from hush_hf.clipping.registry import register_batch_fold, register_norm_rule
from hush_hf.clipping.routed import RoutedOuterSum
from hush_hf.clipping.rules_moe import router_grads
from tests.model_families import FAMILIES, VOCAB, Family
from tests.test_trainer_helpers import single_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given", "ignore:noise_multiplier=0")

MOE = {f.name: f for f in FAMILIES if f.notes.startswith("MoE")}


def family(name: str) -> Family:
    return MOE[name]


# ----------------------------------------------------------------------------- the routed algebra
def random_routed(pairs: int, *, batch=3, experts=5, rows=6, cols=4, seed=0) -> RoutedOuterSum:
    g = torch.Generator().manual_seed(seed)
    return RoutedOuterSum(
        torch.randint(0, batch, (pairs,), generator=g),
        torch.randint(0, experts, (pairs,), generator=g),
        torch.randn(pairs, rows, generator=g, dtype=torch.float64),
        torch.randn(pairs, cols, generator=g, dtype=torch.float64),
        batch,
        experts,
    )


def dense(g: RoutedOuterSum) -> Tensor:
    """The per-example gradients written out, (b, E, rows, cols): the reference, never the engine's way."""
    out = torch.zeros(g.batch, *g.shape, dtype=torch.float64)
    outer = g.row[:, :, None] * g.col[:, None, :]
    return out.index_put_((g.example, g.expert), outer, accumulate=True)


@pytest.mark.parametrize("pairs", [7, 400], ids=["gram", "formed"])
def test_routed_norms_inner_products_and_weighted_sums_equal_the_dense_per_example_gradients(pairs):
    """7 pairs over 3 examples x 5 experts: at most a few per (example, expert), below the 2.4 at which a
    6 x 4 block pays, so Gram matrices; 400 pairs: blocks formed. Both equal the dense reference."""
    g, h = random_routed(pairs), random_routed(pairs, seed=1)
    dg, dh = dense(g), dense(h)
    torch.testing.assert_close(squared_norm_of_sum([g]), dg.pow(2).sum((1, 2, 3)), rtol=1e-12, atol=0)
    torch.testing.assert_close(
        squared_norm_of_sum([g, h]), (dg + dh).pow(2).sum((1, 2, 3)), rtol=1e-12, atol=0
    )  # two uses of one weight: the cross term is there
    weights = torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(weighted_sum(g, weights), torch.einsum("b,berc->erc", weights, dg))


@pytest.mark.parametrize("route", ["size-classes", "group-by-group"])
def test_routed_norms_of_groups_of_every_size_equal_the_dense_reference_in_either_pair_order(
    route, monkeypatch
):
    """(40 x 30) experts, a block pays from 17.1 pairs: (example, expert) groups of 1 to 40 pairs, so
    Gram matrices (in size classes 1, 2, 3, 6, 12, 24: 5 pairs padded to 6, 9 to 12, 17 to 24; or one
    group at a time, the CPU route) and blocks formed (18, 40 pairs). The norms equal the dense reference
    with the pairs shuffled and with them already grouped by (expert, example) (no reordering then); a
    non-finite pair leaves the other examples' norms exact."""
    import hush_hf.clipping.routed as routed
    from hush_hf.clipping.routed import pair_groups

    monkeypatch.setattr(routed, "PER_GROUP_DEVICES", frozenset({"cpu"} if route == "group-by-group" else ()))

    batch, experts, rows, cols = 3, 4, 40, 30
    sizes = {(0, 0): 1, (0, 1): 2, (0, 3): 40, (1, 0): 3, (1, 1): 5, (1, 2): 9, (2, 2): 17, (2, 3): 18}
    example = torch.tensor([i for (i, _), n in sizes.items() for _ in range(n)])
    expert = torch.tensor([e for (_, e), n in sizes.items() for _ in range(n)])
    g = torch.Generator().manual_seed(3)
    row = torch.randn(len(example), rows, generator=g, dtype=torch.float64)
    col = torch.randn(len(example), cols, generator=g, dtype=torch.float64)
    shuffle = torch.randperm(len(example), generator=g)
    shuffled = RoutedOuterSum(example[shuffle], expert[shuffle], row[shuffle], col[shuffle], batch, experts)
    order = torch.argsort(expert * batch + example, stable=True)
    grouped = RoutedOuterSum(example[order], expert[order], row[order], col[order], batch, experts)
    assert pair_groups(grouped.example, grouped.expert, batch, experts).order is None
    assert pair_groups(shuffled.example, shuffled.expert, batch, experts).order is not None
    expected = dense(grouped).pow(2).sum((1, 2, 3))
    for use in (shuffled, grouped):
        torch.testing.assert_close(squared_norm_of_sum([use]), expected, rtol=1e-12, atol=0)
    broken = grouped.row.clone()
    # example 2's first pair (on expert 2), read as padding by example 1's 9 pairs on expert 2 (width 12)
    broken[int(torch.nonzero(grouped.example == 2)[0])] = float("nan")
    norms = squared_norm_of_sum([RoutedOuterSum(grouped.example, grouped.expert, broken, grouped.col, 3, 4)])
    assert norms[2].isnan() and torch.equal(norms[:2], squared_norm_of_sum([grouped])[:2])


def test_routed_uses_refuse_other_forms_and_inconsistent_pairs():
    g = random_routed(5)
    with pytest.raises(ValueError, match="routed uses of the same shape"):
        g.inner(random_routed(5, rows=7))
    with pytest.raises(ValueError, match="routed pairs disagree"):
        RoutedOuterSum(g.example, g.expert[:4], g.row, g.col, 3, 5)


# ----------------------------------------------------------------------------- tuple outputs, folds
class TupleRouter(nn.Module):
    """Returns (logits, softmax(logits)) like transformers' routers; ``leak`` adds a second use of the
    weight outside the logits (in the second element), which the rule does not see."""

    def __init__(self, leak: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)))
        self.leak = leak

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        logits = torch.nn.functional.linear(x, self.weight)
        probs = logits.softmax(-1)
        return logits, probs + x @ self.weight.T if self.leak else probs


class FoldingBlock(nn.Module):
    """(b, T, 4) -> rows (b * T, 4) -> the router -> (b, T, 3), like an MoE block."""

    def __init__(self, leak: bool = False) -> None:
        super().__init__()
        self.router = TupleRouter(leak)

    def forward(self, x: Tensor) -> Tensor:
        _, probs = self.router(x.reshape(-1, 4))
        return probs.reshape(x.shape[0], -1, 3)


register_norm_rule(TupleRouter, output_index=0)(router_grads)
register_batch_fold(FoldingBlock)


def test_a_rule_with_output_index_records_that_element_of_a_tuple_under_a_batch_fold():
    """The router's rule sees its logits' gradient, unfolded per example: norms equal torch.func's. A
    second use of the weight in another element of the tuple is refused by the self-check."""
    from tests.test_clipping_reference import norms_of, per_example_grads

    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(1))
    model = nn.Sequential(FoldingBlock()).double()
    expected = norms_of(per_example_grads(model, {"input": x.double()}, lambda out: out.pow(3).sum((1, 2))))
    with GhostClipper(model, 1.0) as clipper:
        norms = clipper.per_example_norms(model(x.double()).pow(3).sum((1, 2)))
    torch.testing.assert_close(norms, expected, rtol=1e-12, atol=0)
    leaky = nn.Sequential(FoldingBlock(leak=True)).double()
    clipper = GhostClipper(leaky, 1.0)
    with pytest.raises(UnsupportedLayerError, match=r"self-check failed.*'0\.router\.weight'"):
        clipper.clipped_backward(leaky(x.double()).pow(3).sum((1, 2)))
    clipper.remove()


# ----------------------------------------------------------------------------- models, float32
def build(name: str, *, eager: bool = False) -> nn.Module:
    model = family(name).build(False)
    if not eager:
        model.config._experts_implementation = "grouped_mm"  # transformers' default
    return model


def batch_of(size: int = 4, length: int = 12, seed: int = 1) -> Tensor:
    return torch.randint(3, VOCAB, (size, length), generator=torch.Generator().manual_seed(seed))


def clipped_steps(model: nn.Module, ids: Tensor, clip: float, steps: int = 2) -> Iterator[Tensor]:
    """``steps`` clipped steps of the causal LM on ``ids``, each verified (the first runs the self-check):
    yields each step's norms, the clipped sum in the parameters' ``grad``."""
    with GhostClipper(model, clip) as clipper:
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            loss = example_cross_entropy(model(input_ids=ids).logits, ids, causal=True)
            norms = clipper.clipped_backward(loss)
            assert clipper.verified
            yield norms


def reference(model: nn.Module, ids: Tensor, clip: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-example norms and sum_i min(1, C'/||g_i||) g_i from one autograd.grad per example's loss
    (independent of hush_hf.clipping but for the per-example loss)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    losses = example_cross_entropy(model(input_ids=ids).logits, ids, causal=True)
    grads = [
        torch.autograd.grad(loss, list(params.values()), retain_graph=True, allow_unused=True)
        for loss in losses
    ]
    grads = [
        [torch.zeros_like(p) if g is None else g for g, p in zip(gs, params.values(), strict=True)]
        for gs in grads
    ]
    norms = torch.stack([torch.sqrt(sum(g.double().pow(2).sum() for g in gs)) for gs in grads])
    coef = (clip * (1 - 2.0**-20) / norms).clamp(max=1.0)
    total = {
        n: sum(c * gs[k].double() for c, gs in zip(coef, grads, strict=True)) for k, n in enumerate(params)
    }
    return norms, total


@pytest.mark.parametrize("name", ["Mixtral", "Qwen2-MoE", "DeepSeek-V3", "GPT-OSS", "Llama-4 (text)"])
def test_default_grouped_mm_experts_match_per_example_autograd_in_float32(name):
    """The models as transformers builds them (grouped_mm experts where the family has them, float32):
    per-example norms and the clipped sum equal per-example autograd (measured: 7e-8 and 2e-7)."""
    model = build(name).float()
    ids = batch_of()
    clip = 0.05
    norms, expected = reference(model, ids, clip)
    assert (norms > clip).all()
    with GhostClipper(model, clip) as clipper:
        got = clipper.clipped_backward(example_cross_entropy(model(input_ids=ids).logits, ids, causal=True))
    torch.testing.assert_close(got, norms, rtol=1e-5, atol=0)
    named = dict(model.named_parameters())
    diff = torch.cat([(named[n].grad.double() - v).flatten() for n, v in expected.items()])
    scale = torch.cat([v.flatten() for v in expected.values()])
    assert float(diff.norm() / scale.norm()) <= 1e-5
    experts = [n for n, p in named.items() if p.dim() == 3]
    assert experts and all(named[n].grad.abs().sum() > 0 for n in experts)


def tensor_shapes(fn, *, ops: bool = False) -> list:
    """Shapes of every tensor the ops inside ``fn()`` return (a dispatch mode sees all of them); with
    ``ops``, (operation name, shape) pairs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    shapes: list = []

    class Shapes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, Tensor):
                    shape = tuple(t.shape)
                    shapes.append((func.overloadpacket.__name__, shape) if ops else shape)
            return out

    with Shapes():
        fn()
    return shapes


def mixtral(hidden: int, intermediate: int, experts: int) -> nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, num_local_experts=experts, num_experts_per_tok=2,
        max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # grouped_mm needs 16-byte strides, which 10 floats are not
    return MixtralForCausalLM(config).train()


@pytest.mark.parametrize(
    ("hidden", "intermediate", "length", "formed"),
    [(20, 36, 11, False), (8, 10, 70, True)],
    ids=["gram-cheaper", "forming-cheaper"],
)
def test_an_expert_weights_norm_never_forms_a_per_example_copy_of_all_experts(
    hidden, intermediate, length, formed
):
    """Every tensor a clipped backward creates (the self-check's step and a plain one), seen by a dispatch
    mode; 3 examples, 5 experts, top-2. gate_up_proj is (5, 72, 20) and down_proj (5, 20, 36): a block pays
    from 15.7 (resp. 12.9) pairs of one example on one expert, and 11 tokens send at most 11, so the norms
    come from Gram matrices: no (72, 20) or (20, 36) block is squared, no (3, 72, 20) per-example block
    appears, let alone a (3, 5, 72, 20) copy of all experts. With 70 tokens and (5, 20, 8) and (5, 8, 10)
    experts (a block pays from 5.7, resp. 4.4 pairs) blocks are formed and squared, one (example, expert)
    at a time: (20, 8), never (3, 20, 8) nor (3, 5, 20, 8)."""
    batch, experts = 3, 5
    model = mixtral(hidden, intermediate, experts)
    ids = batch_of(batch, length)
    with GhostClipper(model, 1e-3) as clipper:
        shapes = []
        for _ in range(2):
            loss = example_cross_entropy(model(input_ids=ids).logits, ids, causal=True)
            shapes += tensor_shapes(lambda loss=loss: clipper.clipped_backward(loss), ops=True)
        assert clipper.verified
    for rows, cols in ((2 * intermediate, hidden), (hidden, intermediate)):
        blocks = [
            s
            for _, s in shapes
            if s[-2:] == (rows, cols) or s[-1:] in ((rows * cols,), (experts * rows * cols,))
        ]
        assert (experts, rows, cols) in blocks  # the clipped sum itself
        size = math.prod
        copies = [s for s in blocks if size(s) >= batch * experts * rows * cols]
        per_example = [s for s in blocks if s[0] == batch and size(s) == batch * rows * cols]
        assert not copies and not per_example, (copies, per_example)
        squared = [s for op, s in shapes if op == "pow" and s == (rows, cols)]
        assert bool(squared) == formed, (rows, cols, squared)


# ----------------------------------------------------------------------------- bf16
@pytest.mark.parametrize("autocast", [True, False], ids=["bf16-autocast", "bf16-parameters"])
def test_under_bf16_each_applied_per_example_gradient_stays_within_c(autocast):
    """Mixtral, one example per call (so the clipped sum is that example's applied gradient: ``p.grad``,
    or the float32 sum kept beside a bf16 parameter until the noise), clip far below the norms: the
    self-check passes and ||c_i g_i|| <= C with the bf16 margin of ``CLIP_MARGINS`` (measured:
    0.98437 C = C (1 - 2^-6) to 1e-7, both ways)."""
    model = build("Mixtral")
    if not autocast:
        model = model.to(torch.bfloat16)
    ids = batch_of(4)
    clip, worst = 1e-3, 0.0
    with GhostClipper(model, clip) as clipper:
        for i in range(ids.shape[0]):
            clipped_sums.discard_(list(model.parameters()))
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = example_cross_entropy(
                    model(input_ids=ids[i : i + 1]).logits, ids[i : i + 1], causal=True
                )
            assert float(clipper.clipped_backward(loss)[0]) > clip
            applied = [clipped_sums.clipped_sum(p) for p in model.parameters()]
            norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in applied if g is not None))
            worst = max(worst, norm / clip)
        assert clipper.verified
    assert 1 - 2**-5 <= worst <= 1.0


# ----------------------------------------------------------------------------- refusals
def test_qwen3_next_linear_attention_parameters_are_refused_unless_frozen():
    from transformers import Qwen3NextForCausalLM

    model = family("Qwen3-Next").build(False)
    for p in model.parameters():
        p.requires_grad_(True)
    assert isinstance(model, Qwen3NextForCausalLM)
    with pytest.raises(
        UnsupportedLayerError,
        match=r"'model\.layers\.0\.linear_attn'.*conv1d\.weight, norm\.weight, A_log, dt_bias",
    ):
        GhostClipper(model, 1.0)
    model.model.layers[0].linear_attn.conv1d.weight.requires_grad_(False)
    with pytest.raises(UnsupportedLayerError, match=r"its norm\.weight, A_log, dt_bias have"):
        GhostClipper(model, 1.0)


def test_expert_parallel_experts_are_refused():
    model = build("Mixtral", eager=True)
    model.model.layers[1].mlp.experts._is_expert_parallel = True
    with pytest.raises(UnsupportedLayerError, match=r"'model\.layers\.1\.mlp\.experts'.*expert parallelism"):
        GhostClipper(model, 1.0)


def test_the_routers_load_balancing_loss_is_refused_before_any_gradient(tmp_path):
    """With output_router_logits=True a MoE model's own loss adds coef * aux, aux a function of every
    token's routing in the batch (measured here), so it is no per-example loss: training refuses at the
    first step, before any gradient reaches the parameters."""
    import numpy as np

    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_model_families import N, pad_collator, rows
    from tests.test_trainer_helpers import dp_config, make_plan, sgd

    model = build("Mixtral", eager=True)
    ids = batch_of(2)
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids, output_router_logits=True)
        alone = model(input_ids=ids[:1], labels=ids[:1], output_router_logits=True)
        plain = model(input_ids=ids, labels=ids)
    assert float(out.aux_loss) > 0 and float(out.aux_loss - alone.aux_loss) != 0.0  # depends on the batch
    torch.testing.assert_close(out.loss, plain.loss + model.config.router_aux_loss_coef * out.aux_loss)
    model.config.output_router_logits = True
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = rows("causal", True)
    plan = make_plan(np.ones(N), steps=1, noise_multiplier=1.0, rows=data)
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(
            tmp_path,
            max_steps=1,
            per_example_clip_norm=1e-4,
            noise_multiplier=0.0,
            per_device_train_batch_size=2,
        ),
        train_dataset=plan.attach(data),
        data_collator=pad_collator(0),
        plan=plan,
        optimizers=sgd(model, lr=1.0),
    )
    with pytest.raises(
        ValueError, match=r"output_router_logits=True: its loss adds the routers' load-balancing"
    ):
        trainer.train()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
