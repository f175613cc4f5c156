"""What the DP step feeds the model and which per-example loss it clips (Hush Alg. 2, line 9).

Both follow what the model itself computes, never its class name:

- the loss: the token cross-entropy of the model's own loss, split per example. Which tokens are
  scored against which logits is read from the model under any wrapper (PEFT, DDP):
  encoder-decoder models score decoder position t against label t (decoder inputs are the labels
  shifted right, built by the model); other models use the loss their forward calls
  (transformers' ``loss_type``: causal LMs predict token t+1 at position t, masked LMs position t).
  On the first batch of each model the split is checked against the model's own loss on that batch.
- the positions: the ones the model's default forward uses. Ghost clipping needs every layer with
  trainable parameters to see the batch in dimension 0, and some models build position ids of
  shape (1, seq) shared by the batch (GPT-2, BERT; Nystromformer's start at 2); for those the same
  positions are passed per row.
  Models that derive positions per row themselves (RoBERTa and XLM-R from input_ids with the
  padding_idx + 1 offset, OPT from the attention mask) get nothing passed. Which case holds is
  found by running the model's default forward once (no gradient) and looking at the layers' inputs.
"""

from __future__ import annotations

import inspect
import math
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from hush_hf.clipping import example_cross_entropy
from hush_hf.clipping.loss import IGNORE_INDEX
from hush_hf.clipping.registry import rule_for

PerExampleLoss = Callable[[nn.Module, dict[str, Any]], Tensor]

CAUSAL, MASKED, SEQ2SEQ = "causal", "masked", "seq2seq"

_LOSS_RTOL = 1e-4
"""The per-example split must reproduce the model's own token-mean loss to this relative error (the
two differ only in summation order; shifted and unshifted scoring differ by far more)."""

_VERIFIED: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
_POSITIONS: weakref.WeakKeyDictionary[nn.Module, int | None] = weakref.WeakKeyDictionary()


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside PEFT (``get_base_model``), DDP/DataParallel (``module``) and torch.compile
    (``_orig_mod``) wrappers, repeatedly."""
    for _ in range(16):
        inner: Any = None
        get_base = getattr(model, "get_base_model", None)
        if callable(get_base):
            inner = get_base()
        elif isinstance(getattr(model, "module", None), nn.Module):
            inner = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            inner = model._orig_mod
        if not isinstance(inner, nn.Module) or inner is model:
            return model
        model = inner
    return model


def loss_kind(model: nn.Module) -> str:
    """``"seq2seq"``, ``"causal"`` or ``"masked"``: how the model's own loss pairs logits with labels.

    Read from the unwrapped model: its config's ``is_encoder_decoder``, else the loss its forward
    calls (transformers resolves ``loss_type``; an unrecognised or missing one means its causal-LM
    loss). A model with a custom ``loss_function`` or a non-LM loss is refused, and so is a
    mixture-of-experts model whose loss adds the batch-wide router load-balancing loss.
    """
    base = unwrap_model(model)
    config = getattr(base, "config", None)
    if getattr(config, "output_router_logits", False) is True:
        raise ValueError(
            f"{type(base).__name__} has output_router_logits=True: its loss adds the routers' load-balancing "
            "loss, a function of every token's routing in the batch, so it is not a loss per example; set "
            "model.config.output_router_logits = False (the DP step trains on the per-example LM loss) or "
            "pass per_example_loss= with an auxiliary term computed per example"
        )
    if getattr(config, "is_encoder_decoder", False):
        return SEQ2SEQ
    if "_loss_function" in vars(base):
        raise ValueError(
            f"{type(base).__name__} has a custom loss_function, so its per-example split is unknown: "
            "pass per_example_loss= (or override compute_per_example_loss)"
        )
    from transformers.loss.loss_utils import LOSS_MAPPING

    loss_type = getattr(base, "loss_type", None)
    if loss_type == "ForMaskedLM":
        return MASKED
    if loss_type is None or loss_type not in LOSS_MAPPING or loss_type == "ForCausalLM":
        return CAUSAL
    raise ValueError(
        f"{type(base).__name__} computes a {loss_type} loss, not a language-modelling loss: pass "
        "per_example_loss= (or override compute_per_example_loss) with a loss per example"
    )


def is_causal_lm(model: nn.Module) -> bool:
    """Whether the model predicts token t+1 at position t (see ``loss_kind``)."""
    return loss_kind(model) == CAUSAL


_ARGUMENTS: weakref.WeakKeyDictionary[nn.Module, frozenset[str]] = weakref.WeakKeyDictionary()


def accepts_argument(model: nn.Module, name: str) -> bool:
    """Whether ``model.forward`` takes ``name`` (its signature read once per model: ``inspect`` costs ~4 ms
    per call on transformers' wrapped forwards, once per micro-batch)."""
    if model not in _ARGUMENTS:
        _ARGUMENTS[model] = frozenset(inspect.signature(model.forward).parameters)
    return name in _ARGUMENTS[model]


def _first_tensor_input(args: tuple, kwargs: dict) -> Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            return value
    return None


def _taken_over(model: nn.Module) -> set[int]:
    """Ids of the parameters whose calls the clipping engine does not record on their own: a layer's rule
    covers them (``owns``, e.g. DeBERTa's table projections, replayed with their attention; ``injects``,
    e.g. T5's relative-position table), so a shared input of their own calls is no position to pass."""
    taken: set[int] = set()
    for module in model.modules():
        rule = rule_for(type(module))
        if rule is None:
            continue
        names = [n for n, _ in rule.owns(module)] if rule.owns is not None else []
        names += rule.injects.params(module) if rule.injects is not None else []
        # (a submodule's parameter, dotted; the layer's own stay probed with the layer)
        taken |= {id(module.get_parameter(n)) for n in names if "." in n}
    return taken


def _probe(model: nn.Module, inputs: dict[str, Any]) -> list[tuple[nn.Module, Tensor]]:
    """(layer, first tensor input) of every call of a layer holding trainable parameters, in call
    order, in one forward without gradient."""
    seen: list[tuple[nn.Module, Tensor]] = []

    def record(module: nn.Module, args: tuple, kwargs: dict) -> None:
        x = _first_tensor_input(args, kwargs)
        if x is not None:
            seen.append((module, x.detach().clone()))

    taken = _taken_over(model)
    owners = {
        id(m): m
        for m in model.modules()
        if any(p.requires_grad and id(p) not in taken for p in m.parameters(recurse=False))
    }
    handles = [m.register_forward_pre_hook(record, with_kwargs=True) for m in owners.values()]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _row_positions(model: nn.Module, inputs: dict[str, Any]) -> int | None:
    """The first position id the model's default forward uses when it feeds shared (1, seq) positions to
    a trainable layer (0 for GPT-2 and BERT, 2 for Nystromformer and YOSO, whose buffers start at
    ``padding_idx + 1``), or None when it derives positions per row itself; checks that passing those
    positions per row gives every layer the same inputs (else refuses)."""
    ids = inputs["input_ids"]
    probe = dict(inputs)
    if ids.shape[0] == 1:  # two rows, so a shared (1, seq) input shows
        probe = {k: torch.cat([v, v]) if isinstance(v, Tensor) and v.dim() else v for k, v in probe.items()}
    b = probe["input_ids"].shape[0]
    default = _probe(model, probe)
    shared = [(k, x) for k, (_, x) in enumerate(default) if x.dim() and x.shape[0] == 1]
    if not shared:
        return None
    length = ids.shape[1]
    # The default positions themselves, when a layer reads them: consecutive ids from some start.
    starts = [
        int(x[0, 0])
        for _, x in shared
        if x.dim() == 2 and not x.is_floating_point() and x.shape[1] == length and bool(
            (x[0] - x[0, 0] == torch.arange(length, device=x.device)).all()
        )
    ]
    start = starts[0] if starts else 0
    probe["position_ids"] = start + torch.arange(length, device=ids.device).repeat(b, 1)
    passed = _probe(model, probe)
    same = len(passed) == len(default) and all(
        passed[k][0] is default[k][0]
        and passed[k][1].shape[0] == b
        and passed[k][1].shape[1:] == x.shape[1:]
        and torch.equal(passed[k][1], x.expand_as(passed[k][1]))
        for k, x in shared
    )
    if not same:
        raise ValueError(
            f"{type(unwrap_model(model)).__name__}'s default forward gives a trainable layer inputs shared "
            f"by the whole batch (shape (1, ...)) that are not positions {start}..{start}+seq-1, so hush_hf "
            "cannot give each example the same positions per row; put position_ids of shape (batch, seq) in "
            "the batch"
        )
    return start


def model_inputs(model: nn.Module, batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """The micro-batch on ``device``, with per-row ``position_ids`` where the model's default forward
    would share (1, seq) positions across the batch (see the module docstring)."""
    inputs = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
    ids = inputs.get("input_ids")
    if (
        "position_ids" in inputs
        or not isinstance(ids, Tensor)
        or ids.dim() != 2
        or not accepts_argument(model, "position_ids")
    ):
        return inputs
    if model not in _POSITIONS:
        if getattr(getattr(unwrap_model(model), "config", None), "is_encoder_decoder", False):
            return inputs  # decoder inputs come from the labels; no shared positions probe
        probe = {k: v for k, v in inputs.items() if k != "labels"}
        _POSITIONS[model] = _row_positions(model, probe)
    start = _POSITIONS[model]
    if start is not None:
        b, length = ids.shape
        inputs["position_ids"] = start + torch.arange(length, device=ids.device).repeat(b, 1)
    return inputs


def _check_against_model_loss(model: nn.Module, model_loss: Any, losses: Tensor, targets: Tensor) -> bool:
    """True when sum_i n_i loss_i / sum_i n_i equals the model's own (token-mean) loss; raises when it
    does not; False when there is nothing to compare (no target token, or no loss returned). A loss
    returned in bf16/fp16 (FSDP2's ``output_dtype`` under bf16 mixed precision casts the model's
    outputs) is compared up to its own rounding as well: one unit in its last place."""
    total = int(targets.sum())
    if not isinstance(model_loss, Tensor) or model_loss.numel() != 1 or total == 0:
        return False
    ours = float((losses.detach().double() * targets.double()).sum()) / total
    theirs = float(model_loss.detach().double())
    if not math.isfinite(theirs):
        return False
    rounding = torch.finfo(model_loss.dtype).eps if model_loss.is_floating_point() else 0.0
    if abs(ours - theirs) > (_LOSS_RTOL + (rounding if rounding > 2**-20 else 0.0)) * abs(theirs):
        raise ValueError(
            f"the per-example loss hush_hf derived for {type(unwrap_model(model)).__name__} "
            f"({loss_kind(model)} token cross-entropy) does not add up to the model's own loss on this "
            "batch, so it is not what the model trains on; pass per_example_loss= (or override "
            "compute_per_example_loss)"
        )
    return True


def lm_per_example_loss(model: nn.Module, inputs: dict[str, Any]) -> Tensor:
    """loss_i = mean over example i's target tokens (``example_cross_entropy``), shape (b,).

    Scored the way the model's own loss scores them (``loss_kind``). The model's own loss is a
    token-weighted batch mean, not per example, so the model is called without ``labels`` except for
    encoder-decoder models (which build their decoder inputs from them) and on the first batch, whose
    per-example split is checked against the model's own loss.
    """
    if "labels" not in inputs:
        raise ValueError(
            "the training batch has no 'labels': use a data collator that adds them (e.g. "
            "DataCollatorForLanguageModeling, DataCollatorForSeq2Seq) or pass per_example_loss= to "
            "compute a loss per example"
        )
    kind = loss_kind(model)
    inputs = dict(inputs)
    labels = inputs.pop("labels")
    verify = _VERIFIED.get(model) != kind
    outputs = model(**inputs, labels=labels) if verify or kind == SEQ2SEQ else model(**inputs)
    logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs[0 if not verify else 1]
    losses = example_cross_entropy(logits, labels, causal=kind == CAUSAL)
    if verify:
        scored = labels[:, 1:] if kind == CAUSAL else labels
        model_loss = outputs["loss"] if isinstance(outputs, Mapping) else outputs[0]
        if _check_against_model_loss(model, model_loss, losses, (scored != IGNORE_INDEX).sum(dim=1)):
            _VERIFIED[model] = kind
    return losses
