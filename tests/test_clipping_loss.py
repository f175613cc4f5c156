"""example_cross_entropy: per-example mean token cross-entropy, shift for causal LMs, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from hush_hf.clipping import example_cross_entropy


def manual_loss(logits: torch.Tensor, labels: torch.Tensor, causal: bool) -> list[float]:
    """Written out token by token in float64."""
    out = []
    for i in range(labels.shape[0]):
        terms = []
        for t in range(labels.shape[1]):
            src = t - 1 if causal else t
            if src < 0 or labels[i, t] == -100:
                continue
            row = logits[i, src].double()
            terms.append(float(torch.logsumexp(row, 0) - row[labels[i, t]]))
        out.append(sum(terms) / len(terms) if terms else 0.0)
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_matches_token_by_token_definition(causal: bool) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    labels = torch.randint(0, 11, (3, 5), generator=g)
    labels[0, 3:] = -100
    labels[2] = -100  # no target at all: loss 0
    loss = example_cross_entropy(logits, labels, causal=causal)
    assert loss.shape == (3,) and loss.dtype == torch.float32
    assert loss[2] == 0
    expected = torch.tensor(manual_loss(logits, labels, causal), dtype=torch.float64)
    torch.testing.assert_close(loss.double(), expected)


def test_causal_single_example_equals_transformers_loss() -> None:
    """For one example, transformers' causal-LM loss (token mean, shifted) is the same number."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 7, 13, generator=g)
    labels = torch.randint(0, 13, (1, 7), generator=g)
    labels[0, 5:] = -100
    expected = ForCausalLMLoss(logits, labels, vocab_size=13)
    torch.testing.assert_close(example_cross_entropy(logits, labels, causal=True)[0], expected)


def test_example_without_targets_has_zero_gradient() -> None:
    logits = torch.randn(2, 4, 6, requires_grad=True)
    labels = torch.tensor([[1, 2, 3, 4], [-100, -100, -100, -100]])
    example_cross_entropy(logits, labels, causal=False).sum().backward()
    assert (logits.grad[1] == 0).all() and (logits.grad[0] != 0).any()


def test_half_precision_logits_are_upcast() -> None:
    logits = torch.randn(2, 4, 6).bfloat16()
    labels = torch.randint(0, 6, (2, 4))
    assert example_cross_entropy(logits, labels, causal=True).dtype == torch.float32


def test_bad_inputs_are_named_and_label_values_not_echoed() -> None:
    logits = torch.randn(2, 4, 6)
    with pytest.raises(ValueError, match="logits must be"):
        example_cross_entropy(logits[0], torch.zeros(4, dtype=torch.long), causal=True)
    with pytest.raises(ValueError, match=r"labels must be an integer tensor of shape \(2, 4\)"):
        example_cross_entropy(logits, torch.zeros(2, 5, dtype=torch.long), causal=True)
    with pytest.raises(ValueError, match="labels must be an integer tensor"):
        example_cross_entropy(logits, torch.zeros(2, 4), causal=True)
    labels = torch.zeros(2, 4, dtype=torch.long)
    labels[1, 2] = 4711  # out of vocabulary (could be a secret token id: must not be echoed)
    with pytest.raises(ValueError, match=r"first at example 1, position 2") as info:
        example_cross_entropy(logits, labels, causal=True)
    assert "4711" not in str(info.value)
    labels[1, 2] = -5
    with pytest.raises(ValueError, match=r"labels must be in \[0, 6\) or -100"):
        example_cross_entropy(logits, labels, causal=False)


def test_loss_is_finite_for_extreme_logits() -> None:
    logits = torch.tensor([[[1e4, -1e4, 0.0], [0.0, 0.0, 0.0]]])
    loss = example_cross_entropy(logits, torch.tensor([[1, 0]]), causal=False)
    assert math.isfinite(float(loss[0])) and float(loss[0]) == pytest.approx((2e4 + math.log(3)) / 2)


@pytest.mark.parametrize("causal", [True, False])
def test_sparse_targets_select_positions_with_the_same_loss_and_gradient(causal: bool, monkeypatch) -> None:
    """A masked LM's ~15% targets: the softmax only at target positions, same values and gradients."""
    from hush_hf.clipping import loss as loss_module

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 20, 11, generator=g)
    labels = torch.randint(0, 11, (4, 20), generator=g)
    labels[torch.rand(4, 20, generator=g) > 0.15] = -100
    labels[3] = -100  # no target at all: loss 0
    results = []
    for select_below in (loss_module._SELECT_BELOW, 0.0):  # the selected path, then the full one
        monkeypatch.setattr(loss_module, "_SELECT_BELOW", select_below)
        leaf = logits.clone().requires_grad_(True)
        loss = example_cross_entropy(leaf, labels, causal=causal)
        (loss * torch.arange(1.0, 5.0)).sum().backward()
        results.append((loss.detach(), leaf.grad))
    expected = torch.tensor(manual_loss(logits, labels, causal), dtype=torch.float64)
    torch.testing.assert_close(results[0][0].double(), expected)
    assert results[0][0][3] == 0
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])
