"""Independent per-example gradient reference (torch.func) and tiny HF models, shared by the clipping tests.

The reference never touches hush_hf.clipping: per-example gradients come from
``vmap(grad(...))`` over one-hot example selectors on a ``functional_call`` of the model, i.e. the
exact gradient of each loss_i of the *batched* forward (padding included) w.r.t. every trainable
parameter. Tied parameters appear once in ``named_parameters`` and ``functional_call`` keeps them
tied, so a tied weight is one parameter with the summed gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

VOCAB, SEQ, BATCH, HIDDEN = 120, 12, 4, 32


def per_example_grads(
    model: nn.Module,
    kwargs: Mapping[str, Tensor],
    loss_of_output: Callable[[object], Tensor],
    params: Mapping[str, Tensor] | None = None,
    tie_weights: bool = True,
) -> dict[str, Tensor]:
    """{name: (b, *shape)} per-example gradients of loss_of_output(model(**kwargs)) over trainable params."""
    if params is None:
        params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}

    def selected_loss(p: dict[str, Tensor], selector: Tensor) -> Tensor:
        out = functional_call(model, p, (), dict(kwargs), tie_weights=tie_weights)
        return (loss_of_output(out) * selector).sum()

    b = next(iter(kwargs.values())).shape[0]
    return vmap(grad(selected_loss), in_dims=(None, 0))(dict(params), torch.eye(b, dtype=torch.float64))


def norms_of(grads: Mapping[str, Tensor]) -> Tensor:
    """Per-example L2 norm over all parameters, in float64."""
    return torch.sqrt(sum(g.reshape(g.shape[0], -1).double().pow(2).sum(1) for g in grads.values()))


def clipped_sum(grads: Mapping[str, Tensor], max_norm: float) -> dict[str, Tensor]:
    """sum_i min(1, C/||g_i||) g_i for every parameter, in float64."""
    coef = torch.clamp(max_norm / norms_of(grads), max=1.0)
    return {n: torch.einsum("b,b...->...", coef, g.double()) for n, g in grads.items()}


def reference_lm_loss(logits: Tensor, labels: Tensor, causal: bool) -> Tensor:
    """Independent per-example mean token cross-entropy (0 for an example with no target), in float32 at
    least (float64 logits stay float64)."""
    if causal:
        logits, labels = logits[:, :-1], labels[:, 1:]
    wide = logits.transpose(1, 2).to(torch.promote_types(logits.dtype, torch.float32))
    token = F.cross_entropy(wide, labels, ignore_index=-100, reduction="none")
    return token.sum(1) / (labels != -100).sum(1).clamp_min(1)


# ----------------------------------------------------------------------------- tiny HF models
def tiny_gpt2(seed: int = 0) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=VOCAB, n_embd=HIDDEN, n_layer=2, n_head=2, n_positions=32, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2, attn_implementation="eager",
    )  # fmt: skip
    return GPT2LMHeadModel(cfg).train()


def tiny_bert(seed: int = 0) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=0, attn_implementation="eager",
    )  # fmt: skip
    return BertForMaskedLM(cfg).train()


def tiny_gemma2(seed: int = 0) -> nn.Module:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(seed)
    cfg = Gemma2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, attn_implementation="eager",
    )  # fmt: skip
    return Gemma2ForCausalLM(cfg).train()


MODELS = {"gpt2": (tiny_gpt2, True), "bert": (tiny_bert, False), "gemma2": (tiny_gemma2, True)}
TIED = {
    "gpt2": ("transformer.wte.weight", "lm_head.weight"),
    "bert": ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"),
    "gemma2": ("model.embed_tokens.weight", "lm_head.weight"),
}


def lm_batch(
    causal: bool, seed: int = 1, batch: int = BATCH, *, vocab: int = VOCAB, seq: int = SEQ
) -> tuple[dict[str, Tensor], Tensor]:
    """Right-padded batch (pad id 0, attention_mask 0, label -100), (b, T) contiguous position_ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, -5:] = 0
    mask[batch - 1, -2:] = 0
    ids[mask == 0] = 0
    labels = ids.masked_fill(mask == 0, -100)
    if not causal:  # masked LM: predict about half the real tokens
        labels[torch.rand(batch, seq, generator=g) < 0.5] = -100
        labels[0, 0] = ids[0, 0]
    position_ids = torch.arange(seq).expand(batch, seq).contiguous()
    return {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids}, labels


# ----------------------------------------------------------------------------- tests of the reference
def test_reference_matches_closed_form_for_least_squares() -> None:
    """loss_i = (w.x_i + c - y_i)^2 / 2: g_i = r_i (x_i, 1), ||g_i|| = |r_i| sqrt(||x_i||^2 + 1)."""
    torch.manual_seed(0)
    layer = nn.Linear(5, 1).double()
    x, y = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    grads = per_example_grads(layer, {"input": x}, lambda out: 0.5 * (out[:, 0] - y) ** 2)
    r = (layer(x)[:, 0] - y).detach()
    expected = r.abs() * torch.sqrt(x.pow(2).sum(1) + 1)
    torch.testing.assert_close(norms_of(grads), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reference_sums_to_the_batch_gradient(name: str) -> None:
    """sum_i g_i equals autograd's gradient of sum_i loss_i (tied weights as one parameter)."""
    make, causal = MODELS[name]
    model = make()
    kwargs, labels = lm_batch(causal)
    grads = per_example_grads(model, kwargs, lambda out: reference_lm_loss(out.logits, labels, causal))
    reference_lm_loss(model(**kwargs).logits, labels, causal).sum().backward()
    named = dict(model.named_parameters())
    assert TIED[name][1] not in grads  # the tied output weight is not a separate parameter
    for n, g in grads.items():
        torch.testing.assert_close(g.sum(0), named[n].grad, rtol=1e-4, atol=1e-6)
