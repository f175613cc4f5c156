"""Census of the aten operations one training step dispatches: plain step against the hush_hf DP step.

    .venv/bin/python bench/op_census.py [--models gpt2 llama llama-lora] [--dtypes float32 bfloat16 autocast]
                                        [--batch 8] [--seq 64] [--checkpointing] [--top 0]

On a GPU every dispatched operation that is not a view is at least one kernel launch, and a DP step on
a small or medium model is bound by their number (and by the casts among them) rather than by its
arithmetic: a proxy that any machine measures exactly, on CPU, in seconds. Counted with a
``TorchDispatchMode`` (below autograd: the forward's and the backward's kernels alike), for one step
after ``--warmup`` steps (hush_hf's one-time self-check runs in the warm-up):

- ``plain``: forward with transformers' batch-mean loss, ``backward()``, AdamW, ``zero_grad``. AdamW
  runs ``foreach=True`` in both steps, its default on a GPU (on CPU it defaults to one loop per parameter).
- ``hush``: forward, ``example_cross_entropy``, ``GhostClipper.clipped_backward`` (per-example clipping,
  clipped sums), ``privatize_gradients_`` (noise), AdamW, ``zero_grad``.

Columns: ``ops`` every dispatched aten operation; ``kernels`` those that are not views (``view``,
``t``, ``expand``, ``detach``, ... and ``promote_types``: no kernel on a GPU); ``casts``
``_to_copy``/``copy_`` that change the dtype, and ``cat``/``stack`` into an output of another dtype (a
widening copy of several tensors: one cast kernel);
``f32 mm`` matrix products (mm, bmm, addmm, baddbmm, ...) with a float32 operand, in a bf16 model
the products that do not run as bf16 GEMMs; ``mm`` all matrix products; ``syncs`` device-to-host
reads (``_local_scalar_dense``: ``.item()``, ``int(t)``, ``bool(t)``; ``nonzero``; ``.tolist()``), a
stall each on a GPU (AdamW's reads of its CPU step counters left out). Ratios
are hush over plain. Models: 4-layer GPT-2 (tied, Conv1D) and Llama (untied, RMSNorm), built from
configs with small widths, random init, random tokens; ``bfloat16`` casts the whole model
(bf16 weights, as ``Trainer(bf16=True)`` without autocast would not; the clipped sums stay float32);
``autocast`` keeps the float32 model and runs its forward and loss under bf16 autocast, as
``Trainer(bf16=True)`` does (the trainer row of the GPU table).
``llama-lora``: the Llama with rank-16 LoRA adapters on all seven projections, its base frozen (as the
GPU table's LoRA rows); ``--checkpointing``: transformers' gradient checkpointing (non-reentrant) in
both steps.
``--top N`` also prints the N most frequent operations of each step. ``--breakdown N`` prints, for
each step, the N Python call sites that dispatch the most kernels, the most casts and the most views
(no kernel, but a dispatch and a tensor's metadata each): the innermost
frame in ``hush_hf`` (else in this script, else the innermost frame outside torch), so a count can be
traced to the line that causes it (slower: one stack walk per operation).

``--cuda-routes`` also counts the hush step as CUDA runs it, on this machine: the engine's few
CUDA-only routes (``hush_hf.clipping.float32_products``: bf16 x bf16 products with float32 output,
``out_dtype``, which torch has for CUDA only; and the clipped sum of two bf16 factors built on it) are taken
as on a GPU, each ``out_dtype`` product emulated by widening its two operands first. Those widenings
are counted apart (``emulated``) and left out of the ``kernels (CUDA)`` and ``casts (CUDA)`` columns:
what a GPU would dispatch for this step. The first table's counts stay the headline (what this
machine dispatched); the CUDA columns are derived, and no GPU ran them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NO_KERNEL = {"detach", "alias", "_unsafe_view", "lift_fresh", "promote_types", "result_type", "sym_size"}
"""Dispatched operations that launch no kernel besides views: metadata and dtype arithmetic."""
MATMULS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "matmul", "_scaled_mm"}


_IN_OPTIMIZER = [False]  # AdamW reads its CPU step counters (no device stall on a GPU): not syncs


def optimizer_step(optimizer) -> None:
    _IN_OPTIMIZER[0] = True
    try:
        optimizer.step()
    finally:
        _IN_OPTIMIZER[0] = False
    optimizer.zero_grad(set_to_none=True)


_EMULATING = [False]  # inside an emulated CUDA-only product: its operand widenings are counted apart


@contextlib.contextmanager
def patched(patches):
    """Each ``(owner, name, value)`` of ``patches`` set for the block and put back after; a name its owner
    lacks (an older engine, counted by the same benches) is left alone."""
    present = [patch for patch in patches if hasattr(patch[0], patch[1])]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in present]
    for owner, name, value in present:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


@contextlib.contextmanager
def cuda_routes(emulate=None):
    """The engine takes its CUDA-only routes on this machine (see the module docstring): bf16/fp16
    operand pairs count as ``out_dtype``-capable whatever their device (and ``addmm`` as accumulating
    into float32), and each such product is emulated by a widening of its operands (flagged) and a
    float32 product (one kernel, as on CUDA). ``emulate(product)``: another emulation of ``out_dtype``
    products (``product`` is ``torch.mm``, ``torch.bmm`` or ``torch.addmm``, called as the engine's
    ``_mm_out_float32``, ``_bmm_out_float32``, ``_addmm_out_float32`` are)."""
    import hush_hf.clipping.factors as factors
    import hush_hf.clipping.float32_products as products
    import hush_hf.clipping.gram_batches as gram_batches

    def supported(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16)

    def emulated(product):
        def run(*tensors: torch.Tensor, **scalars) -> torch.Tensor:
            _EMULATING[0] = True
            try:
                *rest, a, b = tensors  # addmm: (out, a, b), accumulated in place
                a, b = a.float(), b.float()
            finally:
                _EMULATING[0] = False
            if rest:
                return product(*rest, a, b, **scalars, out=rest[0])
            return product(a, b)

        return run

    patches = [
        (factors, "float32_output_supported", supported),
        (gram_batches, "float32_output_supported", supported),
        (products, "float32_output_supported", supported),
        (products, "_mm_out_float32", (emulate or emulated)(torch.mm)),
        (products, "_bmm_out_float32", (emulate or emulated)(torch.bmm)),
        (products, "_addmm_out_float32", (emulate or emulated)(torch.addmm)),
        (products, "_accumulates_in_float32", lambda device: True),
    ]
    with patched(patches):
        yield


_ROOT = str(Path(__file__).resolve().parents[1])
_TORCH = os.path.dirname(torch.__file__)


def call_site() -> str:
    """The Python line an operation comes from: the innermost frame in ``hush_hf``, else in ``bench``,
    else the innermost outside torch (a model's forward), as ``path:line (function)``."""
    frame = sys._getframe(2)
    fallback = None
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_ROOT):
            rel = os.path.relpath(name, _ROOT)
            if rel.startswith("hush_hf") or (rel.startswith("bench") and fallback is None):
                return f"{rel}:{frame.f_lineno} ({frame.f_code.co_name})"
        elif fallback is None and not name.startswith(_TORCH) and "<" not in name:
            fallback = f"{name.rsplit('site-packages/', 1)[-1]}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return fallback or "torch (autograd engine, optimizer)"


HOST_READS = ("_local_scalar_dense", "nonzero")
"""Operations that read a device value back (``.item()``, ``int(t)``, ``bool(t)``; ``nonzero``'s output
size); ``.tolist()`` dispatches nothing on a CPU tensor and is counted by ``_ListReads``."""


class _ListReads(TorchFunctionMode):
    """Counts ``.tolist()`` calls (a copy to the host on a GPU) into ``counter.syncs``."""

    def __init__(self, counter: OpCensus) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) == "tolist" and not _IN_OPTIMIZER[0]:
            self.counter.syncs += 1
        return func(*args, **(kwargs or {}))


class OpCensus(TorchDispatchMode):
    """Counts every aten operation dispatched while active, with casts and float32 matrix products;
    with ``sites``, also the kernels and casts of each Python call site (``call_site``)."""

    def __init__(self, sites: bool = False) -> None:
        super().__init__()
        self.sites = sites
        self.kernel_sites: Counter[str] = Counter()
        self.cast_sites: Counter[str] = Counter()
        self.view_sites: Counter[str] = Counter()
        self.emulated = 0  # operand widenings of emulated CUDA-only products (``cuda_routes``)
        self.ops: Counter[str] = Counter()
        self.views = 0
        self.casts: Counter[str] = Counter()
        self.f32_matmuls = 0
        self.matmuls = 0
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        site = call_site() if self.sites else ""
        if func.is_view or name in NO_KERNEL:
            self.views += 1
            if self.sites:
                self.view_sites[f"{site} {name}"] += 1
        elif self.sites:
            self.kernel_sites[f"{site} {name}"] += 1
        cast = None
        if name == "_to_copy" and isinstance(args[0], torch.Tensor):
            target = kwargs.get("dtype")
            if target is not None and target != args[0].dtype:
                cast = f"{args[0].dtype}->{target}".replace("torch.", "")
        elif name == "copy_" and isinstance(args[1], torch.Tensor) and args[0].dtype != args[1].dtype:
            cast = f"{args[1].dtype}->{args[0].dtype}".replace("torch.", "")
        elif name in ("cat", "stack") and isinstance(kwargs.get("out"), torch.Tensor):
            # a stack or cat into an output of another dtype converts as it copies: one cast kernel
            wider = {t.dtype for t in args[0] if isinstance(t, torch.Tensor)} - {kwargs["out"].dtype}
            if wider:
                cast = f"{min(map(str, wider))}->{kwargs['out'].dtype}".replace("torch.", "")
        if cast is not None:
            self.casts[cast] += 1
            self.emulated += _EMULATING[0]
            if self.sites:
                self.cast_sites[f"{site} {cast}"] += 1
        elif name in MATMULS:
            self.matmuls += 1
            if any(isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in args):
                self.f32_matmuls += 1
        elif name in HOST_READS and not _IN_OPTIMIZER[0]:
            self.syncs += 1
        return func(*args, **kwargs)

    def summary(self) -> dict[str, int]:
        total = sum(self.ops.values())
        return {
            "ops": total,
            "kernels": total - self.views,
            "casts": sum(self.casts.values()),
            "f32 mm": self.f32_matmuls,
            "mm": self.matmuls,
            "syncs": self.syncs,
            "kernels (CUDA)": total - self.views - self.emulated,
            "casts (CUDA)": sum(self.casts.values()) - self.emulated,
        }


def build_model(family: str, dtype: torch.dtype, checkpointing: bool = False):
    """4 layers, hidden 128, vocabulary 2048; random init (seed 0). (model, causal). ``llama-lora``: the
    Llama with rank-16 LoRA adapters on all seven projections (as ``bench/gpu_step.py``'s LoRA rows),
    its base frozen. ``checkpointing``: transformers' gradient checkpointing, non-reentrant."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if family == "gpt2":
        config = GPT2Config(vocab_size=2048, n_positions=256, n_embd=128, n_layer=4, n_head=2)
        model = GPT2LMHeadModel(config)
    elif family in ("llama", "llama-lora"):
        config = LlamaConfig(
            vocab_size=2048,
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=False,
        )
        model = LlamaForCausalLM(config)
    else:
        raise ValueError(f"unknown model family {family!r}")
    if family == "llama-lora":
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(dtype).train(), True


def make_step(
    family: str,
    dtype: torch.dtype,
    contender: str,
    batch: int,
    seq: int,
    checkpointing: bool = False,
    autocast: bool = False,
):
    """A closure running one full training step of ``contender``."""
    model, causal = build_model(family, dtype, checkpointing)
    return step_of(model, causal, contender, batch, seq, autocast)


def step_of(model, causal: bool, contender: str, batch: int, seq: int, autocast: bool = False):
    """A closure running one full training step of ``contender`` on ``model``: a random (batch, seq)
    batch of token ids (seed 0) that is its own labels, AdamW (foreach) on the trainable parameters.
    ``autocast``: the forward and the loss under bf16 autocast, the backward outside it, as ``Trainer``
    runs ``bf16=True``."""
    device = next(model.parameters()).device.type

    def mixed():
        return torch.autocast(device, torch.bfloat16) if autocast else contextlib.nullcontext()

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=generator)
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones(batch, seq, dtype=torch.long),
        "position_ids": torch.arange(seq).expand(batch, seq).contiguous(),
    }
    labels = ids.clone()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)  # as on a GPU
    if contender == "plain":

        def step(k: int) -> None:
            with mixed():
                loss = model(**inputs, labels=labels).loss
            loss.backward()
            optimizer_step(optimizer)

        return step

    from hush_hf.clipping import GhostClipper, example_cross_entropy
    from hush_hf.trainer.noise import privatize_gradients_

    clipper = GhostClipper(model, 1.0)

    def dp_step(k: int) -> None:
        with mixed():
            loss = example_cross_entropy(model(**inputs).logits, labels, causal=causal)
        clipper.clipped_backward(loss)
        privatize_gradients_(
            trainable, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=batch, dp_seed=1, step=k
        )
        optimizer_step(optimizer)

    return dp_step


def census(
    family: str,
    dtype: torch.dtype,
    contender: str,
    batch: int,
    seq: int,
    warmup: int,
    sites: bool = False,
    cuda: bool = False,
    checkpointing: bool = False,
    autocast: bool = False,
) -> OpCensus:
    """One step's census; ``cuda``: with the engine's CUDA routes (``cuda_routes``), warm-up included;
    ``autocast``: a float32 model run under bf16 autocast (``step_of``)."""
    with cuda_routes() if cuda else contextlib.nullcontext():
        step = make_step(family, dtype, contender, batch, seq, checkpointing, autocast)
        for k in range(warmup):
            step(k)
        with counted(sites) as counter:
            step(warmup)
    return counter


@contextlib.contextmanager
def counted(sites: bool = False) -> Iterator[OpCensus]:
    """An ``OpCensus`` of what runs inside, its ``syncs`` including ``.tolist()`` (``_ListReads``): the
    one definition of a host read, for this script and ``tests/test_host_reads.py``."""
    counter = OpCensus(sites)
    with counter, _ListReads(counter):
        yield counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models", nargs="+", default=["gpt2", "llama"], choices=["gpt2", "llama", "llama-lora"]
    )
    dtypes = ["float32", "bfloat16"]
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=dtypes,
        choices=[*dtypes, "autocast"],
        help="autocast: float32 weights, the forward under bf16 autocast (Trainer's bf16=True)",
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--checkpointing", action="store_true", help="gradient checkpointing (non-reentrant) in both steps"
    )
    parser.add_argument("--top", type=int, default=0, help="also list the N most frequent ops per step")
    parser.add_argument(
        "--breakdown", type=int, default=0, help="also list the N top call sites by kernels, casts, views"
    )
    parser.add_argument(
        "--cuda-routes",
        action="store_true",
        help="also count the hush step with the engine's CUDA-only routes (emulated widenings left out)",
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    columns = ["ops", "kernels", "casts", "f32 mm", "mm", "syncs"]
    print(
        f"aten operations per step, {args.batch}x{args.seq}, torch {torch.__version__}, after "
        f"{args.warmup} warm-up steps (hush/plain ratio in brackets)"
    )
    print(f"| model | dtype | {' | '.join(f'{c} plain / hush (x)' for c in columns)} |")
    print("|---|---|" + "---|" * len(columns))
    for family in args.models:
        for dtype_name in args.dtypes:
            autocast = dtype_name == "autocast"
            dtype = torch.float32 if autocast else getattr(torch, dtype_name)
            found = {
                c: census(
                    family,
                    dtype,
                    c,
                    args.batch,
                    args.seq,
                    args.warmup,
                    bool(args.breakdown),
                    False,
                    args.checkpointing,
                    autocast,
                )
                for c in ("plain", "hush")
            }
            plain, hush = found["plain"].summary(), found["hush"].summary()
            cells = []
            for c in columns:
                ratio = f"{hush[c] / plain[c]:.2f}x" if plain[c] else "-"
                cells.append(f"{plain[c]} / {hush[c]} ({ratio})")
            print(f"| {family} | {dtype_name} | {' | '.join(cells)} |", flush=True)
            if args.top:
                for c in ("plain", "hush"):
                    common = ", ".join(f"{n} {k}" for n, k in found[c].ops.most_common(args.top))
                    print(f"    {c} top ops: {common}")
                    print(f"    {c} casts: {dict(found[c].casts)}")
            if args.cuda_routes:
                cuda = census(
                    family,
                    dtype,
                    "hush",
                    args.batch,
                    args.seq,
                    args.warmup,
                    bool(args.breakdown),
                    True,
                    args.checkpointing,
                    autocast,
                )
                routed = cuda.summary()
                cells = [
                    f"{plain[c.split()[0]]} / {routed[c]} ({routed[c] / plain[c.split()[0]]:.2f}x)"
                    for c in ("kernels (CUDA)", "casts (CUDA)")
                ]
                print(
                    f"    CUDA routes: kernels {cells[0]}, casts {cells[1]} "
                    f"({cuda.emulated} emulation widenings left out; {routed['kernels']} kernels, "
                    f"{routed['casts']} casts dispatched here)"
                )
                found["hush (CUDA routes)"] = cuda
            if args.breakdown:
                for c in found:
                    for title, sites in (
                        ("kernels", found[c].kernel_sites),
                        ("casts", found[c].cast_sites),
                        ("views", found[c].view_sites),
                    ):
                        print(f"    {c} {title} by call site:")
                        for site, k in sites.most_common(args.breakdown):
                            print(f"      {k:5d}  {site}")


if __name__ == "__main__":
    main()
