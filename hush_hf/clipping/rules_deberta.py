"""DeBERTa's (v1 and v2) disentangled attention with ``relative_attention`` (read from transformers 5.24).

The encoder reads its relative-position table as one tensor (``rel_embeddings.weight``, then its
``LayerNorm`` when ``norm_rel_ebd`` asks), with no batch dimension, and passes it to every layer as
``rel_embeddings``; each attention projects it (v2: ``pos_key_proj``/``pos_query_proj``, or its own
``key_proj``/``query_proj`` when ``share_att_key``; v1: ``pos_proj``/``pos_q_proj``) as one (1, positions, d)
row and ``.repeat``s the result over the batch.

The projections are exact: whatever reaches them from the table does so inside this attention's call, so
example i's gradient of them is d/dtheta <attention(x_i, table; theta)[0], g_i>, with g_i example i's
gradient of the call's output. The attention is replayed one example at a time with torch.func
(``rules_generic.generic_grads``), the table held as it is (never split per example, even when its
length equals the batch size), differentiated w.r.t. those projections (under ``share_att_key`` also
w.r.t. their use on the content, which happens in the same call) and the attention's own parameters (v1:
``q_bias``, ``v_bias``). A dropout with p > 0 inside the attention is refused (a replay draws other masks).

The table itself (``rel_embeddings`` and its ``LayerNorm``) reaches the loss through every layer's call from
one tensor the batch shares, so no single call can record one example's part, and a per-example copy
cannot be handed in (the attention slices the table as a 2-D tensor and repeats its projection by
``batch * heads // heads``). Its rule is the encoder's: example i's gradient of the table's parameters is
d/dtheta <encoder(x_i; theta)[0], g_i>, with g_i example i's gradient of the last hidden state, the generic
replay of the whole encoder (``rules_generic.generic_grads``), differentiated w.r.t. the table alone. The sum
over the layers, cross terms included, is then exact by construction. It costs about one more forward and
backward of the encoder per step (no weight gradient), and needs every dropout in the encoder at 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.func import functional_call

from hush_hf.clipping.factors import PerExampleGrad
from hush_hf.clipping.registry import RecordedCall, register_norm_rule
from hush_hf.clipping.rules_generic import generic_grads, own_trainable, random_submodule

_MODELS = "transformers.models"
_PROJECTIONS = ("pos_key_proj", "pos_query_proj", "pos_proj", "pos_q_proj")


def _trainable(module: nn.Module, names: tuple[str, ...]) -> list[str]:
    found = []
    for name in names:
        sub = getattr(module, name, None)
        if isinstance(sub, nn.Module) and any(p.requires_grad for p in sub.parameters()):
            found.append(name)
    return found


def deberta_table_params(encoder: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The encoder's trainable table parameters (dotted): ``rel_embeddings.weight``, and its
    ``LayerNorm`` when ``norm_rel_ebd`` asks for it."""
    if not getattr(encoder, "relative_attention", False):
        return []
    names = ["rel_embeddings.weight"]
    if "layer_norm" in getattr(encoder, "norm_rel_ebd", ()):
        names += [f"LayerNorm.{n}" for n, _ in encoder.LayerNorm.named_parameters()]
    return [(n, encoder.get_parameter(n)) for n in names if encoder.get_parameter(n).requires_grad]


def deberta_table_problem(encoder: nn.Module) -> str | None:
    """A dropout anywhere in the encoder, which the encoder's replay could not reproduce; weights sharded
    by FSDP2, which the replay would read after the backward has resharded them."""
    names = dict.fromkeys(n.split(".")[0] for n, _ in deberta_table_params(encoder))
    if not names:
        return None
    freeze = " and ".join(f"encoder.{n}" for n in names)
    if any(isinstance(p, DTensor) for p in encoder.parameters()):
        return (
            f"its relative-position table ({', '.join(names)}) is differentiated by replaying the encoder "
            "after the backward, when FSDP2 (fully_shard) has resharded its weights; use DDP, or freeze "
            + freeze
        )
    random = random_submodule(encoder)
    if random is None:
        return None
    return (
        f"its relative-position table ({', '.join(names)}) is differentiated by replaying the encoder one "
        f"example at a time, which cannot reproduce its dropout ('{random}', p > 0); set "
        f"hidden_dropout_prob and attention_probs_dropout_prob to 0, or freeze {freeze} (the table then "
        "stays as pretrained)"
    )


@contextmanager
def _without_checkpointing(encoder: nn.Module) -> Iterator[None]:
    """The replay runs the layers plainly: it is one differentiable function under torch.func, and
    gradient checkpointing (a memory trade of the model's own backward) has nothing to save there."""
    layers = [m for m in encoder.modules() if getattr(m, "gradient_checkpointing", False) is True]
    for m in layers:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in layers:
            m.gradient_checkpointing = True


ENCODER_REPLAY_VALUES = 2**24
"""Most hidden-state values (examples x positions x width x layers) one replay of the encoder covers: its
forward keeps a few dozen tensors of that size for the backward, so a chunk holds a bounded share of what
the model's own forward holds (DeBERTa-v3-base at 512 positions: 3 examples at a time)."""


def deberta_table_grads(encoder: nn.Module, call: RecordedCall, g: Tensor) -> dict[str, PerExampleGrad]:
    """Example i's gradient of the table: d/dtheta <encoder(x_i; theta)[0], g_i>, the generic replay of
    the whole encoder differentiated w.r.t. the table's parameters only, ``ENCODER_REPLAY_VALUES`` at a
    time.

    Every layer reads the table, so its gradient is the sum of their contributions, with their cross
    terms: replaying the encoder (not each attention) gives that sum exactly. It costs about one more
    forward and backward of the encoder (without any weight's gradient) per step."""
    held = _FirstOutput(encoder, deberta_table_params(encoder), {})
    per_example = g[0].numel() * max(1, len(getattr(encoder, "layer", ())))
    with _without_checkpointing(encoder):
        grads = generic_grads(held, call, g, rows_at_once=max(1, ENCODER_REPLAY_VALUES // per_example))
    return {held.dotted[flat]: grad for flat, grad in grads.items()}


def _table_projections(attention: nn.Module) -> tuple[str, ...]:
    """The submodules that project the relative-position table inside this attention."""
    if not getattr(attention, "relative_attention", False):
        return ()
    return ("query_proj", "key_proj") if getattr(attention, "share_att_key", False) else _PROJECTIONS


def deberta_attention_params(attention: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """What the replay differentiates: the attention's own trainable parameters and those of the
    projections it applies to the table (dotted names)."""
    owned = own_trainable(attention)
    for name in _trainable(attention, _table_projections(attention)):
        sub = getattr(attention, name)
        owned += [(f"{name}.{n}", p) for n, p in sub.named_parameters() if p.requires_grad]
    return owned


def deberta_attention_problem(attention: nn.Module) -> str | None:
    """A dropout inside the replayed attention."""
    random = random_submodule(attention)
    if random is None:
        return None
    names = [n.split(".")[0] for n, _ in deberta_attention_params(attention)]
    return (
        f"its {', '.join(dict.fromkeys(names))} are differentiated by replaying the attention one example at "
        f"a time, which cannot reproduce its dropout ('{random}', p > 0); set attention_probs_dropout_prob "
        "and hidden_dropout_prob to 0, or freeze those parameters in every attention layer"
    )


class _FirstOutput(nn.Module):
    """``module(...)[0]`` with ``extra`` keyword arguments added to each call, owning ``params`` under flat
    names (the same Parameter objects; the module is held outside the module tree), so that the generic
    replay differentiates that output w.r.t. those parameters only."""

    def __init__(
        self, module: nn.Module, params: list[tuple[str, nn.Parameter]], extra: dict[str, object]
    ) -> None:
        super().__init__()
        object.__setattr__(self, "held", module)
        object.__setattr__(self, "extra", extra)
        self.dotted: dict[str, str] = {}
        for name, p in params:
            flat = name.replace(".", "__")
            self.register_parameter(flat, p)
            self.dotted[flat] = name

    def forward(self, *args: object, **kwargs: object) -> Tensor:
        theta = {dotted: getattr(self, flat) for flat, dotted in self.dotted.items()}
        return functional_call(self.held, theta, args, {**kwargs, **self.extra})[0]


def deberta_attention_grads(attention: nn.Module, call: RecordedCall, g: Tensor) -> dict[str, PerExampleGrad]:
    """Example i's gradient of the replayed parameters: the generic replay of output 0, table held."""
    kwargs = dict(call.kwargs)
    extra = {"rel_embeddings": kwargs.pop("rel_embeddings")} if "rel_embeddings" in kwargs else {}
    held = _FirstOutput(attention, deberta_attention_params(attention), extra)
    grads = generic_grads(held, replace(call, kwargs=kwargs), g)
    return {held.dotted[flat]: grad for flat, grad in grads.items()}


register_norm_rule(
    f"{_MODELS}.deberta_v2.modeling_deberta_v2.DebertaV2Encoder",
    f"{_MODELS}.deberta.modeling_deberta.DebertaEncoder",
    check=deberta_table_problem,
    records_call=True,
    output_index=0,
    owns=deberta_table_params,
)(deberta_table_grads)
register_norm_rule(
    f"{_MODELS}.deberta_v2.modeling_deberta_v2.DisentangledSelfAttention",
    f"{_MODELS}.deberta.modeling_deberta.DisentangledSelfAttention",
    check=deberta_attention_problem,
    records_call=True,
    output_index=0,
    owns=deberta_attention_params,
)(deberta_attention_grads)
