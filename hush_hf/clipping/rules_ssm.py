"""State-space and short-convolution mixers (Mamba, Mamba2, FalconMamba, Jamba's and the hybrids' Mamba
layers, LFM2's short convolution): one per-example replay of the whole mixer.

Read from transformers 5.24: a mixer reads several of its submodules' parameters directly (``conv1d.weight``
and ``dt_proj`` inside the selective scan, ``conv.weight`` in ``causal_conv1d_fn``) and ``A_log``, ``D``,
``dt_bias`` inside the scan, so no single-layer rule sees those uses (the self-check caught them). The
mixer's rule owns every trainable parameter of its subtree and replays the mixer's own forward one example
at a time with torch.func (``rules_generic.generic_grads``: vmap over the batch, chunked by the same
budget), giving ``G_i = d/dtheta <mixer(theta, x_i), g_i>``. Each example's scan reads only its own row
(the state runs along the sequence, never across rows; padding enters through the per-row attention mask,
split with the row), so that is example i's gradient.

The replay runs without the cache object the forward got (it holds the whole batch's states): a training
forward starts from an empty cache (transformers builds it in the forward), and the mixers then compute
the same output with or without one; a one-token call with a cache (decoding) is refused.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from torch import Tensor, nn

from hush_hf.clipping.factors import PerExampleGrad
from hush_hf.clipping.registry import RecordedCall, register_norm_rule
from hush_hf.clipping.rules_generic import generic_grads, generic_problem, subtree_trainable

_CACHES = ("cache", "cache_params", "past_key_values", "cache_position")


def ssm_grads(mixer: nn.Module, call: RecordedCall, g: Tensor) -> dict[str, PerExampleGrad]:
    """The generic replay of the mixer over every trainable parameter of its subtree, without the cache."""
    kwargs = dict(call.kwargs)
    args = list(call.args)
    primary = call.primary
    for name in _CACHES:
        if kwargs.get(name) is not None:
            if name != "cache_position" and (primary is None or primary.dim() < 2 or primary.shape[1] < 2):
                raise ValueError(
                    f"{type(mixer).__name__} ran one position with a cache (decoding); per-example gradients "
                    "are taken of training forwards over whole sequences"
                )
            kwargs[name] = None
    # A cache passed positionally (a transformers Cache: it has ``update``) is dropped the same way.
    args = [a if isinstance(a, Tensor) or not hasattr(a, "update") else None for a in args]
    replayed = replace(call, args=tuple(args), kwargs=kwargs)
    return partial(generic_grads, owns=subtree_trainable)(mixer, replayed, g)


_MIXERS = (
    "mamba.modeling_mamba.MambaMixer",
    "mamba2.modeling_mamba2.Mamba2Mixer",
    "falcon_mamba.modeling_falcon_mamba.FalconMambaMixer",
    "jamba.modeling_jamba.JambaMambaMixer",
    "lfm2.modeling_lfm2.Lfm2ShortConv",
    "bamba.modeling_bamba.BambaMixer",
    "falcon_h1.modeling_falcon_h1.FalconH1Mixer",
    "zamba2.modeling_zamba2.Zamba2MambaMixer",
    "granitemoehybrid.modeling_granitemoehybrid.GraniteMoeHybridMambaLayer",
)
register_norm_rule(
    *(f"transformers.models.{name}" for name in _MIXERS),
    check=generic_problem,
    records_call=True,
    owns=subtree_trainable,
)(ssm_grads)
