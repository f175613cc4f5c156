"""What PEFT methods the engine refuses, before any training, and why (their exactness when accepted --
LoRA, DoRA, IA3, VeRA, trainable tokens -- is tested through the trainer in tests/test_model_families.py)."""

from __future__ import annotations

import pytest
import torch

from hush_hf.clipping import GhostClipper, UnsupportedLayerError
from tests.model_families import TRAINABLE_TOKENS, family_named


def llama_with(config: str, **kwargs):
    import peft

    model = family_named("Llama").build(True)
    torch.manual_seed(1)
    return peft.get_peft_model(model, getattr(peft, config)(**kwargs))


@pytest.mark.parametrize(
    ("config", "method"),
    [("LoHaConfig", "LoHa"), ("LoKrConfig", "LoKr")],
)
def test_lycoris_adapters_are_refused_at_construction_naming_the_method(config: str, method: str) -> None:
    model = llama_with(config, r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    refusal = rf"q_proj.*PEFT {method} is not supported.*random numbers"
    with pytest.raises(UnsupportedLayerError, match=refusal):
        GhostClipper(model, 1.0)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_dropout_inside_an_adapter_on_the_generic_path_is_refused_at_construction() -> None:
    """VeRA's layer is one generic replay, which cannot redraw its dropout mask: refused, with the fix."""
    model = llama_with("VeraConfig", r=4, target_modules=["q_proj", "v_proj"], vera_dropout=0.1)
    refusal = r"dropout with p > 0 at 'vera_dropout\.default'.*set that"
    with pytest.raises(UnsupportedLayerError, match=refusal):
        GhostClipper(model, 1.0)


def test_trainable_tokens_with_a_trainable_wrapped_layer_are_refused() -> None:
    """The adapter reads its wrapped embedding's weight directly; trained too, no rule covers it."""
    model = llama_with("TrainableTokensConfig", target_modules=["embed_tokens"],
                       token_indices=TRAINABLE_TOKENS)  # fmt: skip
    GhostClipper(model, 1.0).remove()
    model.get_input_embeddings().base_layer.weight.requires_grad_(True)
    with pytest.raises(UnsupportedLayerError, match=r"\['base_layer\.weight'\] are trainable beside"):
        GhostClipper(model, 1.0)
