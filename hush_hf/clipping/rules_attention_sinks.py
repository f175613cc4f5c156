"""Attention layers that own a few parameters of their own and return (output, weights): learnable sinks
(one extra softmax logit, or a sigmoid gate, per head) and PEFT's AdaptionPrompt (LLaMA-Adapter).

Granite-SWA and Granite-MoE-SWA (transformers 5.24) keep ``sinks`` (num_heads,) on the attention module and
read it inside their attention function, like GPT-OSS; the layer returns (output, weights). As for
GPT-OSS (``rules_moe.attention_sinks_grads``), the layer's own parameters (``sinks``) are differentiated
by the generic torch.func replay of its first output; its projections are nn.Linear submodules with their
own rules. Each example's attention reads only its own keys (the mask keeps rows apart), so the replay of
example i alone gives example i's gradient.

PEFT's ``AdaptedAttention`` (AdaptionPrompt) owns ``adaption_prompt`` (1, L, d), shared by the batch, and
``adaption_gate``: it runs the wrapped attention, projects the prompt with the wrapped (frozen) k/v
projections, repeats the keys and values over the batch and adds ``gate * softmax(q k_a^T) v_a`` to the
output. The prompt is shared, but each example's output reads it on its own, so the generic replay of one
example's call gives that example's gradient of both parameters. Its wrapped attention's projections are
frozen by PEFT (a trainable one would be hooked, and its calls on the shared prompt refused, on its own).

Registered by qualified class name, so importing this module does not import transformers.
"""

from __future__ import annotations

from hush_hf.clipping.registry import register_norm_rule
from hush_hf.clipping.rules_generic import generic_problem
from hush_hf.clipping.rules_moe import attention_sinks_grads

register_norm_rule(
    "transformers.models.granite_swa.modeling_granite_swa.GraniteSWAAttention",
    "transformers.models.granitemoe_swa.modeling_granitemoe_swa.GraniteMoeSWAAttention",
    "peft.tuners.adaption_prompt.layer.AdaptedAttention",
    check=generic_problem,
    records_call=True,
    output_index=0,
)(attention_sinks_grads)
