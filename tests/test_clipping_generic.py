"""The generic torch.func path and what stays refused: layers without a rule are exact through their
own forward (several inputs, outputs shared by the batch), randomness inside such a layer and batch
folds nobody declared are refused; T5's batch-shared relative position bias is exact per example, and
so is UMT5's, computed inside every self-attention from its own table."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from hush_hf.clipping import GhostClipper, UnsupportedLayerError
from hush_hf.clipping.ghost import CLIP_MARGINS
from tests.test_clipping_reference import clipped_sum, norms_of, per_example_grads


class Positions(nn.Module):
    """Learned positions from a mask, called with two inputs; shared (1, T, d) when ``shared``."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(16, 4, dtype=torch.float64))
        self.shared = shared

    def forward(self, mask: Tensor, offset: int = 0) -> Tensor:
        if self.shared:
            return self.table[torch.arange(mask.shape[1]) + offset][None]
        return self.table[(mask.cumsum(1) * mask + offset).long()]


class Model(nn.Module):
    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 4, dtype=torch.float64)
        self.pos = Positions(shared)
        self.out = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        h = self.emb(ids) + self.pos(mask, offset=1)
        return self.out(torch.tanh(h)).pow(2).sum((1, 2))


@pytest.mark.parametrize("shared", [False, True], ids=["per-row", "shared-by-batch"])
def test_generic_path_is_exact_for_layers_with_several_inputs(shared: bool) -> None:
    torch.manual_seed(0)
    model = Model(shared)
    ids = torch.randint(0, 20, (5, 6))
    mask = torch.ones(5, 6, dtype=torch.long)
    mask[1, -2:] = 0
    expected = norms_of(per_example_grads(model, {"ids": ids, "mask": mask}, lambda out: out))
    with GhostClipper(model, 1.0) as clipper:
        norms = clipper.per_example_norms(model(ids, mask))
    torch.testing.assert_close(norms, expected, rtol=1e-10, atol=0)


class Adapted(nn.Module):
    """A PEFT-like layer: a trainable Linear it calls, and per-adapter scales in a ParameterDict it reads
    directly (never called, like IA3's ``ia3_l``)."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(4, 4, dtype=torch.float64)
        self.scales = nn.ParameterDict({"a": nn.Parameter(torch.linspace(0.5, 1.5, 4, dtype=torch.float64))})

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) * self.scales["a"]


def test_parameters_in_a_parameter_dict_are_covered_by_the_module_that_reads_them() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Adapted(), nn.Tanh(), nn.Linear(4, 2, dtype=torch.float64))
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    grads = per_example_grads(model, {"input": x}, lambda out: out.pow(2).sum((1, 2)))
    with GhostClipper(model, 0.3) as clipper:
        planned = {layer.path: layer.param_names for layer in clipper._layers}
        norms = clipper.clipped_backward(model(x).pow(2).sum((1, 2)))
    assert planned == {"0": ("scales.a",), "0.base": ("weight", "bias"), "2": ("weight", "bias")}
    torch.testing.assert_close(norms, norms_of(grads), rtol=1e-10, atol=0)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, clipped_sum(grads, 0.3)[name], rtol=1e-10, atol=1e-14)


class NoisyScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.dropout(x, 0.5, training=True) * self.scale


def test_randomness_inside_a_rule_less_layer_is_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 4), NoisyScale())
    with GhostClipper(model, 1.0) as clipper:
        loss = model(torch.randn(3, 4)).sum(1)
        with pytest.raises(UnsupportedLayerError, match=r"NoisyScale failed: its forward draws random"):
            clipper.per_example_norms(loss)


class Folding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.lin(x.reshape(-1, 4)).view(x.shape)


def test_an_undeclared_batch_fold_is_refused() -> None:
    model = Folding()
    with GhostClipper(model, 1.0) as clipper:
        loss = model(torch.randn(3, 5, 4)).sum((1, 2))
        with pytest.raises(ValueError, match="ran on a batch of 15 but per_example_loss has 3"):
            clipper.per_example_norms(loss)


def tiny_t5(cls: str = "T5ForConditionalGeneration", config: str = "T5Config") -> nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, config)(
        vocab_size=40, d_model=8, d_kv=4, d_ff=16, num_layers=2, num_heads=2, dropout_rate=0.0,
        pad_token_id=0, decoder_start_token_id=0, eos_token_id=1,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    return getattr(transformers, cls)(cfg).train().double()


def seq2seq_batch() -> tuple[dict[str, Tensor], Tensor]:
    g = torch.Generator().manual_seed(3)
    ids, labels = torch.randint(3, 40, (4, 9), generator=g), torch.randint(3, 40, (4, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # a padded row: its scores see other keys, its bias gradient other buckets
    labels[2, -2:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}, labels


def seq2seq_loss(logits: Tensor, labels: Tensor) -> Tensor:
    token = nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    return token.sum(1) / (labels != -100).sum(1)


@pytest.mark.parametrize(
    ("cls", "config", "tables_count"),
    [("T5ForConditionalGeneration", "T5Config", 2), ("UMT5ForConditionalGeneration", "UMT5Config", 4)],
    ids=["T5", "UMT5"],
)
def test_trainable_relative_position_bias_is_exact(cls: str, config: str, tables_count: int) -> None:
    """T5's bias table is looked up with (query, key) buckets the batch shares and the (1, heads, q, k)
    bias is added to the scores of every attention of its stack; each example's table gradient is its
    own score gradients gathered by bucket (the encoder's and the decoder's table, all layers). UMT5:
    every self-attention has its own table and computes its bias itself (``compute_bias``), which
    returns the bias handed in for that call only."""
    model = tiny_t5(cls, config)
    kwargs, labels = seq2seq_batch()
    tables = [n for n, _ in model.named_parameters() if "relative_attention_bias" in n]
    assert len(tables) == tables_count  # trainable
    grads = per_example_grads(model, kwargs, lambda out: seq2seq_loss(out.logits, labels))
    max_norm = float(norms_of(grads).median())
    # T5's layer norm takes its variance in float32, so the clipper clips with float32's margin
    # (``graph_dtypes.graph_dtypes``): C (1 - 2^-20).
    expected = clipped_sum(grads, max_norm * (1 - CLIP_MARGINS[torch.float32]))
    with GhostClipper(model, max_norm) as clipper:
        norms = clipper.clipped_backward(seq2seq_loss(model(**kwargs).logits, labels))
        assert clipper.verified
    torch.testing.assert_close(norms, norms_of(grads), rtol=1e-10, atol=0)
    assert not [m for m in model.modules() if "compute_bias" in vars(m)]  # UMT5's handed-in bias is gone
    for name in tables:  # the tables' own share of the norm is not negligible
        assert float(norms_of({name: grads[name]}).max()) > 1e-3 * float(norms_of(grads).max())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-8, atol=1e-14)


def test_a_handed_in_bias_is_withdrawn_when_the_call_raises() -> None:
    """UMT5's ``compute_bias`` answers the clipper's bias during one call; if that call fails before it
    asks (here in its query projection), the attention computes its own bias again afterwards."""
    model = tiny_t5("UMT5ForConditionalGeneration", "UMT5Config")
    attention = model.encoder.block[0].layer[0].SelfAttention
    kwargs, _ = seq2seq_batch()

    def fail(*_: object) -> None:
        raise RuntimeError("boom")

    with GhostClipper(model, 1.0):
        failing = attention.q.register_forward_hook(fail)
        with pytest.raises(RuntimeError, match="boom"):
            model(**kwargs)
        failing.remove()
        assert "compute_bias" not in vars(attention)
    assert attention.compute_bias(5, 5).shape == (1, 2, 5, 5)  # its own, not the batch's (4, 2, 9, 9)
