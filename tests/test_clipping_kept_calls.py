"""The checkpointed step's kept calls (``hush_hf.clipping.recompute``): the norm pass keeps the per-example
gradients of the calls it reaches last, and the sum pass recomputes only what lies above them.

What must hold: every call is summed exactly once (kept, or received in the sum pass, never both, never
neither), the kept calls are always the latest to arrive within the byte budget, and the update does not
depend on how much is kept (no segment, one, everything) beyond float64 rounding; against
per-example autograd, ``tests/test_clipping_checkpointing.py`` runs every model with the default.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import Tensor

from hush_hf.clipping import GhostClipper, example_cross_entropy, recompute
from hush_hf.clipping.factors import DenseFactor, Materialized, OuterSum, Replayed, held_bytes
from hush_hf.clipping.recompute import NormPass, SumPass
from tests.model_families import family_named
from tests.test_clipping_checkpointing import batch_for, close
from tests.test_clipping_moe import build
from tests.test_clipping_reference import tiny_gpt2

UNIT = 2 * 8  # the bytes of one column of a use below: 2 examples, float64


def norm_pass(calls: int, keep_units: float, call_bytes: list[int] | None = None) -> NormPass:
    expected = Counter({f"w{c}": 1 for c in range(calls)})
    budget = keep_units * UNIT
    return NormPass(2, expected, None, set(), torch.device("cpu"), torch.float64, budget, call_bytes or [])


def use(value: float, units: int = 3) -> Materialized:
    """A materialised use of a ``units``-entry parameter, holding ``units * UNIT`` bytes."""
    return Materialized(torch.full((2, units), value, dtype=torch.float64))


def test_the_kept_calls_are_the_latest_that_fit_the_budget_in_bytes_held() -> None:
    sizes = [5, 3, 4, 2, 7, 1]
    state = norm_pass(len(sizes), keep_units=6)
    kept_after = []
    for call, units in enumerate(sizes):
        state.add(f"w{call}", use(call, units), torch.Size([units]), call)
        kept_after.append(list(state.kept))
    # 5 | 3 (5 evicted) | 4 (3 evicted) | 4 + 2 | 7 alone exceeds 6: all evicted | 1
    assert kept_after == [[0], [1], [2], [2, 3], [], [5]]
    assert state.kept_bytes == 1 * UNIT
    assert list(state.calls) == list(range(len(sizes)))
    squares = sum(units * c * c for c, units in enumerate(sizes))  # every call's norm, kept or not
    torch.testing.assert_close(state.squared, torch.full((2,), float(squares), dtype=torch.float64))


def test_a_call_keeps_all_its_parameters_or_none() -> None:
    state = norm_pass(2, keep_units=8)
    state.add("w0", use(1.0, 4), torch.Size([4]), 0)
    state.add("w1", use(2.0, 4), torch.Size([4]), 0)  # the same call's second parameter
    assert [name for name, _, _ in state.kept[0]] == ["w0", "w1"] and state.kept_bytes == 8 * UNIT
    state.add("w0", use(3.0, 4), torch.Size([4]), 1)  # call 1 evicts call 0 whole
    assert list(state.kept) == [1] and [name for name, _, _ in state.kept[1]] == ["w0"]
    state.add("w1", use(4.0, 5), torch.Size([5]), 1)  # call 1 no longer fits: nothing is kept
    assert state.kept == {} and state.kept_bytes == 0
    state.add("w0", use(5.0, 1), torch.Size([1]), 1)  # a call that did not fit stays out
    assert state.kept == {}


def test_a_form_of_unknown_bytes_is_charged_its_call_estimate_once() -> None:
    replayed = Replayed(lambda rows: torch.ones(rows.stop - rows.start, 3, dtype=torch.float64), 2, 1)
    state = norm_pass(2, keep_units=4, call_bytes=[3 * UNIT, 9 * UNIT])
    state.add("w0", replayed, torch.Size([3]), 0)
    state.add("w1", replayed, torch.Size([3]), 0)  # the same call: charged once
    assert list(state.kept) == [0] and state.kept_bytes == 3 * UNIT
    state.add("w0", replayed, torch.Size([3]), 1)  # its estimate exceeds the budget
    assert state.kept == {}


def test_a_single_materialised_use_is_held_as_its_norm_was_taken() -> None:
    """A use that ``combine_uses`` materialises (a low-rank adapter's) is held materialised, at its
    (b, rows, cols) bytes, not its factors': the budget that held one call's factors holds all."""
    torch.manual_seed(0)
    b, steps, rows, cols = 2, 64, 3, 4  # rows * cols <= steps * (rows + cols): materialised
    uses = [OuterSum(DenseFactor(torch.randn(b, steps, rows)), DenseFactor(torch.randn(b, steps, cols)))]
    uses.append(uses[0])
    factor_bytes = held_bytes(uses[0])
    assert factor_bytes == b * steps * (rows + cols) * 4
    state = NormPass(
        b, Counter({"w0": 1, "w1": 1}), None, set(), torch.device("cpu"), torch.float32, factor_bytes
    )
    for call, g in enumerate(uses):
        state.add(f"w{call}", g, torch.Size([rows, cols]), call)
    assert list(state.kept) == [0, 1]  # both held, where the factors would fit once
    held = [u for entries in state.kept.values() for _, u, _ in entries]
    assert all(isinstance(u, Materialized) and u.values.shape == (b, rows, cols) for u in held)
    assert state.kept_bytes == 2 * b * rows * cols * 4
    expected = torch.einsum("btr,btc->brc", uses[0].row.values.double(), uses[0].col.values.double())
    torch.testing.assert_close(held[0].values.double(), expected, rtol=1e-5, atol=1e-5)
    coef = torch.tensor([1.0, 0.25])
    sums = state.sum_pass(coef).finish()
    weighted = (expected * coef.double()[:, None, None]).sum(0)
    torch.testing.assert_close(sums["w1"].double(), weighted, rtol=1e-5, atol=1e-5)


def test_a_parameter_of_two_calls_holds_each_call_own_use() -> None:
    """A parameter used by two calls is materialised as the sum of both uses when its norm is taken (at
    the second call): each kept call holds its own use, not that sum, or the first would count twice."""
    torch.manual_seed(0)
    uses = [OuterSum(DenseFactor(torch.randn(2, 16, 3, dtype=torch.float64)),
                     DenseFactor(torch.randn(2, 16, 4, dtype=torch.float64))) for _ in range(2)]  # fmt: skip
    state = NormPass(2, Counter({"w": 2}), None, set(), torch.device("cpu"), torch.float64, 1e9, [0, 0])
    for call, g in enumerate(uses):
        state.add("w", g, torch.Size([3, 4]), call)
    assert list(state.kept) == [0, 1] and all(isinstance(u, OuterSum) for _, u, _ in state.kept[1])
    coef = torch.tensor([1.0, 0.5], dtype=torch.float64)
    expected = sum(torch.einsum("b,btr,btc->rc", coef, g.row.values, g.col.values) for g in uses)
    torch.testing.assert_close(state.sum_pass(coef).finish()["w"], expected)


def test_the_sum_pass_skips_kept_calls_and_refuses_a_missing_one() -> None:
    state = norm_pass(3, keep_units=3)
    for call in range(3):
        state.add(f"w{call}", use(call + 1.0), torch.Size([3]), call)
    coef = torch.tensor([1.0, 0.5], dtype=torch.float64)
    sums = state.sum_pass(coef)  # call 2 kept: its sum is in already
    torch.testing.assert_close(sums.sums["w2"], torch.full((3,), 3 * 1.5, dtype=torch.float64))
    anchors = [torch.zeros((), requires_grad=True) for _ in range(3)]
    assert state.second_pass_inputs(anchors, []) == anchors[:2]
    sums.add("w2", use(100.0), torch.Size([3]), 2)  # reported again: ignored
    sums.add("w0", use(1.0), torch.Size([3]), 0)
    with pytest.raises(RuntimeError, match="1 layer call.*did not reach the sum pass"):
        sums.finish()  # call 1 never arrived
    sums.add("w1", use(2.0), torch.Size([3]), 1)
    done = sums.finish()
    torch.testing.assert_close(done["w2"], torch.full((3,), 4.5, dtype=torch.float64))
    assert SumPass(coef).finish() == {}


def checkpointed_step(model, kwargs, labels, causal: bool, keep: float, monkeypatch) -> tuple[Counter, dict]:
    """The second (verified) clipped step with ``KEEP_SEGMENTS = keep``: how often each decoder layer ran
    its forward in it, and the update."""
    monkeypatch.setattr(recompute, "KEEP_SEGMENTS", keep)
    blocks = ("GPT2Block", "MixtralDecoderLayer", "LlamaDecoderLayer")
    layers = [m for m in model.modules() if type(m).__name__ in blocks]
    runs: Counter[int] = Counter()
    for i, layer in enumerate(layers):  # (a recomputation calls the layer's modules, not its own hooks)
        next(layer.children()).register_forward_hook(lambda *_, i=i: runs.update([i]))
    with GhostClipper(model, 0.5) as clipper:
        for _ in range(2):  # the first step also runs the self-check
            model.zero_grad(set_to_none=True)
            runs.clear()
            clipper.clipped_backward(example_cross_entropy(model(**kwargs).logits, labels, causal=causal))
    return runs, {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("make", [tiny_gpt2, lambda: build("Mixtral")], ids=["gpt2-tied", "mixtral"])
def test_the_sum_pass_recomputes_only_the_layers_above_the_kept_calls(make, monkeypatch) -> None:
    kwargs, labels = None, None
    runs, updates = {}, {}
    for keep in (0.0, 1.0, 1e9):
        model = make().double()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if kwargs is None:
            kwargs, labels = batch_for(model, True)
        runs[keep], updates[keep] = checkpointed_step(model, kwargs, labels, True, keep, monkeypatch)
    layers = len(runs[0.0])
    assert runs[0.0] == {i: 3 for i in range(layers)}  # the forward, and a recomputation in each pass
    # The embeddings' and the largest segment's factor bytes: the bottom layer is kept whole, no other.
    assert runs[1.0] == {0: 2, **{i: 3 for i in range(1, layers)}}
    assert runs[1e9] == {i: 2 for i in range(layers)}  # everything kept: no second backward
    for keep in (1.0, 1e9):
        close(updates[keep], updates[0.0], rtol=1e-12)


def test_a_lora_step_keeps_every_call_and_runs_no_second_backward(monkeypatch) -> None:
    """Counted as the bytes they hold, the adapters' materialised gradients fit the default budget (the
    embeddings' and one segment's factor bytes) all together: no sum pass, and the same update as
    with nothing kept and as without checkpointing."""
    runs, updates, default = {}, {}, recompute.KEEP_SEGMENTS
    for keep in (0.0, default, None):
        model = family_named("Llama + LoRA (peft)").build(False).double()
        if keep is not None:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        kwargs, labels = batch_for(model, True)
        runs[keep], updates[keep] = checkpointed_step(model, kwargs, labels, True, keep or 0.0, monkeypatch)
    layers = len(runs[None])
    assert layers >= 2 and runs[None] == {i: 1 for i in range(layers)}  # no checkpointing: the forward
    assert runs[0.0] == {i: 3 for i in range(layers)}  # the forward, and a recomputation in each pass
    assert runs[default] == {i: 2 for i in range(layers)}  # one recomputation: no sum pass
    close(updates[default], updates[None], rtol=1e-12)
    close(updates[0.0], updates[None], rtol=1e-12)


def test_reentrant_checkpointing_keeps_nothing(monkeypatch) -> None:
    """Reentrant checkpointing runs each pass as ``Tensor.backward``, which cannot stop early."""
    model = tiny_gpt2().double()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    kwargs, labels = batch_for(model, True)
    kept: list[int] = []
    original = NormPass.sum_pass

    def spy(self: NormPass, coef: Tensor) -> SumPass:
        kept.append(len(self.kept))
        return original(self, coef)

    monkeypatch.setattr(NormPass, "sum_pass", spy)
    runs, _ = checkpointed_step(model, kwargs, labels, True, 1e9, monkeypatch)
    assert kept == [] and runs == {0: 3, 1: 3}  # the forward, and a recomputation in each pass
