"""A float32 step's time on a GPU predicted from what it dispatches: each kernel's FLOPs and bytes.

    .venv/bin/python bench/step_roofline.py [--bandwidth 3.0 4.0 4.8]

``bench/step_flops.py`` counts a step's matrix FLOPs, which bound a float32 step on a GPU; but a DP step
also streams per-example gradients, Gram matrices and their float64 sums through memory, which FLOPs do
not see. This counts, for every kernel one full step dispatches (a ``TorchDispatchMode`` below autograd;
views and metadata left out, as in ``op_census``), its FLOPs (``torch.utils.flop_counter``'s formulas)
and the bytes of the tensors it reads and writes (an in-place operand once), and prices it on a roofline:
``max(FLOPs / R, bytes / W)`` plus a launch floor, summed over the step. W is the memory bandwidth
(``--bandwidth``, TB/s: an H200 streams about 4 of its nominal 4.8); R, the matrix rate, is solved so
that the plain step takes the time measured on the H200 (docs/benchmarks.md, "The step table") at that
precision: the prediction for hush_hf is then a ratio to plain that the measured plain time anchors.

The models of ``bench/gpu_step.py`` are built at their widths and sequence lengths with 2 and 3 layers
and batches of 2 and 3 (every kernel's FLOPs and bytes are affine in both), and the step's time is
extrapolated to the GPU table's depth and batch. float32 only (fp32 and TF32 rows: the same kernels,
another R); this CPU multiplies bf16 at under 1 GFLOP/s.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_step  # noqa: E402
import op_census  # noqa: E402
from step_flops import LAYERS  # noqa: E402

MEASURED_PLAIN_SECONDS = {("gpt2", "fp32"): 0.322, ("gpt2", "tf32"): 0.137}
"""The plain step's time on the H200 (docs/benchmarks.md, "The step table"): R is solved to give it."""

MEASURED_HUSH_SECONDS = {("gpt2", "fp32"): 0.396, ("gpt2", "tf32"): 0.164}
"""hush_hf's measured time on the same run (tree of 2026-11-28, before the 5/4 rule): what a prediction
for that tree is checked against."""

LAUNCH_SECONDS = 3e-6
"""The least time a kernel takes on the device, however small (launch and tail)."""


def _widened_copy(inputs: list[torch.Tensor], dtype: torch.dtype | None) -> int:
    """The bytes of the copy a CUDA reduction makes of its input when asked for another ``dtype``
    (``torch.sum(x, dtype=torch.float64)`` converts ``x`` first; only a bf16/fp16 input summed into float32
    is read as it is), which this CPU's kernels do not dispatch; 0 when there is none."""
    if dtype is None or not inputs or inputs[0].dtype == dtype:
        return 0
    if dtype == torch.float32 and inputs[0].dtype in (torch.bfloat16, torch.float16):
        return 0
    return inputs[0].numel() * dtype.itemsize


class KernelCosts(TorchDispatchMode):
    """Each kernel's (FLOPs, bytes) of one step, in dispatch order."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[tuple[int, int]] = []
        self.names: list[str] = []  # each kernel's operation

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        if func.is_view or name in op_census.NO_KERNEL:
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
            self.kernels.append((0, inputs[0].numel() * inputs[0].element_size() + widened))
            self.names.append("_to_copy (in the reduction)")
            moved += widened - inputs[0].numel() * inputs[0].element_size()
        self.kernels.append((int(flops), int(moved)))
        self.names.append(name)
        return out


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
    saved = {name: getattr(factors, name) for name in patches if hasattr(factors, name)}
    for name in saved:
        setattr(factors, name, patches[name])
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(factors, name, value)


def step_costs(
    name: str,
    contender: str,
    layers: int,
    batch: int,
    warmup: int = 2,
    smoke: bool = False,
    tf32: bool = False,
) -> list[tuple[int, int]]:
    """(FLOPs, bytes) of every kernel of one ``contender`` step, ``gpu_step.MODELS[name]`` with ``layers``
    layers and ``batch`` sequences (after ``warmup`` steps: the self-check's), by the engine's GPU routes
    (``gpu_routes``)."""
    family, tied, _, seq, lora, checkpointing = gpu_step.MODELS[name]
    if smoke:
        seq = 16
    torch.manual_seed(0)
    model, causal = gpu_step.build_model(family, tied, seq, lora, "cpu", smoke, layers)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    step = op_census.step_of(model.train(), causal, contender, batch, seq)
    with gpu_routes(tf32):
        for k in range(warmup):
            step(k)
        costs = KernelCosts()
        with costs:
            step(warmup)
    return costs.kernels


def seconds(kernels: list[tuple[int, int]], rate: float, bandwidth: float) -> float:
    """The roofline time of a list of kernels: ``sum max(F / rate, B / bandwidth, LAUNCH_SECONDS)``."""
    return sum(max(f / rate, b / bandwidth, LAUNCH_SECONDS) for f, b in kernels)


SHALLOW = (2, 3)
"""The layer counts and the batch sizes counted. Not 1: transformers runs a single sequence without an
attention mask, and the engine batches the Gram matrices of two or more uses of one shape together (a
stacking copy that one use alone does not make), so a 1-layer or 1-sequence step is off the line."""


@dataclass(frozen=True)
class Extrapolated:
    """A step's kernels counted at ``SHALLOW`` layers and batches: ``at(L, b)`` is its roofline time
    bilinearly extrapolated to ``L`` layers and batch ``b`` (exact when each layer and each sequence adds
    the same kernels: the FLOPs and bytes of all of them are affine in both)."""

    runs: dict[tuple[int, int], list[tuple[int, int]]]

    def at(self, layers: int, batch: int, rate: float, bandwidth: float) -> float:
        return self.extrapolate(layers, batch, lambda kernels: seconds(kernels, rate, bandwidth))

    def extrapolate(self, layers: int, batch: int, value: Callable[[list[tuple[int, int]]], float]) -> float:
        """``value`` of the step's kernels, bilinearly extrapolated from the counted runs."""
        (l0, l1), (b0, b1) = SHALLOW, SHALLOW
        t = {key: value(kernels) for key, kernels in self.runs.items()}
        x, y = (layers - l0) / (l1 - l0), (batch - b0) / (b1 - b0)
        return (
            t[l0, b0]
            + x * (t[l1, b0] - t[l0, b0])
            + y * (t[l0, b1] - t[l0, b0])
            + x * y * (t[l1, b1] - t[l1, b0] - t[l0, b1] + t[l0, b0])
        )


def counted(
    name: str, contender: str, warmup: int = 2, smoke: bool = False, tf32: bool = False
) -> Extrapolated:
    runs = {(n, b): step_costs(name, contender, n, b, warmup, smoke, tf32) for n in SHALLOW for b in SHALLOW}
    return Extrapolated(runs)


def solve_rate(plain: Extrapolated, layers: int, batch: int, bandwidth: float, target: float) -> float:
    """The matrix rate R (FLOP/s) at which the plain step's roofline time is ``target`` seconds (it falls as
    R grows): bisection on a log scale."""
    low, high = 1e11, 1e17
    for _ in range(200):
        mid = (low * high) ** 0.5
        if plain.at(layers, batch, mid, bandwidth) > target:
            low = mid
        else:
            high = mid
    return (low * high) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bandwidth", type=float, nargs="+", default=[3.0, 4.0, 4.8], help="TB/s")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(f"roofline of one step, float32 kernels, torch {torch.__version__}")
    print("| model, batch | precision | W (TB/s) | R (TFLOP/s) | plain | hush_hf predicted | measured |")
    print("|---|---|---|---|---|---|---|")
    import hush_hf.clipping.factors as factors

    routes_differ = hasattr(factors, TF32_ROUTES)  # an earlier tree's engine: TF32 counted apart
    for name in ("gpt2",):  # the row measured in fp32 and TF32
        family, _, batch, seq, _, _ = gpu_step.MODELS[name]
        layers = LAYERS[family]
        plain = counted(name, "plain", args.warmup)  # the same kernels under TF32
        hush_fp32 = counted(name, "hush", args.warmup)
        for precision in ("fp32", "tf32"):
            target = MEASURED_PLAIN_SECONDS[family, precision]
            tf32 = precision == "tf32" and routes_differ
            hush = counted(name, "hush", args.warmup, tf32=True) if tf32 else hush_fp32
            measured = MEASURED_HUSH_SECONDS.get((family, precision))
            for tb in args.bandwidth:
                rate = solve_rate(plain, layers, batch, tb * 1e12, target)
                predicted = hush.at(layers, batch, rate, tb * 1e12)
                seen = f"{measured:.3f} s ({measured / target:.2f}x, earlier tree)" if measured else ""
                print(
                    f"| {name}, {batch}x{seq} | {precision} | {tb:.1f} | {rate / 1e12:.1f} | "
                    f"{target:.3f} s | {predicted:.3f} s (**{predicted / target:.3f}x**) | {seen} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
