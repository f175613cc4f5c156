"""The clip margin follows the precision the backward actually computes in (``graph_dtypes.graph_dtypes``).

MPT and GPT-J, in float64, run part of their attention in float32: with float64's margin (2^-49) their
clipped sums moved by more than C against the per-example reference (1 + 1.9e-10 C and 1 + 9.2e-13 C,
issue 30), float32 rounding that a 2^-49 margin cannot absorb. Here, one example per batch (the applied
gradient is then that example's c_i g_i), several draws: the clipper takes float32's margin (2^-20) for
them, so ||c_i g_i|| <= C (1 - 2^-21) (with float64's it is C (1 - 2^-49)). A float64 model computing in
float64 only (GPT-2; Llama's eager softmax runs in float32) keeps float64's margin.
"""

from __future__ import annotations

import pytest
import torch

from hush_hf.clipping import GhostClipper, example_cross_entropy
from hush_hf.clipping.ghost import CLIP_MARGINS
from hush_hf.clipping.graph_dtypes import graph_dtypes
from tests.model_families import HIDDEN, VOCAB, _hf, family_named
from tests.test_trainer_helpers import single_thread  # noqa: F401  (autouse fixture)

CLIP = 1e-3

_MPT = _hf("MptConfig", "MptForCausalLM", vocab_size=VOCAB, d_model=HIDDEN, n_heads=2, n_layers=2,
           max_seq_len=64, expansion_ratio=2, resid_pdrop=0.0, emb_pdrop=0.0)  # fmt: skip
_GPTJ = _hf("GPTJConfig", "GPTJForCausalLM", vocab_size=VOCAB, n_embd=HIDDEN, n_head=2, n_layer=2,
            n_positions=64, rotary_dim=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip


def applied_norms(model, draws: int) -> tuple[list[float], set[torch.dtype]]:
    out = []
    with GhostClipper(model, CLIP) as clipper:
        for seed in range(draws):
            ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(seed))
            model.zero_grad(set_to_none=True)
            logits = model(input_ids=ids).logits
            loss = example_cross_entropy(logits, ids, causal=True)
            computed = graph_dtypes(loss)
            norm = clipper.clipped_backward(loss)
            assert float(norm[0]) > 10 * CLIP  # clipped
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            out.append(float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads))))
    return out, computed


@pytest.mark.parametrize("build", [_MPT, _GPTJ], ids=["MPT", "GPT-J"])
def test_float64_models_computing_partly_in_float32_stay_within_c(build):
    model = build(False).double()
    norms, computed = applied_norms(model, draws=6)
    assert torch.float32 in computed and torch.float64 in computed
    assert max(norms) <= CLIP * (1 - CLIP_MARGINS[torch.float32] / 2)  # float32's margin taken
    assert min(norms) >= CLIP * (1 - 4 * CLIP_MARGINS[torch.float32])  # clipped to C (1 - 2^-20), not less


def test_a_model_computing_in_float64_only_keeps_the_float64_margin():
    model = family_named("GPT-2").build(False).double()  # (Llama: float32 softmax)
    norms, computed = applied_norms(model, draws=2)
    assert computed == {torch.float64}
    assert max(norms) <= CLIP
    assert min(norms) >= CLIP * (1 - 1e-12)  # float32's margin (2^-20 = 9.5e-7) would show here
