"""The clipped sum of two bf16 factors, one example at a time (``_weighted_product_per_example``).

On CUDA, where one example's product is a large GEMM, ``sum_i w~_i row_i^T col_i`` runs one bf16 GEMM per
example with float32 accumulation, scaled by w~_i and added to the float32 sum in cuBLAS's epilogue
(``addmm`` with ``out_dtype``), instead of the two exact bf16 pieces of the scaled factor (a weight
gradient's FLOPs twice). The CPU has no such ``addmm``: here its calls are emulated by widening the bf16
operands (the same numbers: a product of two bf16 numbers is exact in float32), and each call is checked
to receive the bf16 factors as they are.
"""

from __future__ import annotations

import pytest
import torch

import hush_hf.clipping.factors as factors
import hush_hf.clipping.float32_products as products
from hush_hf.clipping import GhostClipper, example_cross_entropy
from hush_hf.clipping.clipped_sums import clipped_sum
from hush_hf.clipping.factor_memo import FactorMemo, sum_requests
from hush_hf.clipping.factors import DenseFactor, OuterSum, _dense_pair_route, weighted_sum
from hush_hf.clipping.float32_products import bf16_toward_zero
from tests.model_families import VOCAB, family_named

B = 5


class EmulatedAddmm:
    """``_addmm_out_float32`` on this CPU: the bf16 operands widened, one float32 ``addmm`` in place.
    Counts its calls and checks what CUDA's call would get: bf16 operands, a float32 ``out``."""

    def __init__(self) -> None:
        self.calls = 0
        self.operands: list[tuple[torch.Tensor, torch.Tensor]] = []  # (a, b) of each call, as received

    def __call__(self, out, a, b, alpha, beta):
        assert a.dtype == b.dtype == torch.bfloat16 and out.dtype == torch.float32
        self.calls += 1
        self.operands.append((a, b))
        return torch.addmm(out, a.float(), b.float(), beta=beta, alpha=alpha, out=out)


@pytest.fixture
def cuda_route(monkeypatch) -> EmulatedAddmm:
    """Every pair of bf16 factors takes the per-example route, through ``EmulatedAddmm``."""
    emulated = EmulatedAddmm()
    monkeypatch.setattr(factors, "bf16_products", lambda a, b: a.dtype == b.dtype == torch.bfloat16)
    monkeypatch.setattr(products, "_accumulates_in_float32", lambda device: True)
    monkeypatch.setattr(products, "_addmm_out_float32", emulated)
    monkeypatch.setattr(products, "EXAMPLE_TOKENS", 1)
    monkeypatch.setattr(products, "EXAMPLE_WORK", 1)
    return emulated


def _use(narrow: str, g: torch.Generator) -> OuterSum:
    small, large = torch.randn(B, 9, 6, generator=g), torch.randn(B, 9, 40, generator=g)
    row, col = (small, large) if narrow == "row" else (large, small)
    return OuterSum(DenseFactor(row.bfloat16()), DenseFactor(col.bfloat16()))


@pytest.mark.parametrize("narrow", ["row", "col"])
def test_the_per_example_route_equals_the_float32_route_with_the_cut_weights(narrow, cuda_route) -> None:
    """Against a float64 reference with the weights cut toward zero (what every bf16 route on CUDA applies)
    and against the float32 route with those weights; laid out as the parameter; an example whose weight
    is 0 costs no product."""
    g = torch.Generator().manual_seed(31)
    use = _use(narrow, g)
    weights = torch.rand(B, generator=g) / 3
    weights[1], weights[3] = 0.0, 1.0  # a dropped example, an unclipped one
    assert _dense_pair_route(use)[0] == "examples"
    got = weighted_sum(use, weights)
    assert cuda_route.calls == B - 1
    assert got.dtype == torch.float32 and got.shape == (use.row.size, use.col.size) and got.is_contiguous()
    cut = bf16_toward_zero(weights)
    row, col = use.row.values.double(), use.col.values.double()
    reference = torch.einsum("b,btr,btk->rk", cut.double(), row, col)
    torch.testing.assert_close(got.double(), reference, rtol=1e-6, atol=1e-6)
    widened = OuterSum(DenseFactor(use.row.values.float()), DenseFactor(use.col.values.float()))
    torch.testing.assert_close(got, weighted_sum(widened, cut), rtol=1e-6, atol=1e-6)


def test_a_factor_whose_rows_are_not_16_byte_aligned_is_multiplied_from_an_aligned_copy(cuda_route) -> None:
    """Rows of 5 bf16 entries (10 bytes, as a vocabulary of 50,257 is 100,514): each example reaches the
    product from one buffer whose rows hold 8 entries (16 bytes), values unchanged; an aligned factor (8
    entries) reaches it as its own view, with no copy."""
    g = torch.Generator().manual_seed(34)
    row = torch.randn(B, 12, 5, generator=g).bfloat16()
    col = torch.randn(B, 12, 8, generator=g).bfloat16()
    weights = torch.rand(B, generator=g)
    got = weighted_sum(OuterSum(DenseFactor(row), DenseFactor(col)), weights)
    assert len(cuda_route.operands) == B
    buffers = {a.data_ptr() for a, _ in cuda_route.operands}
    assert len(buffers) == 1 and buffers.pop() % 16 == 0  # one buffer, reused
    for i, (a, b) in enumerate(cuda_route.operands):
        assert a.shape == (5, 12) and a.stride() == (1, 8)  # row i, transposed, its rows 16 bytes apart
        assert b.data_ptr() == col[i].data_ptr() and b.stride() == (8, 1)  # the aligned factor as it is
    reference = torch.einsum("b,btr,btk->rk", bf16_toward_zero(weights).double(), row.double(), col.double())
    torch.testing.assert_close(got.double(), reference, rtol=1e-6, atol=1e-6)


def test_all_zero_weights_give_zeros_without_a_product(cuda_route) -> None:
    use = _use("row", torch.Generator().manual_seed(32))
    got = weighted_sum(use, torch.zeros(B))
    assert cuda_route.calls == 0 and torch.equal(got, torch.zeros(use.row.size, use.col.size))


def test_the_weights_are_read_to_the_host_once_per_weights_tensor(cuda_route, monkeypatch) -> None:
    """One device-to-host read (a sync on a GPU) for all the products that scale by one weights tensor,
    another for a new tensor or the same one changed in place; the memo asks nothing of this route."""
    reads = []
    real = products.bf16_toward_zero
    monkeypatch.setattr(products, "bf16_toward_zero", lambda w: reads.append(w) or real(w))
    g = torch.Generator().manual_seed(33)
    uses = [_use("row", g) for _ in range(3)]
    assert sum_requests(uses) == []
    weights = torch.rand(B, generator=g)
    memo = FactorMemo(sum_requests(uses))
    first = [weighted_sum(u, weights, memo) for u in uses]
    assert len(reads) == 1
    assert all(torch.equal(weighted_sum(u, weights), f) for u, f in zip(uses, first, strict=True))
    assert len(reads) == 1
    weights.mul_(0.5)  # the same tensor, new values: read again
    halved = weighted_sum(uses[0], weights)
    assert len(reads) == 2
    torch.testing.assert_close(halved, first[0] * 0.5, rtol=1e-6, atol=1e-7)
    weighted_sum(uses[0], weights.clone())
    assert len(reads) == 3


def _meta_use(steps: int, rows: int, cols: int, dtype=torch.bfloat16) -> OuterSum:
    return OuterSum(
        DenseFactor(torch.empty(8, steps, rows, dtype=dtype, device="meta")),
        DenseFactor(torch.empty(8, steps, cols, dtype=dtype, device="meta")),
    )


def test_only_large_per_example_products_take_the_route(monkeypatch) -> None:
    """Shapes decide (never the batch): T >= EXAMPLE_TOKENS positions and T n m >= EXAMPLE_WORK
    multiply-adds per example, where ``addmm`` accumulates in float32; Llama-1B's MLP, query and output
    projections and its output layer at 1024 positions, GPT-2's MLP, query-key-value and output layer at
    512; not Llama's grouped key and value weights nor GPT-2's attention output, nor anything at 256
    positions, nor float32 factors."""
    monkeypatch.setattr(factors, "bf16_products", lambda a, b: a.dtype == torch.bfloat16)
    monkeypatch.setattr(products, "_accumulates_in_float32", lambda device: True)

    def route(steps: int, rows: int, cols: int, dtype=torch.bfloat16) -> str:
        return _dense_pair_route(_meta_use(steps, rows, cols, dtype))[0]  # type: ignore[index]

    for rows, cols in ((5632, 2048), (2048, 5632), (2048, 2048), (32000, 2048)):
        assert route(1024, rows, cols) == "examples"
    assert route(1024, 256, 2048) == "pieces"  # a grouped-query key projection: 2^29 multiply-adds
    for rows, cols in ((3072, 768), (768, 3072), (50257, 768), (768, 2304)):
        assert route(512, rows, cols) == "examples"
    assert route(512, 768, 768) == "pieces"
    assert route(256, 5632, 2048) == "pieces"
    assert route(1024, 5632, 2048, torch.float32) == "scaled"
    monkeypatch.setattr(products, "_accumulates_in_float32", lambda device: False)  # an older torch
    assert route(1024, 5632, 2048) == "pieces"


def test_the_cuda_calls_signature_exists_on_the_meta_device() -> None:
    """``addmm`` with ``out_dtype`` and a float32 ``out`` accumulated in place exists with this signature
    (the meta device's checks are looser than CUDA's: what CUDA does with it the probe below asks at run
    time, and ``bench/gpu_exactness.py`` measures on a GPU)."""
    a = torch.empty(7, 3, dtype=torch.bfloat16, device="meta")
    b = torch.empty(3, 5, dtype=torch.bfloat16, device="meta")
    out = torch.empty(7, 5, device="meta")
    got = products._addmm_out_float32(out, a, b, alpha=0.25, beta=1)
    assert got is out and got.dtype == torch.float32 and got.shape == (7, 5)


def test_the_probe_takes_the_route_only_where_addmm_does_what_it_needs(monkeypatch) -> None:
    """``_accumulates_in_float32`` (uncached here): a float32 ``addmm`` that writes with beta = 0 (over a
    NaN) and accumulates with beta = 1 passes; one that raises, as an older torch does, or that ignores
    alpha or beta, does not."""
    probe = products._accumulates_in_float32.__wrapped__
    cpu = torch.device("cpu")
    monkeypatch.setattr(products, "_addmm_out_float32", EmulatedAddmm())
    assert probe(cpu)

    def raises(out, a, b, alpha, beta):
        raise RuntimeError("self and mat2 must have the same dtype, but got Float and BFloat16")

    def without_alpha(out, a, b, alpha, beta):
        return torch.addmm(out, a.float(), b.float(), beta=beta, out=out)

    def always_accumulating(out, a, b, alpha, beta):
        return torch.addmm(out, a.float(), b.float(), beta=1, alpha=alpha, out=out)

    for wrong in (raises, without_alpha, always_accumulating):
        monkeypatch.setattr(products, "_addmm_out_float32", wrong)
        assert not probe(cpu), wrong.__name__


def _step(monkeypatch, route: str) -> dict[str, torch.Tensor]:
    """One bf16 Llama step (self-check included) and a second one; the float32 clipped sums of both."""
    if route == "examples":
        monkeypatch.setattr(products, "EXAMPLE_TOKENS", 1)
        monkeypatch.setattr(products, "EXAMPLE_WORK", 1)
    else:
        monkeypatch.setattr(products, "EXAMPLE_WORK", 2**62)
    torch.manual_seed(0)
    model = family_named("Llama").build(False).to(torch.bfloat16)
    ids = torch.randint(3, VOCAB, (B, 12), generator=torch.Generator().manual_seed(1))
    with GhostClipper(model, 0.05) as clipper:
        for _ in range(2):  # the first runs the self-check against autograd
            logits = model(input_ids=ids).logits
            clipper.clipped_backward(example_cross_entropy(logits, ids, causal=True))
    return {n: clipped_sum(p).clone() for n, p in model.named_parameters()}


def test_a_bf16_llama_step_sums_the_same_by_either_route(cuda_route, monkeypatch) -> None:
    """A whole step, every factored weight matrix on the per-example route (the self-check passes; the
    pieces route refused meanwhile), against the same step on the pieces route: the same clipped sums, within
    float32 accumulation order. The clip weights come to the host once per micro-batch."""
    reads = []
    real = products.bf16_toward_zero
    monkeypatch.setattr(products, "bf16_toward_zero", lambda w: reads.append(w) or real(w))
    pieces_route = factors._weighted_product_bf16

    def refused(*args, **kwargs):
        raise AssertionError("a weight matrix took the pieces route")

    monkeypatch.setattr(factors, "_weighted_product_bf16", refused)
    per_example = _step(monkeypatch, "examples")
    monkeypatch.setattr(factors, "_weighted_product_bf16", pieces_route)
    assert len(reads) == 2  # two micro-batches, a product per example and weight matrix in each
    linears = [m for m in family_named("Llama").build(False).modules() if isinstance(m, torch.nn.Linear)]
    # factored: a float32 per-example gradient larger than its bf16 factors at 12 positions (norm_strategy);
    # the grouped key and value projections (16 -> 8) are kept whole and summed as such
    factored = [
        m for m in linears if 4 * m.in_features * m.out_features > 2 * 12 * (m.in_features + m.out_features)
    ]
    assert len(factored) == len(linears) - 4
    assert cuda_route.calls == 2 * len(factored) * B  # every example of every factored weight, in both
    calls = cuda_route.calls
    pieces = _step(monkeypatch, "pieces")
    assert cuda_route.calls == calls  # no per-example product on the pieces route
    assert per_example.keys() == pieces.keys()
    for name, total in per_example.items():
        assert total.dtype == torch.float32
        torch.testing.assert_close(total, pieces[name], rtol=1e-5, atol=1e-7)


class EmulatedProducts:
    """The ``out_dtype`` products on this CPU (operands widened), recording each ``mm``'s operands."""

    def __init__(self) -> None:
        self.mm_operands: list[tuple[torch.Tensor, torch.Tensor]] = []

    def mm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.mm_operands.append((a, b))
        return torch.mm(a.float(), b.float())

    @staticmethod
    def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a.float(), b.float())


@pytest.fixture
def all_cuda_routes(cuda_route, monkeypatch) -> EmulatedProducts:
    """Every CUDA-only route taken (``out_dtype`` products included, as ``bench/op_census.py`` emulates
    them), the per-example ones from the smallest shapes up."""
    import hush_hf.clipping.gram_batches as gram_batches

    emulated = EmulatedProducts()

    def supported(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.dtype == b.dtype == torch.bfloat16

    for module in (products, factors, gram_batches):
        monkeypatch.setattr(module, "float32_output_supported", supported)
    monkeypatch.setattr(products, "_mm_out_float32", emulated.mm)
    monkeypatch.setattr(products, "_bmm_out_float32", emulated.bmm)
    return emulated


def test_a_vocabulary_wide_factors_gram_matrix_is_taken_from_aligned_rows(all_cuda_routes) -> None:
    """Rows of 5 bf16 entries: each example's Gram matrix is one product of 16-byte-aligned rows from one
    reused buffer, the same numbers as the batched product (float64 reference); rows of 8 entries take
    the batched product."""
    from hush_hf.clipping.factors import gram

    g = torch.Generator().manual_seed(35)
    values = torch.randn(B, 12, 5, generator=g).bfloat16()
    got = gram(DenseFactor(values), DenseFactor(values))
    assert len(all_cuda_routes.mm_operands) == B
    for a, b in all_cuda_routes.mm_operands:
        assert a.shape == (12, 5) and a.stride() == (8, 1) and b.stride() == (1, 8)
        assert a.data_ptr() == b.data_ptr() == all_cuda_routes.mm_operands[0][0].data_ptr()
    reference = torch.bmm(values.double(), values.double().transpose(1, 2))
    torch.testing.assert_close(got.double(), reference, rtol=1e-6, atol=1e-6)
    aligned = torch.randn(B, 12, 8, generator=g).bfloat16()
    gram(DenseFactor(aligned), DenseFactor(aligned))
    assert len(all_cuda_routes.mm_operands) == B  # no per-example product: the batched one


def _odd_vocabulary_step(vocab: int) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Two bf16 steps of a 2-layer tied Llama whose vocabulary is ``vocab``: (each one's norms, the sums)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).train()
    ids = torch.randint(3, vocab, (B, 12), generator=torch.Generator().manual_seed(1))
    norms = []
    with GhostClipper(model, 0.05) as clipper:
        for _ in range(2):  # the first runs the self-check against autograd
            logits = model(input_ids=ids).logits
            norms.append(clipper.clipped_backward(example_cross_entropy(logits, ids, causal=True)))
    return norms, {n: clipped_sum(p).clone() for n, p in model.named_parameters()}


def test_a_tied_bf16_step_with_an_odd_vocabulary_copies_its_logits_gradient_aligned(
    cuda_route, all_cuda_routes, monkeypatch
) -> None:
    """A vocabulary of 97 (194-byte rows): the logits gradient's Gram matrices and per-example sums come
    from aligned copies, the self-check passes, and norms and clipped sums are those of the same steps
    with no aligned copy made."""
    norms, sums = _odd_vocabulary_step(97)
    assert any(a.stride() == (104, 1) for a, _ in all_cuda_routes.mm_operands)  # 97 entries padded to 104
    assert any(a.stride() == (1, 104) for a, _ in cuda_route.operands if a.shape[0] == 97)

    class AsTheyAre:
        buffer = None

        def __init__(self, factor: torch.Tensor) -> None:
            pass

        def __call__(self, example: torch.Tensor) -> torch.Tensor:
            return example

    monkeypatch.setattr(products, "_AlignedRows", AsTheyAre)
    plain_norms, plain_sums = _odd_vocabulary_step(97)
    for got, want in zip(norms, plain_norms, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    for name, total in sums.items():
        torch.testing.assert_close(total, plain_sums[name], rtol=1e-5, atol=1e-7)
