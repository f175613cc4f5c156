"""A step's time on a GPU predicted from what it dispatches: each kernel's FLOPs and bytes.

    .venv/bin/python bench/step_roofline.py [--rows gpt2/fp32 gpt2/tf32 gpt2-tied/bf16 llama-1b/bf16 ...]
                                            [--bandwidth 3.0 4.0 4.8]

``bench/step_flops.py`` counts a step's matrix FLOPs, which bound a float32 step on a GPU; but a DP step
also streams per-example gradients, Gram matrices and their float64 sums through memory, which FLOPs do
not see. This counts, for every kernel one full step dispatches (a ``TorchDispatchMode`` below autograd;
views, metadata and allocations left out), its FLOPs (``torch.utils.flop_counter``'s formulas) and the
bytes of the tensors it reads and writes (an in-place operand once), and prices it on a roofline:
``max(FLOPs / R, bytes / W)`` plus a launch floor, summed over the step. W is the memory bandwidth
(``--bandwidth``, TB/s: an H200's nominal is 4.8); R, the matrix rate, is solved so that the plain step
takes the time measured on the H200 (docs/benchmarks.md, "The step table") for that row: the prediction
for hush_hf is then a ratio to plain that the measured plain time anchors, and no hush_hf time enters it.

The models of ``bench/gpu_step.py`` are built at their widths and sequence lengths with 2 and 3 layers
and batches of 2 and 3 (every kernel's FLOPs and bytes are affine in both), and the step's time is
extrapolated to the GPU table's depth and batch, by the engine's GPU routes (``gpu_routes``). A bf16
row's matrix products (and attention) are not computed: this CPU multiplies bf16 at under 1 GFLOP/s. Each
returns a tensor of its output's shape, strides and dtype, filled with a constant, and is priced as it
is; the CUDA-only ``out_dtype`` products of ``float32_products`` likewise (bf16 operands, float32
output). The step's values are then meaningless, so its first-call self-check is skipped; its routes
depend on sizes and on which steps carry a target, which the fake products keep.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.flop_counter import flop_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_step  # noqa: E402
import op_census  # noqa: E402
from step_flops import LAYERS, shallow_model  # noqa: E402

H200 = {
    ("gpt2", "fp32"): (0.322, 0.396, 322.7, 390.7),
    ("gpt2", "tf32"): (0.137, 0.164, 138.0, 160.2),
    ("gpt2-tied", "bf16"): (0.086, 0.154, 84.9, 146.0),
    ("llama-1b", "bf16"): (0.118, 0.223, 124.7, 217.2),
    ("llama-1b-lora", "bf16"): (0.112, 0.159, 111.1, 110.0),
    ("llama-1b-lora-ckpt", "bf16"): (0.157, 0.562, 148.1, 259.4),
}
"""Per (``gpu_step.MODELS`` row, precision), on the H200 (docs/benchmarks.md, "The step table" and "Where the
time goes"), the tree of 2026-11-28: plain's and hush_hf's wall seconds, then their device milliseconds
under the profiler. R is solved from plain's wall time; the rest is what a prediction for that tree is
checked against (LoRA's hush_hf steps were bound by the host, so there their device time is the one)."""

LAUNCH_SECONDS = 3e-6
"""The least time a kernel takes on the device, however small (launch and tail)."""

MISALIGNED_RATE = 150e12
"""FLOP/s of a bf16/fp16 matrix product with an operand or result whose rows are not 16-byte aligned (at
most R): the H200's measured rate for GPT-2's vocabulary-wide weight gradient (1.27 TFLOP in 8.4 ms,
docs/benchmarks.md, "Where the time goes"), which cuBLAS ran on older kernels: Hopper's TMA-fed ones
need 16-byte strides, and 50,257 bf16 entries are 100,514 bytes."""


def misaligned(tensors: list[torch.Tensor]) -> bool:
    """Whether a 16-bit matrix among ``tensors`` (a product's operands and result) has rows that do not
    start 16 bytes apart, or no unit stride in its last two dimensions."""
    for t in tensors:
        if t.dtype not in (torch.bfloat16, torch.float16) or t.dim() < 2:
            continue
        rows, cols = t.stride()[-2:]
        if 1 not in (rows, cols) or (max(rows, cols) * t.element_size()) % 16:
            return True
    return False


def _widened_copy(inputs: list[torch.Tensor], dtype: torch.dtype | None) -> int:
    """The bytes of the copy a CUDA reduction makes of its input when asked for another ``dtype``
    (``torch.sum(x, dtype=torch.float64)`` converts ``x`` first; only a bf16/fp16 input summed into float32
    is read as it is), which this CPU's kernels do not dispatch; 0 when there is none."""
    if dtype is None or not inputs or inputs[0].dtype == dtype:
        return 0
    if dtype == torch.float32 and inputs[0].dtype in (torch.bfloat16, torch.float16):
        return 0
    return inputs[0].numel() * dtype.itemsize


ALLOCATIONS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}
"""Dispatched operations that launch no kernel (an allocation)."""

FAKE_VALUE = 2.0**-6
"""What a fake product's output holds: finite, nonzero, exact in every float dtype."""


def _is_product(name: str) -> bool:
    return name in op_census.MATMULS or "scaled_dot_product" in name


def _filled_like(meta: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype).fill_(FAKE_VALUE)


def _fake(func, args, kwargs):
    """``func``'s outputs, shaped, strided and typed as it would make them (from its meta kernel), holding
    ``FAKE_VALUE``; an ``out=`` tensor is filled in place."""
    if isinstance(kwargs.get("out"), torch.Tensor):
        return kwargs["out"].fill_(FAKE_VALUE)
    meta_args, meta_kwargs = pytree.tree_map_only(
        torch.Tensor,
        lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"),
        (args, kwargs),
    )
    return pytree.tree_map_only(torch.Tensor, _filled_like, func(*meta_args, **meta_kwargs))


class KernelCosts(TorchDispatchMode):
    """Each kernel's (FLOPs, bytes) of one step, in dispatch order. ``fake``: matrix products and attention
    are not computed (``_fake``), only priced."""

    active: list[KernelCosts] = []  # the modes entered, innermost last

    def __init__(self, fake: bool = False) -> None:
        super().__init__()
        self.fake = fake
        self.kernels: list[tuple] = []
        self.names: list[str] = []  # each kernel's operation

    def __enter__(self):
        KernelCosts.active.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        KernelCosts.active.remove(self)
        return super().__exit__(*exc)

    def record(self, flops: int, moved: int, name: str, slow: bool = False) -> None:
        """One kernel; ``slow``: a product priced at ``MISALIGNED_RATE`` (a third entry, True)."""
        self.kernels.append((int(flops), int(moved), True) if slow else (int(flops), int(moved)))
        self.names.append(name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        out = _fake(func, args, kwargs) if self.fake and _is_product(name) else func(*args, **kwargs)
        if func.is_view or name in op_census.NO_KERNEL or name in ALLOCATIONS:
            return out
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        written = [
            t
            for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and not any(t is i for i in inputs)  # in place: counted once
        ]
        moved = sum(t.numel() * t.element_size() for t in inputs + written)
        packet = func._overloadpacket
        flops = flop_registry[packet](*args, **kwargs, out_val=out) if packet in flop_registry else 0
        widened = _widened_copy(inputs, kwargs.get("dtype"))
        if widened:  # the copy: a kernel that reads the input and writes it widened, which the op reads
            self.record(0, inputs[0].numel() * inputs[0].element_size() + widened, "_to_copy (in reduction)")
            moved += widened - inputs[0].numel() * inputs[0].element_size()
        self.record(flops, moved, name, slow=_is_product(name) and misaligned(inputs + written))
        return out


def _out_float32(product):
    """The emulation of a CUDA ``out_dtype`` product (``op_census.cuda_routes``): bf16/fp16 operands, a
    float32 output of ``FAKE_VALUE``, one kernel priced in the innermost ``KernelCosts``."""

    def run(*tensors: torch.Tensor, beta: int = 0, **scalars) -> torch.Tensor:
        *rest, a, b = tensors  # addmm: (out, a, b), in place; it reads ``out`` too unless beta = 0
        with _disable_current_modes():
            out = rest[0] if rest else torch.empty((*a.shape[:-1], b.shape[-1]), dtype=torch.float32)
            out.fill_(FAKE_VALUE)
        flops = 2 * a.numel() * b.shape[-1]  # (..., n, k) @ (..., k, m): 2 n k m per batch entry
        moved = a.nbytes + b.nbytes + out.nbytes * (2 if rest and beta else 1)
        slow = misaligned([a, b, out])
        KernelCosts.active[-1].record(flops, moved, f"{product.__name__} (out_dtype)", slow=slow)
        return out

    return run


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """The engine's first-call self-check skipped: it compares values, which fake products do not have."""
    from hush_hf.clipping.ghost import GhostClipper

    def no_check(self, loss):
        self._unverified.clear()
        return set()

    with op_census.patched([(GhostClipper, "_names_to_check", no_check)]):
        yield


TF32_ROUTES = "reduced_float32_matmuls"
"""What an engine that takes other routes under TF32 asks (in ``factors``); the present one does not."""


@contextlib.contextmanager
def gpu_routes(tf32: bool) -> Iterator[None]:
    """The engine takes the routes it takes on a GPU, on this CPU: a kept gradient's norm streams its block
    (``factors.CHUNKED_NORM_DEVICES``: on CPU it goes a cache-sized chunk at a time, hundreds of kernels at
    these sizes), every packed gradient is joined (``JOIN_BELOW``); under ``tf32``, an engine that chooses
    its routes by the float32 matmul precision (``reduced_float32_matmuls``: the tree the H200 measured
    kept the 5/4 band in ghost form under TF32) sees reduced products. An attribute that the imported
    engine lacks is left alone."""
    import hush_hf.clipping.factors as factors

    # (An engine without CHUNKED_NORM_DEVICES chunked on CPU alone by _NORM_CHUNK_BYTES: one chunk, as a GPU.)
    patches = {"CHUNKED_NORM_DEVICES": frozenset(), "JOIN_BELOW": {}, "_NORM_CHUNK_BYTES": 2**62}
    if tf32:
        patches[TF32_ROUTES] = lambda device_type: True
    with op_census.patched([(factors, name, value) for name, value in patches.items()]):
        yield


@contextlib.contextmanager
def grouped_as_at(batch: int, target: int) -> Iterator[None]:
    """The engine groups work as it would at ``target`` sequences while a step of ``batch`` is counted: its
    byte budgets that decide by a whole batch's size (``gram_batches.BATCH_BYTES``: uses whose Gram
    matrices, clipped sums or norm-layer rules are stacked together; ``factors.GROUPED_NORM_FROM_BYTES``:
    a kept gradient's one-pass norm) scaled by batch / target. What they compare grows with the batch (a
    clipped sum's footprint also holds its weight-sized result, so there it is close, not exact). Without
    it a step counted at 2 and 3 sequences stacks uses that the GPU table's batch runs one at a time, and
    the extrapolation carries those stacking copies to the table's batch. A budget the imported engine
    lacks is left alone."""
    import hush_hf.clipping.factors as factors
    import hush_hf.clipping.gram_batches as gram_batches

    scale = batch / target
    budgets = ((gram_batches, "BATCH_BYTES"), (factors, "GROUPED_NORM_FROM_BYTES"))
    present = [(owner, name) for owner, name in budgets if hasattr(owner, name)]
    with op_census.patched([(owner, name, int(getattr(owner, name) * scale)) for owner, name in present]):
        yield


def step_costs(
    name: str,
    contender: str,
    layers: int,
    batch: int,
    warmup: int = 2,
    smoke: bool = False,
    precision: str = "fp32",
) -> list[tuple]:
    """(FLOPs, bytes) of every kernel of one ``contender`` step, ``gpu_step.MODELS[name]`` with ``layers``
    layers and ``batch`` sequences (after ``warmup`` steps: the self-check's), by the engine's GPU routes
    (``gpu_routes``), its uses grouped as at the GPU table's batch (``grouped_as_at``); ``precision``
    ``"bf16"``: a bf16 model whose products are faked (module docstring)."""
    model, causal, seq = shallow_model(name, layers, smoke)
    target = gpu_step.MODELS[name][2]
    bf16 = precision == "bf16"
    if bf16:
        model = model.to(torch.bfloat16)
    step = op_census.step_of(model.train(), causal, contender, batch, seq)
    faked = contextlib.ExitStack()
    if bf16:
        faked.enter_context(op_census.cuda_routes(_out_float32))
        faked.enter_context(unchecked())
    with faked, gpu_routes(precision == "tf32"), grouped_as_at(batch, target):
        with KernelCosts(fake=True) if bf16 else contextlib.nullcontext():  # only faking, in the warm-up
            for k in range(warmup):
                step(k)
        costs = KernelCosts(fake=bf16)
        with costs:
            step(warmup)
    return costs.kernels


def seconds(kernels: list[tuple], rate: float, bandwidth: float) -> float:
    """The roofline time of a list of kernels: ``sum max(F / rate, B / bandwidth, LAUNCH_SECONDS)``, a
    misaligned product's F at ``min(rate, MISALIGNED_RATE)``."""
    slow = min(rate, MISALIGNED_RATE)
    return sum(max(k[0] / (slow if len(k) > 2 else rate), k[1] / bandwidth, LAUNCH_SECONDS) for k in kernels)


SHALLOW = (2, 3)
"""The layer counts and the batch sizes counted. Not 1: transformers runs a single sequence without an
attention mask, and the engine batches the Gram matrices of two or more uses of one shape together (a
stacking copy that one use alone does not make), so a 1-layer or 1-sequence step is off the line."""


@dataclass(frozen=True)
class Extrapolated:
    """A step's kernels counted at ``SHALLOW`` layers and batches: ``at(L, b)`` is its roofline time
    bilinearly extrapolated to ``L`` layers and batch ``b`` (exact when each layer and each sequence adds
    the same kernels: the FLOPs and bytes of all of them are affine in both)."""

    runs: dict[tuple[int, int], list[tuple]]

    def at(self, layers: int, batch: int, rate: float, bandwidth: float) -> float:
        (l0, l1), (b0, b1) = SHALLOW, SHALLOW
        t = {key: seconds(kernels, rate, bandwidth) for key, kernels in self.runs.items()}
        x, y = (layers - l0) / (l1 - l0), (batch - b0) / (b1 - b0)
        return (
            t[l0, b0]
            + x * (t[l1, b0] - t[l0, b0])
            + y * (t[l0, b1] - t[l0, b0])
            + x * y * (t[l1, b1] - t[l1, b0] - t[l0, b1] + t[l0, b0])
        )


def counted(
    name: str, contender: str, warmup: int = 2, smoke: bool = False, precision: str = "fp32"
) -> Extrapolated:
    runs = {
        (n, b): step_costs(name, contender, n, b, warmup, smoke, precision) for n in SHALLOW for b in SHALLOW
    }
    return Extrapolated(runs)


def solve_rate(plain: Extrapolated, layers: int, batch: int, bandwidth: float, target: float) -> float | None:
    """The matrix rate R (FLOP/s) at which the plain step's roofline time is ``target`` seconds (it falls as
    R grows): bisection on a log scale. None when no R reaches it: the step's memory time, launches and
    misaligned products (``MISALIGNED_RATE``) take longer than ``target`` at this bandwidth already."""
    low, high = 1e11, 1e17
    if plain.at(layers, batch, high, bandwidth) > target:
        return None
    for _ in range(200):
        mid = (low * high) ** 0.5
        if plain.at(layers, batch, mid, bandwidth) > target:
            low = mid
        else:
            high = mid
    return (low * high) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    rows = [f"{name}/{precision}" for name, precision in H200]
    parser.add_argument("--rows", nargs="+", default=rows, choices=rows)
    parser.add_argument("--bandwidth", type=float, nargs="+", default=[3.0, 4.0, 4.8], help="TB/s")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import hush_hf.clipping.factors as factors

    routes_differ = hasattr(factors, TF32_ROUTES)  # an earlier tree's engine: TF32 counted apart
    print(f"roofline of one step, torch {torch.__version__}")
    header = "model, batch | precision | W (TB/s) | R (TFLOP/s) | plain | hush_hf predicted"
    header += " | H200 (its tree): wall, device"
    print(f"| {header} |")
    print("|---|---|---|---|---|---|---|")
    counts: dict[tuple[str, str], Extrapolated] = {}
    for row in args.rows:
        name, precision = row.split("/")
        family, _, batch, seq, _, _ = gpu_step.MODELS[name]
        layers = LAYERS[family]
        kind = "bf16" if precision == "bf16" else "fp32"  # fp32's kernels run again under TF32
        if (name, kind) not in counts:
            counts[name, kind] = counted(name, "plain", args.warmup, precision=kind)
        hush_kind = "tf32" if precision == "tf32" and routes_differ else kind
        if (name, "hush " + hush_kind) not in counts:
            counts[name, "hush " + hush_kind] = counted(name, "hush", args.warmup, precision=hush_kind)
        plain, hush = counts[name, kind], counts[name, "hush " + hush_kind]
        plain_s, hush_s, plain_ms, hush_ms = H200[name, precision]
        for tb in args.bandwidth:
            rate = solve_rate(plain, layers, batch, tb * 1e12, plain_s)
            measured = f"{hush_s / plain_s:.2f}x, {hush_ms / plain_ms:.2f}x"
            row = f"| {name}, {batch}x{seq} | {precision} | {tb:.1f} |"
            if rate is None:
                print(
                    f"{row} none fits | {plain_s:.3f} s | (plain's floor at this W is longer) | {measured} |"
                )
                continue
            predicted = hush.at(layers, batch, rate, tb * 1e12)
            print(
                f"{row} {rate / 1e12:.1f} | {plain_s:.3f} s | "
                f"{predicted:.3f} s (**{predicted / plain_s:.3f}x**) | {measured} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
