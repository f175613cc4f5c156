"""The experts calls the engine runs itself (``hush_hf.clipping.experts_capture``): transformers' default
``grouped_mm`` experts, whose rule reads the rows, the gate's output and the gradient at the up projection
from the forward and the backward instead of replaying the call. In float64 against per-example autograd
through transformers' own eager expert loop (the same weights; an independent forward), with and without
gradient checkpointing; the model's output unchanged; no replay product run; other implementations left
to the class's forward.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from hush_hf.clipping import GhostClipper, example_cross_entropy, rules_moe
from hush_hf.clipping.experts_capture import OwnForward, takes_over
from tests.test_clipping_moe import batch_of, build, clipped_steps, reference
from tests.test_trainer_helpers import single_thread  # noqa: F401  (autouse fixture)

# Mixtral: gated, (E, out, in); Qwen2-MoE: shared experts beside; DeepSeek-V3: float32 router, groups;
# GPT-OSS: transposed (E, in, out) weights with biases and its own interleaved, clamped gate.
FAMILIES = ["Mixtral", "Qwen2-MoE", "DeepSeek-V3", "GPT-OSS"]


def experts_of(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("Experts")]


def eager_reference(model: nn.Module, ids: Tensor, clip: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-example norms and clipped sum through transformers' eager expert loop (then back to grouped_mm)."""
    model.config._experts_implementation = "eager"
    try:
        return reference(model, ids, clip)
    finally:
        model.config._experts_implementation = "grouped_mm"


def no_replay(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the rule's replay products (``rules_moe._grouped``)."""
    calls: list[int] = []
    replayed = rules_moe._grouped

    def counted(*args, **kwargs):
        calls.append(1)
        return replayed(*args, **kwargs)

    monkeypatch.setattr(rules_moe, "_grouped", counted)
    return calls


def assert_matches(model: nn.Module, got: Tensor, norms: Tensor, expected: dict[str, Tensor]) -> None:
    torch.testing.assert_close(got, norms, rtol=1e-10, atol=0)
    named = dict(model.named_parameters())
    for name, value in expected.items():
        torch.testing.assert_close(named[name].grad, value, rtol=1e-9, atol=1e-12, msg=name)
    assert all(
        float(named[n].grad.abs().sum()) > 0 for n, p in named.items() if p.dim() == 3 and p.requires_grad
    )


def two_steps_match(model, ids, clip, norms, expected, monkeypatch, *, replayed: bool = False) -> None:
    """Two clipped steps, each verified and equal to the reference; a replay product runs iff ``replayed``."""
    replays = no_replay(monkeypatch)
    for got in clipped_steps(model, ids, clip):
        assert_matches(model, got, norms, expected)
    assert bool(replays) == replayed


@pytest.mark.parametrize("name", FAMILIES)
def test_grouped_mm_experts_read_from_the_step_match_per_example_autograd_in_float64(name, monkeypatch):
    """Float64 (torch's grouped_mm has no float64 kernel: the products run through transformers' per-expert
    fallback), clip at the median norm so some examples are clipped and others not, two steps (the first
    with the self-check): norms to 1e-10 and the clipped sum to 1e-9 of the eager loop's per-example
    autograd, and the rule never replays a product."""
    model = build(name).double()
    assert all(takes_over(m) for m in experts_of(model))
    ids = batch_of()
    norms, _ = eager_reference(model, ids, 1.0)
    clip = float(norms.median())
    norms, expected = eager_reference(model, ids, clip)
    model.zero_grad(set_to_none=True)
    two_steps_match(model, ids, clip, norms, expected, monkeypatch)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("name", ["Mixtral", "GPT-OSS"])
def test_checkpointed_grouped_mm_experts_report_from_both_passes(name, reentrant, monkeypatch):
    """Gradient checkpointing: the rows and the gate output are saved by the call's own nodes (recomputed
    with the segment), the gradients at the two projections arrive in each of the two backward passes;
    norms and clipped sum equal the eager loop's per-example autograd without checkpointing, no replay."""
    model = build(name).double()
    ids = batch_of()
    norms, _ = eager_reference(model, ids, 1.0)
    clip = float(norms.median())
    norms, expected = eager_reference(model, ids, clip)
    model.zero_grad(set_to_none=True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    two_steps_match(model, ids, clip, norms, expected, monkeypatch)


def test_the_engines_run_of_the_experts_returns_what_transformers_returns():
    """Float32, grouped_mm kernel: the model's logits and the output gradient of the input equal those of
    transformers' own forward (the same products, rows in another order within an expert)."""
    model = build("GPT-OSS").float()
    ids = batch_of()

    def run() -> tuple[Tensor, Tensor]:
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeds).logits
        (grad,) = torch.autograd.grad(logits.square().sum(), embeds)
        return logits.detach(), grad

    plain = run()
    with GhostClipper(model, 1.0) as clipper:
        own = run()
        clipper.reset()
        assert all(isinstance(m.__dict__.get("forward"), OwnForward) for m in experts_of(model))
    torch.testing.assert_close(own[0], plain[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(own[1], plain[1], rtol=1e-5, atol=1e-6)
    assert all("forward" not in m.__dict__ for m in experts_of(model))  # removed with the clipper


def test_a_deep_copy_of_an_attached_model_runs_transformers_forward():
    """A reference model copied from an attached one (``copy.deepcopy``) is not attached: its experts run
    their class's forward and the copy computes what the original computes."""
    import copy

    model = build("Mixtral").float()
    ids = batch_of()
    with GhostClipper(model, 1.0):
        twin = copy.deepcopy(model)
        assert all(not isinstance(m.__dict__.get("forward"), OwnForward) for m in experts_of(twin))
        with torch.no_grad():
            torch.testing.assert_close(twin(input_ids=ids).logits, model(input_ids=ids).logits)


def test_other_expert_implementations_run_the_class_forward_and_are_replayed(monkeypatch):
    """The eager loop (and any implementation but transformers' grouped_mm) is not taken over: the rule
    replays the call, as before."""
    model = build("Mixtral", eager=True).double()
    assert not any(takes_over(m) for m in experts_of(model))
    ids = batch_of()
    norms, expected = reference(model, ids, 0.05)
    model.zero_grad(set_to_none=True)
    replays = no_replay(monkeypatch)
    with GhostClipper(model, 0.05) as clipper:
        got = clipper.clipped_backward(example_cross_entropy(model(input_ids=ids).logits, ids, causal=True))
    assert_matches(model, got, norms, expected)
    assert replays


def test_a_models_copy_of_llamas_rms_norm_takes_its_rule_without_llama_imported():
    """In a fresh process that imports only Mixtral's module (as a Mixtral training run does), Mixtral's
    RMSNorm (Llama's forward, copied) gets Llama's rule, not the generic torch.func path: the registry
    imports the module of the class that only the model prefix tells apart, then matches by code. A class
    with another forward stays without a rule."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from transformers.models.mixtral import modeling_mixtral as m\n"
        "from hush_hf.clipping.registry import rule_for\n"
        "from hush_hf.clipping.rules_rms_norm import llama_rms_norm_grads\n"
        "llama = 'transformers.models.llama.modeling_llama'\n"
        "assert llama not in sys.modules\n"
        "assert rule_for(m.MixtralRMSNorm).grads is llama_rms_norm_grads\n"
        "assert llama in sys.modules\n"
        "assert rule_for(m.MixtralRotaryEmbedding) is None\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["untapped", "checkpointed"])
def test_only_a_down_projection_trained_is_replayed_with_or_without_checkpointing(checkpointing, monkeypatch):
    """Only the experts' ``down_proj`` train: in the first block no gradient reaches the up projection (all
    before it is frozen), so the engine's run has nothing to read there and the rule replays the call
    (tapped like any call under checkpointing); the second block's is read from the step. Norms and
    clipped sum equal per-example autograd."""
    model = build("Mixtral").double()
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith("mlp.experts.down_proj"))
    ids = batch_of()
    norms, expected = eager_reference(model, ids, 1e-3)
    model.zero_grad(set_to_none=True)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.disable_input_require_grads()  # (transformers makes the embeddings' output require grad)
    two_steps_match(model, ids, 1e-3, norms, expected, monkeypatch, replayed=True)
