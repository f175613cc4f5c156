"""GhostClipper behaviour on small custom torch models: layer rules, multi-use weights, validation,
unsupported layers, lifecycle (remove / context manager), and what it refuses to guess."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import Tensor, nn

from hush_hf.clipping import GhostClipper, UnsupportedLayerError, register_norm_rule, rules_generic
from hush_hf.clipping.factors import Materialized
from hush_hf.clipping.registry import rule_for
from tests.test_clipping_reference import clipped_sum, norms_of, per_example_grads

RTOL = 1e-5


def rel_err(a: Tensor, b: Tensor) -> float:
    return float(((a.double() - b.double()).abs() / b.double().abs()).max())


class Zoo(nn.Module):
    """Every torch rule, padding_idx, a 2-D Linear input, and weights used twice (multi-use)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 8, padding_idx=3)
        self.ln = nn.LayerNorm(8)
        self.ln_nobias = nn.LayerNorm((2, 4), bias=False)
        self.rms = nn.RMSNorm(8)
        self.lin = nn.Linear(8, 8)
        self.pool = nn.Linear(8, 5, bias=False)
        self.unused = nn.Linear(8, 8)  # output never reaches the loss

    def forward(self, ids: Tensor) -> Tensor:
        h = self.emb(ids)  # (b, T, 8)
        h = h + self.emb(ids.flip(1))  # second use of the same embedding
        h = self.ln(h)
        h = self.ln_nobias(h.view(*h.shape[:-1], 2, 4)).view(h.shape)
        h = torch.tanh(self.lin(self.rms(h)))
        h = torch.tanh(self.lin(h))  # second use of the same Linear
        self.unused(h)
        return self.pool(h.mean(1))  # 2-D input to a Linear


def zoo_batch(b: int = 4, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 30, (b, 6), generator=g)
    ids[0, :2] = 3  # padding_idx rows get no gradient
    return ids, torch.randn(b, 5, generator=g)


def zoo_loss(out: Tensor, target: Tensor) -> Tensor:
    return 0.5 * (out - target).pow(2).sum(1)


def test_every_torch_rule_and_multi_use_weights_match_reference() -> None:
    torch.manual_seed(0)
    model = Zoo()
    ids, target = zoo_batch()
    grads = per_example_grads(model, {"ids": ids}, lambda out: zoo_loss(out, target))
    max_norm = float(norms_of(grads).median())  # clips some examples, not others
    with GhostClipper(model, max_norm) as clipper:
        norms = clipper.clipped_backward(zoo_loss(model(ids), target))
    assert rel_err(norms, norms_of(grads)) <= RTOL
    named = dict(model.named_parameters())
    assert named["unused.weight"].grad is None  # never reached the loss
    for n, g in clipped_sum(grads, max_norm).items():
        got = named[n].grad.double() if named[n].grad is not None else torch.zeros_like(g)
        torch.testing.assert_close(got, g, rtol=RTOL, atol=1e-7)


def test_least_squares_closed_form() -> None:
    """loss_i = (w.x_i + c - y_i)^2 / 2: ||g_i|| = |r_i| sqrt(||x_i||^2 + 1) (no torch.func involved)."""
    torch.manual_seed(0)
    layer = nn.Linear(5, 1).double().eval()  # recording does not depend on train/eval mode
    x, y = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    with GhostClipper(layer, max_norm=0.5) as clipper:
        out = layer(x)[:, 0]
        norms = clipper.clipped_backward(0.5 * (out - y) ** 2)
    r = (out - y).detach()
    torch.testing.assert_close(norms, r.abs() * torch.sqrt(x.pow(2).sum(1) + 1), rtol=1e-12, atol=0)
    coef = torch.clamp(0.5 / norms, max=1.0)
    torch.testing.assert_close(layer.weight.grad[0], (coef * r) @ x, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(layer.bias.grad[0], (coef * r).sum(), rtol=1e-12, atol=1e-14)


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))  # raw parameter used in forward: no rule

    def forward(self, x: Tensor) -> Tensor:
        return self.lin(x) * self.scale


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), Scaled())

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


def spy_replays(monkeypatch) -> list:
    """The ``Replayed`` gradients the generic path makes from now on (a list that fills up)."""
    replayed: list = []
    original = rules_generic.Replayed

    def spy(*args):
        replayed.append(original(*args))
        return replayed[-1]

    monkeypatch.setattr(rules_generic, "Replayed", spy)
    return replayed


@pytest.mark.parametrize("chunk_values", [None, 4, 9], ids=["whole-batch", "chunks-of-1", "chunks-of-2"])
def test_layer_without_rule_takes_the_exact_generic_path_at_any_size(monkeypatch, chunk_values) -> None:
    """``Scaled`` owns a raw parameter and a Linear: the generic torch.func path gives its own
    parameter's per-example gradient, the Linear rule the rest; together exact. When the whole batch's
    gradients would exceed ``GENERIC_CHUNK_VALUES`` (patched small: 'scale' has 4 values) they are
    replayed in chunks of examples, for the norms and for the clipped sum, and stay exact."""
    if chunk_values is not None:
        monkeypatch.setattr(rules_generic, "GENERIC_CHUNK_VALUES", chunk_values)
    torch.manual_seed(0)
    model = Wrapper().double()
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    grads = per_example_grads(model, {"x": x}, lambda out: out.pow(2).sum((1, 2)))
    max_norm = float(norms_of(grads).median())
    expected = clipped_sum(grads, max_norm)
    replayed = spy_replays(monkeypatch)
    with GhostClipper(model, max_norm) as clipper:
        norms = clipper.clipped_backward(model(x).pow(2).sum((1, 2)))
    assert rel_err(norms, norms_of(grads)) <= RTOL
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-7, atol=1e-12)
    assert [r.rows for r in replayed] == ([] if chunk_values is None else [chunk_values // 4])
    model.block[1].scale.requires_grad_(False)  # frozen: ignored
    GhostClipper(model, 1.0).remove()


class LargePositions(nn.Module):
    """Learned positions with more trainable values than the generic path once refused (2^23)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(2**21 + 1, 4) * 0.1)
        self.out = nn.Linear(4, 3)

    def forward(self, positions: Tensor) -> Tensor:
        return self.out(torch.tanh(self.table[positions])).pow(2).sum((1, 2))


@pytest.mark.slow  # ~10 s; test_layer_without_rule_takes_the_exact_generic_path_at_any_size is the fast one
def test_a_rule_less_layer_beyond_the_old_limit_is_exact_in_chunks(monkeypatch) -> None:
    """8.4M values (OPT-6.7B's learned positions are 8.4M too) for 5 examples exceed
    ``GENERIC_CHUNK_VALUES``: replayed 3 examples at a time, unpatched, and exact."""
    torch.manual_seed(0)
    model = LargePositions()
    assert model.table.numel() > 2**23
    replayed = spy_replays(monkeypatch)
    positions = torch.randint(0, 2**21 + 1, (5, 6), generator=torch.Generator().manual_seed(1))
    grads = per_example_grads(model, {"positions": positions}, lambda out: out)
    with GhostClipper(model, 0.5) as clipper:
        norms = clipper.clipped_backward(model(positions))
    assert rel_err(norms, norms_of(grads)) <= RTOL
    expected = clipped_sum(grads, 0.5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad.double(), expected[name], rtol=1e-4, atol=1e-7)
    assert [r.rows for r in replayed] == [3]


class DoubledLinear(nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        return 2 * super().forward(x)


class PlainLinear(nn.Linear):
    """Inherits nn.Linear.forward unchanged."""


def test_subclass_rules_are_verified_not_assumed() -> None:
    """An overridden forward never inherits the parent's rule (it takes the generic path, exact);
    an inherited forward (the very same function) does."""
    assert rule_for(DoubledLinear) is None
    assert rule_for(PlainLinear) is rule_for(nn.Linear)
    torch.manual_seed(0)
    model = nn.Sequential(DoubledLinear(3, 3), nn.Tanh(), PlainLinear(3, 2)).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    grads = per_example_grads(model, {"input": x}, lambda out: out.pow(2).sum(1))
    with GhostClipper(model, 1.0) as clipper:
        norms = clipper.per_example_norms(model(x).pow(2).sum(1))
    assert rel_err(norms, norms_of(grads)) <= RTOL


def test_same_forward_code_shares_the_rule_only_with_the_same_bases() -> None:
    from transformers.models.gemma2.modeling_gemma2 import Gemma2TextScaledWordEmbedding
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    assert rule_for(Gemma3TextScaledWordEmbedding) is rule_for(Gemma2TextScaledWordEmbedding) is not None
    copy = type("Copy", (nn.Module,), {"forward": Gemma2TextScaledWordEmbedding.forward})
    assert rule_for(copy) is None  # same code, other bases: super() would resolve elsewhere


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"max_norm": 1.0}, "max_norm"),
        ({"scale_grad_by_freq": True}, "scale_grad_by_freq"),
        ({"sparse": True}, "sparse"),
    ],
)
def test_embedding_options_that_break_per_example_gradients_are_refused(kwargs, reason) -> None:
    with pytest.raises(UnsupportedLayerError, match=rf"'0' \(Embedding\).*{reason}"):
        GhostClipper(nn.Sequential(nn.Embedding(10, 4, **kwargs)), 1.0)


def test_remove_restores_the_model() -> None:
    torch.manual_seed(0)
    model = Zoo()
    ids, _ = zoo_batch()
    before_out = model(ids).detach()
    before_keys = list(model.state_dict())
    before_attrs = {id(p): set(vars(p)) for p in model.parameters()}
    clipper = GhostClipper(model, 1.0)
    assert any(m._forward_hooks for m in model.modules())
    clipper.per_example_norms(zoo_loss(model(ids), torch.zeros(4, 5)))
    clipper.remove()
    clipper.remove()  # idempotent
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())
    assert type(model) is Zoo and list(model.state_dict()) == before_keys
    assert {id(p): set(vars(p)) for p in model.parameters()} == before_attrs
    torch.testing.assert_close(model(ids), before_out, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="removed"):
        clipper.per_example_norms(zoo_loss(model(ids), torch.zeros(4, 5)))
    GhostClipper(model, 1.0).remove()  # a new clipper can be attached again


def test_one_clipper_per_model() -> None:
    model = nn.Linear(3, 3)
    with GhostClipper(model, 1.0), pytest.raises(ValueError, match="already has an active GhostClipper"):
        GhostClipper(model, 1.0)
    GhostClipper(model, 1.0).remove()  # the context manager removed the first one


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, True, "1.0", None])
def test_bad_max_norm(bad) -> None:
    with pytest.raises(ValueError, match="max_norm"):
        GhostClipper(nn.Linear(2, 2), bad)


def test_bad_per_example_loss() -> None:
    model = nn.Linear(3, 1)
    x = torch.randn(4, 3)
    with GhostClipper(model, 1.0) as clipper:
        out = model(x)
        with pytest.raises(ValueError, match=r"per_example_loss must be a 1-D.*\(4, 1\)"):
            clipper.clipped_backward(out)
        with pytest.raises(ValueError, match="per_example_loss must be a torch.Tensor"):
            clipper.clipped_backward([1.0, 2.0])
        loss = out[:, 0].clone()
        loss[2] = math.nan
        with pytest.raises(ValueError, match=r"not finite for example\(s\) \[2\]"):
            clipper.clipped_backward(loss)
        with pytest.raises(ValueError, match="does not require grad"):
            clipper.clipped_backward(out[:, 0].detach())
    assert model.weight.grad is None


def test_exactly_one_forward_per_call() -> None:
    model = nn.Linear(3, 1)
    x = torch.randn(4, 3)
    with GhostClipper(model, 1.0) as clipper:
        model(x)
        loss = model(x)[:, 0]
        with pytest.raises(RuntimeError, match="saw 2"):
            clipper.clipped_backward(loss)
        with pytest.raises(RuntimeError, match="saw 0"):
            clipper.clipped_backward(loss)  # the record was reset by the failed call
        with torch.no_grad():
            model(x)  # evaluation forwards are not recorded
        loss = model(x)[:, 0]
        model(x)
        clipper.reset()  # discard both; a fresh forward works
        clipper.clipped_backward(model(x)[:, 0])
    assert model.weight.grad is not None


def test_batch_mismatch_is_refused() -> None:
    model = nn.Linear(3, 1)
    with GhostClipper(model, 1.0) as clipper:
        loss = model(torch.randn(4, 3))[:, 0][:3]
        with pytest.raises(ValueError, match=r"'<root>' \(Linear\) ran on a batch of 4.*has 3"):
            clipper.clipped_backward(loss)


def test_in_place_change_of_a_recorded_output_is_exact() -> None:
    """The output gradient is taken at the layer's own gradient edge, so a later in-place change of the
    output (the model goes on with 2y) gives the exact per-example gradient, not one w.r.t. 2y."""

    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x: Tensor) -> Tensor:
            y = self.lin(x)
            y.mul_(2.0)
            return torch.tanh(y)

    torch.manual_seed(0)
    model, x = InPlace(), torch.randn(4, 3)
    grads = per_example_grads(model, {"x": x}, lambda out: out.pow(2).sum(1))
    max_norm = float(norms_of(grads).median())
    with GhostClipper(model, max_norm) as clipper:
        norms = clipper.clipped_backward(model(x).pow(2).sum(1))
    assert rel_err(norms, norms_of(grads)) <= RTOL
    named = dict(model.named_parameters())
    for n, g in clipped_sum(grads, max_norm).items():
        torch.testing.assert_close(named[n].grad.double(), g, rtol=RTOL, atol=1e-7)


def test_in_place_change_of_a_recorded_input_is_refused() -> None:
    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x: Tensor) -> Tensor:
            h = x * 1.0
            y = self.lin(h)
            h.mul_(2.0)
            return y + h

    model = InPlace()
    with GhostClipper(model, 1.0) as clipper:
        loss = model(torch.randn(4, 3)).sum(1)
        with pytest.raises(RuntimeError, match=r"input of layer 'lin' \(Linear\) was modified in place"):
            clipper.clipped_backward(loss)


def test_changing_trainable_parameters_after_construction_is_refused() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    model[0].requires_grad_(False)
    with GhostClipper(model, 1.0) as clipper:
        model[0].requires_grad_(True)
        with pytest.raises(RuntimeError, match="trainable parameters of the model changed"):
            clipper.clipped_backward(model(torch.randn(2, 3))[:, 0])


@pytest.mark.parametrize("change", ["toggle", "replace"])
def test_changing_trainable_parameters_between_forward_and_backward_is_refused(change: str) -> None:
    """The backward's check reads the parameters of the modules the forward walked (one walk per micro-batch)
    at backward time: a parameter toggled or replaced after the forward is still seen."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    model[0].requires_grad_(False)
    with GhostClipper(model, 1.0) as clipper:
        loss = model(torch.randn(2, 3))[:, 0]
        if change == "toggle":
            model[0].requires_grad_(True)
        else:
            model[1].weight = nn.Parameter(model[1].weight.detach().clone())
        with pytest.raises(RuntimeError, match="trainable parameters of the model changed"):
            clipper.clipped_backward(loss)


def test_a_module_swapped_in_after_the_forward_is_refused_at_the_next_micro_batch() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    with GhostClipper(model, 1.0) as clipper:
        loss = model(torch.randn(2, 3))[:, 0]
        model[0] = nn.Linear(3, 3)  # ran in no forward yet: this backward reaches only the old one
        clipper.clipped_backward(loss)
        with pytest.raises(RuntimeError, match="trainable parameters of the model changed"):
            clipper.clipped_backward(model(torch.randn(2, 3))[:, 0])


def test_empty_batch_is_a_no_op() -> None:
    model = nn.Linear(3, 1)
    with GhostClipper(model, 1.0) as clipper:
        norms = clipper.clipped_backward(model(torch.randn(0, 3))[:, 0])
    assert norms.shape == (0,) and model.weight.grad is None


def test_zero_gradient_example_keeps_coefficient_one_and_no_nan() -> None:
    model = nn.Linear(3, 1, bias=False)
    x = torch.randn(3, 3)
    x[1] = 0.0  # zero input: zero gradient, norm 0
    with GhostClipper(model, 1.0) as clipper:
        norms = clipper.clipped_backward((model(x)[:, 0] - 1.0).pow(2))
    assert norms[1] == 0 and torch.isfinite(model.weight.grad).all()


def test_clip_coefficients_round_towards_zero() -> None:
    """A coefficient cast to float32 must never exceed min(1, C/||g||): that would exceed C."""
    with GhostClipper(nn.Linear(2, 2), max_norm=1.0) as clipper:
        norms = torch.rand(10_000, dtype=torch.float64) * 10 + 1e-3
        exact = torch.clamp(1.0 / norms, max=1.0)
        coef = clipper.clip_coefficients(norms, torch.float32)
    assert coef.dtype == torch.float32
    assert (coef.double() <= exact).all()
    ulp = torch.nextafter(coef, torch.full_like(coef, 2.0)) - coef
    assert ((exact - coef.double()) <= ulp.double()).all()
    assert (coef[norms <= 1.0] == 1.0).all()


def test_logs_carry_no_gradient_values(caplog) -> None:
    torch.manual_seed(0)
    model = Zoo()
    ids, target = zoo_batch()
    with caplog.at_level(logging.DEBUG, logger="hush_hf"), GhostClipper(model, 1.0) as clipper:
        norms = clipper.clipped_backward(zoo_loss(model(ids), target))
    text = caplog.text
    assert "GhostClipper hooked" in text  # something is logged ...
    for n in norms.tolist():  # ... but no per-example statistic
        assert f"{n:.3g}" not in text and f"{n:.3f}" not in text


def test_rule_registered_by_name_must_be_that_very_class() -> None:
    """A look-alike class carrying a registered qualified name does not get the rule."""
    look_alike = type("Conv1D", (nn.Module,), {"__module__": "transformers.pytorch_utils"})
    layer = look_alike()
    layer.weight = nn.Parameter(torch.zeros(2, 2))
    assert rule_for(look_alike) is None
    from transformers.pytorch_utils import Conv1D

    assert rule_for(Conv1D) is not None
    with GhostClipper(layer, 1.0) as clipper:  # planned on the generic path, not Conv1D's rule
        assert [hooked.rule for hooked in clipper._layers] == [rules_generic.GENERIC_RULE]


class FeatureScale(nn.Module):
    """y = x * s with a learned per-feature scale s: no built-in rule."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale


@register_norm_rule(FeatureScale)
def _feature_scale_grads(layer: FeatureScale, x: Tensor, g: Tensor) -> dict[str, Materialized]:
    return {"scale": Materialized((x * g).reshape(x.shape[0], -1, x.shape[-1]).sum(1))}


def test_a_registered_rule_extends_the_clipper() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), FeatureScale(6), nn.Tanh(), nn.Linear(6, 1))
    x = torch.randn(5, 3, 4)
    grads = per_example_grads(model, {"input": x}, lambda out: out.sum((1, 2)))
    with GhostClipper(model, 1.0) as clipper:
        norms = clipper.per_example_norms(model(x).sum((1, 2)))
    assert rel_err(norms, norms_of(grads)) <= RTOL
    with pytest.raises(ValueError, match="register target"):
        register_norm_rule(FeatureScale.forward)
