"""Attention layers that own learnable sinks (one extra softmax logit, or a sigmoid gate, per head).

Granite-SWA and Granite-MoE-SWA (transformers 5.24) keep ``sinks`` (num_heads,) on the attention module and
read it inside their attention function, like GPT-OSS; the layer returns (output, weights). As for
GPT-OSS (``rules_moe.attention_sinks_grads``), the layer's own parameters (``sinks``) are differentiated
by the generic torch.func replay of its first output; its projections are nn.Linear submodules with their
own rules. Each example's attention reads only its own keys (the mask keeps rows apart), so the replay of
example i alone gives example i's gradient.

Registered by qualified class name, so importing this module does not import transformers.
"""

from __future__ import annotations

from hush_hf.clipping.registry import register_norm_rule
from hush_hf.clipping.rules_generic import generic_problem
from hush_hf.clipping.rules_moe import attention_sinks_grads

register_norm_rule(
    "transformers.models.granite_swa.modeling_granite_swa.GraniteSWAAttention",
    "transformers.models.granitemoe_swa.modeling_granitemoe_swa.GraniteMoeSWAAttention",
    check=generic_problem,
    records_call=True,
    output_index=0,
)(attention_sinks_grads)
