"""The precision float32 matrix products run in, and what it sets: the self-check's tolerance and the
clip margin of a float32 step.

``torch.set_float32_matmul_precision("high")``, ``torch.backends.cuda.matmul.allow_tf32 = True`` (or a
``fp32_precision`` of ``"tf32"``/``"bf16"``, on CUDA or for oneDNN on CPU) let float32 matrix products
round their operands to TF32 (10 explicit mantissa bits, unit roundoff 2^-11) or bf16 (2^-8). Then
float32 is no longer what sets the rounding gap between autograd's gradient and the one rebuilt from
the factors, nor between a per-example norm and the clipped gradient actually applied: every product
of both routes rounds its inputs like a low-precision dtype. The float32 figures (self-check 1e-4,
margin 2^-20) would refuse sound models (measured on an H200, GPT-2 124M with TF32 on: "self-check
failed ... c_proj.weight") and would not cover the norm's rounding.

A float32 step with reduced matmul precision is therefore treated like a bf16 step: the margin of
``CLIP_MARGINS[bfloat16]`` (2^-6, which covers bf16's own 2^-8 rounding with 4x headroom, so TF32's
2^-11 with 32x) and a self-check tolerance of 2^-6 (bf16's own measured gap was 1.1% of sum_i
||c_i g_i||; TF32 rounds 8x finer, so about 0.14% is expected, 2^-6 = 1.6% leaves ~10x; not yet
measured on a GPU). A parameter used outside its module that carries more than ~1.6% of the clipped
gradient is still refused (``tests/test_clipping_safety.py`` plants one under this tolerance).
"""

from __future__ import annotations

import torch

CHECK_RTOL = 1e-4
"""Self-check tolerance in float32+: per parameter, ||autograd - rebuilt|| <= 1e-4 * sum_i ||c_i g_i||
(measured gap: at most 3e-7)."""

CHECK_RTOL_REDUCED_MATMUL = 2.0**-6
"""Self-check tolerance for a float32 step whose matrix products may run in TF32/bf16 (see above)."""

CHECK_RTOL_REDUCED = 2.0**-4
"""Self-check tolerance under bf16/fp16: autograd's bf16 rounding alone made its gradient differ from
the rebuilt one by up to 1.1% of sum_i ||c_i g_i|| (one example per batch; 0.4% with 8), on the models
measured for ``CLIP_MARGINS``; 2^-4 = 6.25% leaves 5x headroom."""


def reduced_float32_matmuls(device_type: str) -> bool:
    """Whether float32 matrix products on ``device_type`` may round their operands below float32 under the
    settings in force now (``torch.get_float32_matmul_precision()`` other than ``"highest"``, which
    ``allow_tf32 = True`` also sets, or the backend's ``fp32_precision`` other than ``"ieee"``/``"none"``)."""
    if torch.get_float32_matmul_precision() != "highest":
        return True
    if device_type == "cuda":
        backend = torch.backends.cuda.matmul
        if getattr(backend, "allow_tf32", False):
            return True
    else:
        backend = getattr(torch.backends.mkldnn, "matmul", None)
    return getattr(backend, "fp32_precision", "none") not in ("none", "ieee")


def low_precision_step(dtype: torch.dtype, device_type: str) -> bool:
    """Whether a step whose narrowest floating dtype is ``dtype`` rounds like a low-precision one:
    bf16/fp16, or float32 with reduced-precision matrix products (float64 products never use TF32)."""
    if torch.finfo(dtype).bits < 32:
        return True
    return dtype == torch.float32 and reduced_float32_matmuls(device_type)


def check_rtol(dtype: torch.dtype, device_type: str) -> float:
    """The self-check's relative tolerance for a step of narrowest dtype ``dtype`` on ``device_type``."""
    if torch.finfo(dtype).bits < 32:
        return CHECK_RTOL_REDUCED
    if low_precision_step(dtype, device_type):
        return CHECK_RTOL_REDUCED_MATMUL
    return CHECK_RTOL
