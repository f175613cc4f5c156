"""Per-example gradient clipping for Hugging Face models (ghost clipping, tied weights exact).

``GhostClipper(model, max_norm)`` hooks a plain HF model in place; ``clipped_backward(loss_i)``
adds sum_i min(1, C/||g_i||) g_i to ``p.grad`` (to a float32 sum beside a bf16/fp16 parameter until
the noise, see ``clipped_sums``). Rules for new layer types are registered with ``register_norm_rule``
(see ``registry``).
"""

# Importing the rule modules registers the built-in rules.
from hush_hf.clipping import (  # noqa: F401
    rules_attention_sinks,
    rules_deberta,
    rules_hf,
    rules_moe,
    rules_moe_dbrx,
    rules_moe_families,
    rules_peft,
    rules_positions,
    rules_rms_norm,
    rules_ssm,
    rules_torch,
)
from hush_hf.clipping.ghost import GhostClipper
from hush_hf.clipping.loss import example_cross_entropy
from hush_hf.clipping.registry import (
    UnsupportedLayerError,
    register_norm_rule,
    register_param_aliases,
)

__all__ = [
    "GhostClipper",
    "UnsupportedLayerError",
    "example_cross_entropy",
    "register_norm_rule",
    "register_param_aliases",
]
