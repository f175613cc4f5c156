"""What GhostClipper refuses rather than under-clip: parameters read outside their layer's call (the
self-check), rounding under bf16 (the clip margin), and modules that couple the examples of a batch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import hush_hf.clipping.ghost as ghost
from hush_hf.clipping import GhostClipper, UnsupportedLayerError, example_cross_entropy, precision, registry
from tests.test_clipping_engine import Zoo, zoo_batch, zoo_loss
from tests.test_clipping_reference import lm_batch, tiny_gpt2


def grad_norm(model: nn.Module) -> float:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))


# ----------------------------------------------------------------------------- direct parameter uses
class FunctionalTie(nn.Module):
    """Output projection tied to the embedding but applied as ``h @ emb.weight.T`` (no module call)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.ln = nn.LayerNorm(8)

    def forward(self, ids: Tensor) -> Tensor:
        return self.ln(self.emb(ids)) @ self.emb.weight.T


class FunctionalLinear(nn.Module):
    """``proj`` is called once as a module and its weight is used again by ``F.linear``; ``head``
    is never called (its weight is only read)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 20)

    def forward(self, ids: Tensor) -> Tensor:
        h = torch.tanh(self.proj(self.emb(ids)))
        h = torch.tanh(F.linear(h, self.proj.weight, self.proj.bias))
        return F.linear(h, self.head.weight)


def lm_loss(logits: Tensor, ids: Tensor) -> Tensor:
    return example_cross_entropy(logits, ids, causal=True)


IDS = torch.randint(0, 20, (3, 5), generator=torch.Generator().manual_seed(0))


def test_direct_use_under_clips_without_the_check() -> None:
    """Why the check exists: the recorded uses miss ``h @ emb.weight.T``, so the norm is too small."""
    torch.manual_seed(0)
    model = FunctionalTie()
    true_norms = []
    for i in range(IDS.shape[0]):
        model.zero_grad()
        lm_loss(model(IDS[i : i + 1]), IDS[i : i + 1]).sum().backward()
        true_norms.append(grad_norm(model))
    model.zero_grad()
    clipper = GhostClipper(model, 1.0)
    clipper._unverified.clear()  # skip the self-check
    norms = clipper.per_example_norms(lm_loss(model(IDS), IDS))
    clipper.remove()
    assert (norms < 0.99 * torch.tensor(true_norms, dtype=torch.float64)).all()


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("call", ["clipped_backward", "per_example_norms"])
def test_parameter_used_outside_its_module_is_refused(call: str, autocast: bool) -> None:
    torch.manual_seed(0)
    model = FunctionalTie()
    held = torch.full_like(model.emb.weight, 0.5)
    model.emb.weight.grad = held.clone()  # an earlier micro-batch's clipped sum
    with GhostClipper(model, 0.01) as clipper:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = lm_loss(model(IDS), IDS)
        with pytest.raises(UnsupportedLayerError, match=r"'emb\.weight'.*used outside its module's forward"):
            getattr(clipper, call)(loss)
        # Nothing of the refused call reached p.grad, and the clipper keeps refusing.
        torch.testing.assert_close(model.emb.weight.grad, held, rtol=0, atol=0)
        assert model.ln.weight.grad is None
        with pytest.raises(UnsupportedLayerError, match=r"'emb\.weight'"):
            clipper.clipped_backward(lm_loss(model(IDS), IDS))


def test_f_linear_on_a_module_weight_and_a_layer_that_never_ran_are_refused() -> None:
    torch.manual_seed(0)
    model = FunctionalLinear()
    with GhostClipper(model, 1.0) as clipper, pytest.raises(UnsupportedLayerError) as info:
        clipper.clipped_backward(lm_loss(model(IDS), IDS))
    message = str(info.value)
    assert "'proj.weight'" in message and "'proj.bias'" in message and "'head.weight'" in message
    assert "'head.weight' reached by the loss although no call of the layer owning it ran" in message
    assert "'emb.weight'" not in message  # only used through its own call: consistent
    assert all(p.grad is None for p in model.parameters())


def test_an_all_zero_gradient_call_does_not_pass_the_check() -> None:
    torch.manual_seed(0)
    model = FunctionalTie()
    with GhostClipper(model, 1.0) as clipper:
        clipper.clipped_backward(0.0 * lm_loss(model(IDS), IDS))  # nothing to compare yet
        with pytest.raises(UnsupportedLayerError, match=r"'emb\.weight'"):
            clipper.clipped_backward(lm_loss(model(IDS), IDS))


class RareToken(nn.Module):
    """``rare`` embeds token 7 only, and is read directly (``F.linear``) for it too: in a batch without
    token 7 both uses give it gradient 0, so that batch cannot show the direct use."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.rare = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 20)

    def forward(self, ids: Tensor) -> Tensor:
        hit = (ids == 7)[..., None].to(self.emb.weight.dtype)
        h = self.emb(ids) + hit * self.rare(ids)
        h = h + hit * F.linear(torch.tanh(h), self.rare.weight[:8])
        return self.head(torch.tanh(h))


def test_a_parameter_the_first_batch_does_not_touch_stays_checked() -> None:
    """Verification is per parameter: ``rare.weight`` has gradient 0 in the first batches, so they verify
    everything else but not it, and the first batch that reaches it with token 7 refuses its direct use
    (before, one check at the first call verified every parameter at once)."""
    torch.manual_seed(0)
    model = RareToken()
    without = IDS.masked_fill(IDS == 7, 8)
    with GhostClipper(model, 1.0) as clipper:
        for _ in range(2):
            clipper.clipped_backward(lm_loss(model(without), without))
            assert not clipper.verified
        assert clipper._unverified == {"rare.weight"}
        held = {n: p.grad.clone() for n, p in model.named_parameters()}
        with_token = without.clone()
        with_token[1, 2] = 7
        with pytest.raises(UnsupportedLayerError, match=r"trainable parameter\(s\) 'rare\.weight' differs"):
            clipper.clipped_backward(lm_loss(model(with_token), with_token))
    for name, p in model.named_parameters():  # nothing of the refused call was added
        assert torch.equal(p.grad, held[name]), name


def test_a_parameter_reached_without_a_call_is_refused_even_with_zero_gradient() -> None:
    """The structural half of the check: ``head`` never runs, its weight is read with a zero factor,
    so its gradient is exactly 0; reaching it at all is refused, at the first call."""

    class ZeroRead(FunctionalLinear):
        def __init__(self) -> None:
            super().__init__()
            self.out = nn.Linear(8, 20)

        def forward(self, ids: Tensor) -> Tensor:
            h = torch.tanh(self.proj(self.emb(ids)))
            return self.out(h) + 0.0 * F.linear(h, self.head.weight)

    torch.manual_seed(0)
    model = ZeroRead()
    with GhostClipper(model, 1.0) as clipper:
        loss = lm_loss(model(IDS), IDS)
        with pytest.raises(UnsupportedLayerError, match=r"'head\.weight' reached by the loss although no"):
            clipper.per_example_norms(loss)


def test_the_check_runs_once_then_each_step_is_one_backward_pass(monkeypatch) -> None:
    """First call: the pass for the norms plus the check's backward; later calls: one pass only
    (book-keeping, no second backward), and every call accumulates the same clipped sum."""
    torch.manual_seed(0)
    model = Zoo()  # every torch rule, multi-use weights, an unused layer
    ids, target = zoo_batch()
    passes = []
    original = torch.autograd.grad

    def counted(*args, **kwargs):
        passes.append(1)
        return original(*args, **kwargs)

    def no_backward(*args, **kwargs):
        raise AssertionError("clipped_backward must not call Tensor.backward")

    monkeypatch.setattr(torch.autograd, "grad", counted)
    monkeypatch.setattr(torch.Tensor, "backward", no_backward)
    with GhostClipper(model, 1.0) as clipper:
        clipper.clipped_backward(zoo_loss(model(ids), target))
        first = len(passes)
        first_grads = {n: p.grad for n, p in model.named_parameters()}
        first_grads = {n: g.clone() if g is not None else None for n, g in first_grads.items()}
        loss = zoo_loss(model(ids), target)
        clipper.clipped_backward(loss)
    assert first == 2 and len(passes) == 3
    assert first_grads["unused.weight"] is None and model.unused.weight.grad is None
    for n, p in model.named_parameters():  # the checked call accumulated like any other
        if first_grads[n] is not None:
            torch.testing.assert_close(p.grad, 2 * first_grads[n], rtol=1e-5, atol=1e-8)


def test_deberta_relative_position_table_is_counted_by_its_encoder_rule(monkeypatch) -> None:
    """DeBERTa-v2 reads ``rel_embeddings.weight`` directly (the review's reproduction): the encoder's rule
    counts it (``rules_deberta``) and the step passes the self-check; without that rule the embedding is
    never called, its gradient reaches no norm, and the self-check refuses the step, naming it."""
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM

    torch.manual_seed(0)
    cfg = DebertaV2Config(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        relative_attention=True, pos_att_type=["p2c", "c2p"], max_relative_positions=8, position_buckets=-1,
        norm_rel_ebd="none", position_biased_input=False, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, share_att_key=True,
    )  # fmt: skip
    model = DebertaV2ForMaskedLM(cfg).train()
    model.cls.predictions.bias.requires_grad_(False)
    ids = torch.randint(3, 50, (3, 6), generator=torch.Generator().manual_seed(0))

    def losses():
        return example_cross_entropy(model(input_ids=ids).logits, ids, causal=False)

    with GhostClipper(model, 1.0) as clipper:
        clipper.clipped_backward(losses())
        assert clipper.verified
    assert model.deberta.encoder.rel_embeddings.weight.grad.abs().max() > 0
    encoder = "transformers.models.deberta_v2.modeling_deberta_v2.DebertaV2Encoder"
    monkeypatch.delitem(registry._RULES, encoder)
    model.zero_grad()
    uncounted = r"'deberta\.encoder\.rel_embeddings\.weight'"
    with GhostClipper(model, 1.0) as clipper, pytest.raises(UnsupportedLayerError, match=uncounted):
        clipper.clipped_backward(losses())


# ----------------------------------------------------------------------------- rounding margin
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_applied_per_example_gradient_is_within_c(autocast: bool) -> None:
    """Each example alone (batch of 1): ||applied clipped gradient|| <= C. Without the margin the
    bf16 case exceeded C (by up to 0.09% here, 0.37% in the review) and float32 by ~6e-8."""
    torch.manual_seed(0)
    model = tiny_gpt2()
    kwargs, labels = lm_batch(causal=True)
    max_norm = 1e-3  # clips every example
    worst = 0.0
    with GhostClipper(model, max_norm) as clipper:
        for i in range(labels.shape[0]):
            model.zero_grad()
            one = {k: v[i : i + 1] for k, v in kwargs.items()}
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = example_cross_entropy(model(**one).logits, labels[i : i + 1], causal=True)
            norm = float(clipper.clipped_backward(loss)[0])
            assert norm > max_norm
            worst = max(worst, grad_norm(model) / max_norm)
    assert worst <= 1.0
    margin = ghost.CLIP_MARGINS[torch.bfloat16 if autocast else torch.float32]
    assert worst >= 1.0 - 2 * margin  # the margin costs little signal


def test_clip_coefficients_apply_the_margin() -> None:
    with GhostClipper(nn.Linear(2, 2), max_norm=2.0) as clipper:
        norms = torch.tensor([1.0, 1.99, 4.0], dtype=torch.float64)
        coef = clipper.clip_coefficients(norms, torch.float64, margin=0.01)
    torch.testing.assert_close(coef, torch.tensor([1.0, 1.98 / 1.99, 1.98 / 4.0], dtype=torch.float64))
    assert ghost.CLIP_MARGINS[torch.bfloat16] == 2.0**-6 and ghost.CLIP_MARGINS[torch.float32] == 2.0**-20


# ----------------------------------------------------------------------------- batch coupling
class Nested(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.block = nn.Sequential(nn.Identity(), norm)


@pytest.mark.parametrize(
    "norm",
    [
        nn.BatchNorm1d(4, affine=False),
        nn.BatchNorm1d(4, affine=False, track_running_stats=False),
        nn.SyncBatchNorm(4, affine=False),
        nn.InstanceNorm1d(4, track_running_stats=True),
    ],
    ids=["batchnorm", "batchnorm-no-running-stats", "syncbatchnorm", "instancenorm-running-stats"],
)
def test_modules_that_couple_examples_are_refused_without_parameters(norm: nn.Module) -> None:
    model = Nested(norm)
    with pytest.raises(UnsupportedLayerError, match=rf"'block\.1' \({type(norm).__name__}\)"):
        GhostClipper(model, 1.0)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    model.eval()  # eval mode does not help: Trainer puts the model back in train mode every step
    with pytest.raises(UnsupportedLayerError):
        GhostClipper(model, 1.0)


@pytest.mark.parametrize(
    "norm", [nn.GroupNorm(2, 4, affine=False), nn.InstanceNorm1d(4), nn.LayerNorm(4)], ids=str
)
def test_per_example_normalisations_are_accepted(norm: nn.Module) -> None:
    GhostClipper(Nested(norm), 1.0).remove()


# ----------------------------------------------------------------------------- reduced matmul precision
class SlightTie(nn.Module):
    """A Linear head plus a small direct use of the embedding, ``alpha * h @ emb.weight.T``: a misuse
    carrying a few percent of the gradient (``direct=False`` detaches it, for the reference)."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.ln = nn.LayerNorm(8)
        self.head = nn.Linear(8, 20)
        self.alpha = alpha

    def forward(self, ids: Tensor, direct: bool = True) -> Tensor:
        h = self.ln(self.emb(ids))
        weight = self.emb.weight if direct else self.emb.weight.detach()
        return self.head(h) + self.alpha * (h @ weight.T)


@pytest.fixture
def matmul_precision():
    """A setter of the float32 matmul precision for one test: ``"high"``/``"highest"`` through
    ``torch.set_float32_matmul_precision``, ``"allow_tf32"`` through the CUDA flag (settable without a
    GPU); both restored afterwards."""
    before, tf32 = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32

    def set_precision(setting: str) -> None:
        if setting == "allow_tf32":
            torch.backends.cuda.matmul.allow_tf32 = True
        else:
            torch.set_float32_matmul_precision(setting)

    yield set_precision
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.set_float32_matmul_precision(before)


def test_the_tolerance_follows_the_float32_matmul_precision(matmul_precision) -> None:
    assert not precision.reduced_float32_matmuls("cuda")
    assert precision.check_rtol(torch.float32, "cuda") == precision.CHECK_RTOL == 1e-4
    assert precision.check_rtol(torch.float64, "cpu") == 1e-4
    assert precision.check_rtol(torch.bfloat16, "cpu") == precision.CHECK_RTOL_REDUCED
    matmul_precision("allow_tf32")
    assert precision.reduced_float32_matmuls("cuda")
    assert precision.check_rtol(torch.float32, "cuda") == precision.CHECK_RTOL_REDUCED_MATMUL == 2.0**-6
    assert precision.check_rtol(torch.float64, "cuda") == 1e-4  # float64 products never use TF32
    assert precision.check_rtol(torch.bfloat16, "cuda") == precision.CHECK_RTOL_REDUCED
    torch.backends.cuda.matmul.allow_tf32 = False
    assert precision.check_rtol(torch.float32, "cuda") == 1e-4
    matmul_precision("high")  # what TrainingArguments(tf32=True) and --tf32 set
    assert (
        precision.check_rtol(torch.float32, "cpu") == precision.check_rtol(torch.float32, "cuda") == 2.0**-6
    )


def _direct_share(alpha: float) -> float:
    """||gradient of emb.weight through the direct use|| / sum_i ||g_i||: the self-check's gap over its
    scale, computed by brute force (per-example backward passes)."""
    torch.manual_seed(0)
    model = SlightTie(alpha)
    total = 0.0
    for i in range(IDS.shape[0]):
        model.zero_grad()
        lm_loss(model(IDS[i : i + 1]), IDS[i : i + 1]).sum().backward()
        total += grad_norm(model)
    model.zero_grad()
    lm_loss(model(IDS), IDS).sum().backward()
    full = model.emb.weight.grad.clone()
    model.zero_grad()
    lm_loss(model(IDS, direct=False), IDS).sum().backward()
    return float((full - model.emb.weight.grad).norm()) / total


@pytest.mark.parametrize("setting", ["high", "allow_tf32"])
def test_a_misuse_is_still_refused_under_tf32(setting: str, matmul_precision) -> None:
    """Under TF32 the self-check's tolerance widens to 2^-6 of sum_i ||c_i g_i||; a direct use carrying
    ~3% of it (which bf16's 2^-4 would let through) is still refused, and without it the model trains."""
    alpha = 0.06
    share = _direct_share(alpha)
    assert 1.5 * precision.CHECK_RTOL_REDUCED_MATMUL < share < precision.CHECK_RTOL_REDUCED / 1.5
    matmul_precision(setting)
    assert precision.check_rtol(torch.float32, "cpu") == precision.CHECK_RTOL_REDUCED_MATMUL
    torch.manual_seed(0)
    model = SlightTie(alpha)
    with GhostClipper(model, 1.0) as clipper, pytest.raises(UnsupportedLayerError, match=r"'emb\.weight'"):
        clipper.clipped_backward(lm_loss(model(IDS), IDS))
    torch.manual_seed(0)
    model = SlightTie(0.0)
    with GhostClipper(model, 1.0) as clipper:
        clipper.clipped_backward(lm_loss(model(IDS), IDS))
        assert clipper.verified


def test_tf32_takes_the_bf16_clip_margin(matmul_precision) -> None:
    """A float32 step with reduced-precision products rounds its norms like a bf16 one: bf16's margin."""
    norms = torch.ones(2, dtype=torch.float64)
    result = ghost._Pass(norms, {}, torch.float32, {}, device_type="cpu")
    assert result.margin == ghost.CLIP_MARGINS[torch.float32]
    matmul_precision("high")
    assert result.margin == ghost.CLIP_MARGINS[torch.bfloat16]
    assert ghost._Pass(norms, {}, torch.float64, {}).margin == ghost.CLIP_MARGINS[torch.float64]
