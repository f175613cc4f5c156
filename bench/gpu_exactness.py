"""hush_hf's clipped sums on a CUDA GPU against an independent reference (issue 28, items 2 and 3).

    .venv/bin/python bench/gpu_exactness.py

The CUDA-only code of the clipping engine (bf16 operands with float32 output, ``float32_products``)
and the TF32 self-check tolerance are tested on the CPU only through stand-ins; this runs them where
they run. Per model (tiny Hub families from ``tests/model_families.py`` and two wider ones) and
precision (float64; float32 with ``highest`` matrix products; TF32 = ``high``; bf16 weights):

- ``norms``: ``max_i |n_i - n_ref_i| / n_ref_i``, n_i the engine's per-example gradient norms and
  n_ref_i those of the torch.func per-example reference (``tests/test_clipping_reference.py``) in
  float64 on the same weights (a bf16 model's weights widened exactly);
- ``sum``: ``||S - S_ref|| / ||S_ref||`` over all trainable parameters, S the engine's sum of the
  per-example gradients (C so large that none is clipped: the clip margin of ``ghost.CLIP_MARGINS``
  would otherwise show as an error) and S_ref the reference's;
- ``max ||c_i g_i|| / C``: the engine's clipped sum of one example alone (C = 1e-3, so every example
  is clipped), the largest over the examples: the sensitivity the accountant assumes is <= 1;
- ``CUDA route``: the calls of the two ``out_dtype`` products (``_mm_out_float32`` /
  ``_bmm_out_float32``) in one step, and ``||S - S_widened|| / ||S||`` against the same step with
  those routes turned off (operands widened to float32 first): the two must agree to float32
  accumulation order.

Printed before the table (they take seconds, and the table's time limit must not cut them off): a kept
(materialised) gradient's squared norm at GPT-2's 768 x 3072 weight and batch 32, by the route a GPU
takes (``factors.grouped_squared_rows``) against float64 and its stated bound, timed against the single
route it replaced (the square, then ``sum`` in float64), with each route's peak of new memory; and a
clipped sum of two bf16 factors at Llama-1B's MLP shape (8 x 1024 positions, 2048 x 5632) and at
GPT-2's tied output layer (32 x 512, 50,257 x 768) by its two routes, one GEMM per example scaled in
cuBLAS's epilogue (``_weighted_product_per_example``) and two exact bf16 pieces of the scaled factor
(``_weighted_product_bf16``), each against float64 and timed; for GPT-2's vocabulary also without the
per-example route's aligned copy of the logits gradient's rows, which says what the copy buys. After
the table, the planted misuse of ``tests/test_clipping_safety.py`` (an embedding read outside its
layer, carrying ~3% of the gradient) on CUDA under TF32: refused, while the same model without it
passes.
Without CUDA it exits at once with a message (status 2).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CLIP_SMALL = 1e-3  # every example's gradient is larger: all are clipped
NO_CLIP = 1e30  # no example is clipped: the sum of the engine's per-example gradients


def wide_gpt2(tied: bool):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=2048, n_embd=256, n_layer=2, n_head=4, n_positions=256,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=tied,
                        attn_implementation="eager")  # fmt: skip
    return GPT2LMHeadModel(config)


def wide_llama(tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
                         attn_implementation="eager")  # fmt: skip
    return LlamaForCausalLM(config)


def cases():
    """(label, build(tied) -> model, tied, causal, batch, seq)."""
    from tests.model_families import family_named

    tiny = [("GPT-2", True), ("Llama", False), ("BERT (MLM)", True), ("Llama + LoRA (peft)", False)]
    found = [(f"{name}, tiny", family_named(name).build, tied, family_named(name).kind != "masked", 4, 12)
             for name, tied in tiny]  # fmt: skip
    found.append(("GPT-2 256 x 2, vocab 2048", wide_gpt2, True, True, 8, 128))
    found.append(("Llama 256 x 2, vocab 4096", wide_llama, False, True, 8, 128))
    return found


def trainable(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def engine_sum(
    model, inputs, labels, causal: bool, clip: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The engine's clipped sum of one step (a fresh clipper: its self-check runs), in float64, and its
    per-example norms."""
    from hush_hf.clipping import GhostClipper, example_cross_entropy
    from hush_hf.clipping.clipped_sums import clipped_sum, discard_

    params = trainable(model)
    for p in params.values():
        p.grad = None
    discard_(list(params.values()))
    with GhostClipper(model, clip) as clipper:
        norms = clipper.clipped_backward(example_cross_entropy(model(**inputs).logits, labels, causal=causal))
    out = {n: clipped_sum(p).double().clone() for n, p in params.items()}
    discard_(list(params.values()))
    for p in params.values():
        p.grad = None
    return out, norms


def reference(model, inputs, labels, causal: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """torch.func per-example gradients of a float64 copy of the same weights: their sum and norms."""
    from tests.test_clipping_reference import norms_of, per_example_grads, reference_lm_loss

    exact = copy.deepcopy(model).double()
    with torch.device(labels.device):  # the reference's example selectors, beside the model
        grads = per_example_grads(exact, inputs, lambda out: reference_lm_loss(out.logits, labels, causal))
    return {n: g.sum(0) for n, g in grads.items()}, norms_of(grads)


def relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    diff = sum(float((a[n] - b[n]).pow(2).sum()) for n in b)
    return (diff / sum(float(b[n].pow(2).sum()) for n in b)) ** 0.5


def total_norm(sums: dict[str, torch.Tensor]) -> float:
    return sum(float(s.pow(2).sum()) for s in sums.values()) ** 0.5


class CudaRoutes:
    """Counts the ``out_dtype`` products, or (``off=True``) turns the bf16-operand routes off so that
    operands are widened to float32 first (the CPU's route)."""

    def __init__(self, off: bool = False) -> None:
        import hush_hf.clipping.factors as factors
        import hush_hf.clipping.float32_products as products
        import hush_hf.clipping.gram_batches as gram_batches

        self.calls = 0
        self.patches = []
        for name in ("_mm_out_float32", "_bmm_out_float32", "_addmm_out_float32"):
            original = getattr(products, name)
            self.patches.append((products, name, original, self._counted(original)))
        if off:
            never = lambda a, b: False  # noqa: E731
            for module in (products, factors, gram_batches):
                for name in ("float32_output_supported", "bf16_products"):
                    if hasattr(module, name):
                        self.patches.append((module, name, getattr(module, name), never))

    def _counted(self, original):
        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        return counted

    def __enter__(self) -> CudaRoutes:
        for module, name, _, patched in self.patches:
            setattr(module, name, patched)
        return self

    def __exit__(self, *exc) -> None:
        for module, name, original, _ in self.patches:
            setattr(module, name, original)


def one_case(
    label: str, build, tied: bool, causal: bool, batch: int, seq: int, precision: str, device: str = "cuda"
) -> str:
    """One row of the table (``device="cpu"``: the smoke run of ``tests/test_bench_gpu.py``)."""
    from tests.test_clipping_reference import lm_batch

    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    torch.manual_seed(0)
    with torch.device(device):
        model = build(tied)
    dtype = {"float64": torch.float64, "bf16": torch.bfloat16}.get(precision, torch.float32)
    model = model.to(dtype).train()
    vocab = model.config.vocab_size
    inputs, labels = lm_batch(causal, batch=batch, vocab=vocab, seq=seq)  # right-padded rows
    inputs, labels = {k: v.to(device) for k, v in inputs.items()}, labels.to(device)
    with CudaRoutes() as routes:
        got, norms = engine_sum(model, inputs, labels, causal, NO_CLIP)
    want, want_norms = reference(model, inputs, labels, causal)
    norm_error = float(((norms.double() - want_norms) / want_norms).abs().max())
    worst = 0.0
    for i in range(batch):
        one = {k: v[i : i + 1] for k, v in inputs.items()}
        applied, _ = engine_sum(model, one, labels[i : i + 1], causal, CLIP_SMALL)
        worst = max(worst, total_norm(applied) / CLIP_SMALL)
    route = f"{routes.calls} calls"
    if routes.calls:
        with CudaRoutes(off=True):
            widened, _ = engine_sum(model, inputs, labels, causal, NO_CLIP)
        route += f", {relative(got, widened):.1e} from widened"
    bound = f"{worst:.7f}" + (" **exceeds C**" if worst > 1.0 else "")
    cells = f"{norm_error:.1e} | {relative(got, want):.1e} | {bound} | {route}"
    return f"| {label} | {precision} | {cells} |"


def planted_misuse_under_tf32(device: str = "cuda") -> str:
    from hush_hf.clipping import GhostClipper, UnsupportedLayerError
    from tests.test_clipping_safety import IDS, SlightTie, lm_loss

    torch.set_float32_matmul_precision("high")
    ids = IDS.to(device)
    torch.manual_seed(0)
    with torch.device(device):
        planted = SlightTie(0.06)
    try:
        with GhostClipper(planted, 1.0) as clipper:
            clipper.clipped_backward(lm_loss(planted(ids), ids))
        caught = "NOT refused"
    except UnsupportedLayerError as error:
        caught = "refused" if "'emb.weight'" in str(error) else f"refused, other reason: {error}"
    torch.manual_seed(0)
    with torch.device(device):
        clean = SlightTie(0.0)
    with GhostClipper(clean, 1.0) as clipper:
        clipper.clipped_backward(lm_loss(clean(ids), ids))
        passed = "passes" if clipper.verified else "NOT verified"
    return (
        f"TF32 (`high`) on {device}: the planted 3% misuse is {caught}; the same model without it {passed}."
    )


def _timed(run, device: str, repeats: int = 5) -> tuple[torch.Tensor, float, float]:
    """``run()``'s result, its median seconds over ``repeats`` runs after one warm-up, and the peak of new
    memory it allocated in GiB (NaN off CUDA)."""
    import statistics
    import time

    cuda = device.startswith("cuda")
    out = run()
    seconds = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        out = run()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    held = float("nan")
    if cuda:
        held = (torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()) / 2**30
    return out, statistics.median(seconds), held


def grouped_norm_line(device: str = "cuda", batch: int = 32, width: int = 768 * 3072) -> str:
    """A kept gradient's squared norms by the grouped route against float64 (relative error and its bound)
    and against the single route (time, transient memory)."""
    from hush_hf.clipping.factors import exact_sum, grouped_squared_rows

    g = torch.Generator(device=device).manual_seed(0)
    block = torch.randn(batch, width, generator=g, device=device)
    block *= torch.exp(2 * torch.randn(batch, 1, generator=g, device=device))
    exact = block.double().pow(2).sum(1)
    grouped, grouped_s, grouped_gib = _timed(lambda: grouped_squared_rows(block), device)
    single, single_s, single_gib = _timed(lambda: exact_sum(block * block, dim=1), device)
    error = float(((grouped - exact) / exact).abs().max())
    single_error = float(((single - exact) / exact).abs().max())
    return (
        f"Kept gradient's norm, {batch} x {width} float32 on {device}: "
        f"grouped route {grouped_s * 1e3:.2f} ms (new memory {grouped_gib:.3f} GiB), "
        f"relative error {error:.1e} (bound {11.1 * 2.0**-24:.1e}); "
        f"single route {single_s * 1e3:.2f} ms ({single_gib:.3f} GiB), error {single_error:.1e}."
    )


def _unaligned(route, *args):
    """``route(*args)`` with ``float32_products._AlignedRows`` making no copies: every factor as it is."""
    import op_census

    from hush_hf.clipping import float32_products as products

    class AsTheyAre:
        def __init__(self, factor: torch.Tensor) -> None:
            pass

        def __call__(self, example: torch.Tensor) -> torch.Tensor:
            return example

    with op_census.patched([(products, "_AlignedRows", AsTheyAre)]):
        return route(*args)


def per_example_line(
    device: str = "cuda", batch: int = 8, steps: int = 1024, n: int = 2048, m: int = 5632
) -> str:
    """``sum_i w~_i row_i^T col_i`` of two bf16 (batch, steps, n), (batch, steps, m) factors by the
    per-example route and the pieces route: relative error to float64 and time of each; where n is not a
    multiple of 8, the per-example route again without its aligned copy of the n-wide factor's rows
    (``float32_products._AlignedRows``), which says what the copy buys."""
    from hush_hf.clipping import float32_products as products

    g = torch.Generator(device=device).manual_seed(0)
    row = torch.randn(batch, steps, n, generator=g, device=device).bfloat16()
    col = torch.randn(batch, steps, m, generator=g, device=device).bfloat16()
    weights = torch.rand(batch, generator=g, device=device)
    cut = products.bf16_toward_zero(weights).double()
    exact = torch.einsum("btr,btk->rk", row.double() * cut.view(-1, 1, 1), col.double())
    runs = {
        "one GEMM per example": lambda: products._weighted_product_per_example(row, col, weights),
        "two pieces": lambda: products._weighted_product_bf16(row, col, weights),
    }
    if n % 8:
        runs["one GEMM per example, rows as they are"] = lambda: _unaligned(
            products._weighted_product_per_example, row, col, weights
        )
    cells = []
    for label, run in runs.items():
        try:
            got, seconds, _ = _timed(run, device)
        except RuntimeError as error:  # a torch whose addmm does not accumulate bf16 products in float32
            cells.append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0][:120]}")
            continue
        error = float((got.double() - exact).norm() / exact.norm())
        cells.append(f"{label} {seconds * 1e3:.2f} ms, relative error {error:.1e}")
    return (
        f"Clipped sum of bf16 factors {batch} x {steps} x ({n}, {m}) on {device}: " + "; ".join(cells) + "."
    )


def gpt2_output_layer_line() -> str:
    """``per_example_line`` at GPT-2's tied output layer: 32 x 512 positions, vocabulary 50,257 x 768."""
    return per_example_line(batch=32, steps=512, n=50257, m=768)


def main() -> None:
    import gpu_step

    gpu_step.require_cuda(
        "gpu_exactness.py", "pytest tests/test_clipping_factors.py tests/test_clipping_safety.py"
    )
    import warnings

    warnings.filterwarnings("ignore")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    # The routes' lines first: a few seconds, and the table's time limit must not cut them off.
    for line in (grouped_norm_line, per_example_line, gpt2_output_layer_line):
        try:
            print(line(), flush=True)
        except Exception as error:  # one line must not lose the table
            print(f"{line.__name__}: {type(error).__name__}: {str(error).strip()[:200]}", flush=True)
    print()
    print("| model | precision | norms: max relative error | sum: relative error | max ||c_i g_i|| / C "
          "| CUDA route |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for label, build, tied, causal, batch, seq in cases():
        for precision in ("float64", "fp32", "tf32", "bf16"):
            try:
                print(one_case(label, build, tied, causal, batch, seq, precision), flush=True)
            except Exception as error:  # one case must not lose the table
                last = str(error).strip().splitlines()[-1][:200] if str(error).strip() else ""
                print(f"| {label} | {precision} | error: {type(error).__name__}: {last} | | | |", flush=True)
    print()
    print(planted_misuse_under_tf32())


if __name__ == "__main__":
    main()
