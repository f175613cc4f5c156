"""LayerDrop (M2M100, NLLB-MoE, SeamlessM4T) and PEFT prompt learning.

LayerDrop skips each encoder/decoder layer of a training forward with probability p (transformers draws one
``torch.rand([])`` per layer per forward, the same skip for every row of the batch). The draws are
independent of the data, so each example's clipped gradient is a function of that example and of noise no
secret influences: C bounds it given the draws, hence the Gaussian mechanism's guarantee holds for every
draw and so for their mixture. What must hold is exactness given the draws: here the clipper's norms and
clipped sum equal per-example autograd on the same batched forward (same seed, so the same skipped layers),
with layers actually skipped. The one-step family test (torch.func, each example alone) cannot compare:
alone, an example's forward draws other skips.

Prompt tuning and P-tuning are refused with the reason; AdaptionPrompt is exact (tests/model_families.py).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hush_hf.clipping import GhostClipper, UnsupportedLayerError, example_cross_entropy
from tests.model_families import _LLAMA, HIDDEN, VOCAB, _peft
from tests.test_trainer_helpers import single_thread  # noqa: F401  (autouse fixture)

N, CLIP = 4, 1e-3


def m2m100(layerdrop: float) -> nn.Module:
    import transformers

    config = transformers.M2M100Config(
        vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=3, decoder_layers=3, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=2, encoder_layerdrop=layerdrop, decoder_layerdrop=layerdrop,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.M2M100ForConditionalGeneration(config).double().train()


def per_example_losses(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return example_cross_entropy(model(input_ids=ids, labels=labels).logits, labels, causal=False)


def test_layerdrop_is_exact_given_the_layers_the_batch_skipped():
    model = m2m100(0.5)
    g = torch.Generator().manual_seed(3)
    ids, labels = torch.randint(3, VOCAB, (N, 9), generator=g), torch.randint(3, VOCAB, (N, 6), generator=g)
    layers = [*model.model.encoder.layers, *model.model.decoder.layers]
    ran: list[nn.Module] = []
    hooks = [layer.register_forward_hook(lambda m, *_: ran.append(m)) for layer in layers]

    torch.manual_seed(11)
    losses = per_example_losses(model, ids, labels)
    params = ps = [p for p in model.parameters() if p.requires_grad]
    grads = [torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True) for loss in losses]
    grads = [[torch.zeros_like(p) if d is None else d for d, p in zip(gs, ps, strict=True)] for gs in grads]
    norms = torch.stack([torch.sqrt(sum(d.pow(2).sum() for d in gs)) for gs in grads])
    skipped_by_reference = {id(m) for m in layers} - {id(m) for m in ran}
    assert 0 < len(skipped_by_reference) < len(layers)  # seed 11 skips some layers, not all

    ran.clear()
    with GhostClipper(model, CLIP) as clipper:
        torch.manual_seed(11)
        got = clipper.clipped_backward(per_example_losses(model, ids, labels))
    for hook in hooks:
        hook.remove()
    assert {id(m) for m in layers} - {id(m) for m in ran} == skipped_by_reference  # the same draws
    torch.testing.assert_close(got, norms, rtol=1e-10, atol=0)
    coef = (CLIP * (1 - 2.0**-49) / norms).clamp(max=1.0)
    untouched = 0
    for k, p in enumerate(params):
        expected = sum(c * gs[k] for c, gs in zip(coef, grads, strict=True))
        if p.grad is None:  # a skipped layer's parameter: no gradient at all, as with a plain backward
            assert not expected.any()
            untouched += 1
            continue
        torch.testing.assert_close(p.grad, expected, rtol=1e-9, atol=1e-12 * CLIP)
    assert untouched > 0


@pytest.mark.parametrize(
    ("config", "kwargs", "method"),
    [
        ("PromptTuningConfig", {"num_virtual_tokens": 3}, "prompt tuning"),
        ("PromptEncoderConfig", {"num_virtual_tokens": 3, "encoder_hidden_size": 8}, "P-tuning"),
    ],
)
def test_prompt_tuning_and_p_tuning_are_refused_with_the_reason(config, kwargs, method):
    model = _peft(_LLAMA, config, task_type="CAUSAL_LM", **kwargs)(True)
    with pytest.raises(
        UnsupportedLayerError,
        match=rf"'prompt_encoder\.default'.*PEFT {method} computes the virtual prompt once per batch",
    ):
        GhostClipper(model, 1.0)
