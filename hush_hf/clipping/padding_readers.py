"""Layers that read padded positions (read from transformers 5.24): a padded row is refused for them.

Right padding is exact for a model whose every layer keeps the padded positions out of the real ones
(``hush_hf.trainer.padding``). These layers do not: a real token's output reads the positions after the
row's end, so a padded row computes something else than the row alone, and how far the batch pads it
depends on the other rows; one example's clipped gradient would then depend on the others.

- FNet (``FNetBasicFourierTransform``): the Fourier transform over the sequence mixes every position,
  padding included, into each token; the model takes no attention mask.
- ConvBERT (``ConvBertSelfAttention``): its span-based convolution (``key_conv_attn_layer``,
  ``conv_out_layer``) reads each token's neighbouring positions, padding included; the attention mask
  reaches only its attention scores.
- YOSO (``YosoSelfAttention``): its attention turns the (batch, seq) mask into ``int(1 + mask / 10000)``,
  which is 1 for padded keys too, so every token attends to the padded positions.
- Nystromformer (``NystromformerSelfAttention``): its depthwise convolution over the values
  (``conv_kernel_size``, 65 by default) reads the neighbouring positions, padding included, and with
  ``num_landmarks`` below ``segment_means_seq_len`` its landmarks are unmasked means over segments of the
  sequence (the config requires an int kernel size, so the convolution is always on).

The first-step independence check (``trainer.independence``) cannot be relied on here. On the tiny
random-init models of tests/model_families.py, padding a 5-token row by 4 positions moved its loss by
1.9e-6 (ConvBERT) and 5.6e-6 (Nystromformer) relative in float64, below the check's float32 bound of 1e-4:
trained in float32 on right-padded rows of 3-12 tokens, the check passed both; it caught YOSO and FNet.

Each micro-batch (after its right padding is cut, ``trainer.micro_batches.trim_right_padding``) is checked
before its forward: a row with padding left (a 0 in its ``attention_mask``; without a mask, a trailing pad
token) is refused, naming the layer. Unpadded rows train exactly. With a mask, micro-batches of one row
are cut to that row's length, so they train exactly too. Padding every row to one fixed length is not
accepted: with a mask each micro-batch is cut back to its longest row, and without one (FNet) a batch
cannot show that its width was fixed rather than its longest row's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

Reason = Callable[[nn.Module], "str | None"]
_READERS: dict[str, Reason] = {}
_MODELS = "transformers.models"


def register_padding_reader(target: str, reason: str | Reason) -> None:
    """Declare that layers of class ``target`` ('module.Class') read padded positions: ``reason`` says why,
    or ``reason(layer)`` does for this layer's configuration (None: this one does not)."""
    _READERS[target] = reason if callable(reason) else (lambda layer, why=reason: why)


def padding_readers(model: nn.Module) -> list[tuple[str, str, str]]:
    """(path, class name, reason) of the first layer of each registered class in ``model`` that reads
    padded positions."""
    found: dict[str, tuple[str, str, str]] = {}
    for path, module in model.named_modules():
        kind = type(module)
        name = f"{kind.__module__}.{kind.__qualname__}"
        if name in _READERS and name not in found:
            why = _READERS[name](module)
            if why is not None:
                found[name] = (path, kind.__name__, why)
    return list(found.values())


def padded_rows(batch: Mapping[str, Any], pad_token_id: int | None) -> list[int]:
    """Rows of a micro-batch that hold padding: a 0 in their (batch, seq) ``attention_mask``; without a
    mask, ``input_ids`` ending in ``pad_token_id``."""
    mask = batch.get("attention_mask")
    if isinstance(mask, Tensor) and mask.dim() == 2:
        return (mask == 0).any(dim=1).nonzero().flatten().tolist()
    ids = batch.get("input_ids")
    if pad_token_id is None or not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[1] == 0:
        return []
    return (ids[:, -1] == pad_token_id).nonzero().flatten().tolist()


_SINGLE = " or per_device_train_batch_size=1 (each micro-batch is then cut to its row's length)"


def _refusal(readers: list[tuple[str, str, str]], where: str, *, single: bool) -> str:
    path, kind, reason = readers[0]
    return (
        f"layer '{path}' ({kind}) reads padded positions ({reason}): a padded row's output depends on how "
        f"far its batch pads it ({where}); train on rows of one length (concatenate and chunk the texts)"
        + (_SINGLE if single else "")
    )


def padded_batch_problem(
    readers: list[tuple[str, str, str]], batch: Mapping[str, Any], pad_token_id: int | None
) -> str | None:
    """Why this micro-batch cannot train exactly on a model with these padding readers, or None."""
    if not readers:
        return None
    rows = padded_rows(batch, pad_token_id)
    if not rows:
        return None
    masked = isinstance(batch.get("attention_mask"), Tensor)
    return _refusal(readers, f"rows {rows} of this micro-batch are padded", single=masked)


def padded_dataset_problem(
    readers: list[tuple[str, str, str]], dataset: Any, micro_batch_size: int
) -> str | None:
    """Why this dataset's rows will be padded in training on a model with these padding readers, or None.

    Read before the first step on every rank alike, so that a run which would meet a padded micro-batch
    fails before any work (and no rank is left waiting in a collective for one that raised). With
    micro-batches of more than one row: ``input_ids`` of more than one length (a collator pads them to
    the longest), or rows holding padding themselves (a 0 in their ``attention_mask``, e.g. tokenised with
    ``padding="max_length"``: a micro-batch is cut back only to its longest row). Micro-batches of one row
    are cut to the row's length. Rows without ``input_ids`` (tokenised by the collator) are left to the
    check of each micro-batch."""
    if not readers or micro_batch_size <= 1:
        return None
    lengths, padded = _row_lengths_and_padding(dataset)
    if len(set(lengths)) > 1:
        first = lengths[0]
        other = next(i for i, n in enumerate(lengths) if n != first)
        where = f"dataset rows 0 and {other} have {first} and {lengths[other]} tokens, so a batch pads them"
        return _refusal(readers, where, single=True)
    if padded is not None:
        return _refusal(
            readers, f"dataset row {padded} holds padding: a 0 in its attention_mask", single=True
        )
    return None


def _row_lengths_and_padding(dataset: Any) -> tuple[list[int], int | None]:
    """The ``input_ids`` length of each row ([] without them) and the first row whose ``attention_mask``
    holds a 0 (None if none). A ``datasets.Dataset`` is read column-wise through Arrow, without building
    Python rows; other map-style datasets row by row."""
    try:
        import datasets
        import pyarrow.compute as pc
    except ImportError:  # pragma: no cover - datasets is a core dependency
        datasets = None
    if datasets is not None and isinstance(dataset, datasets.Dataset):
        columns = dataset.with_format("arrow")  # column reads then respect select/shuffle views
        names = dataset.column_names
        lengths = pc.list_value_length(columns["input_ids"]).to_pylist() if "input_ids" in names else []
        padded = None
        if "attention_mask" in names:
            mask = columns["attention_mask"]
            mask = mask.combine_chunks() if hasattr(mask, "combine_chunks") else mask  # row indices 0..n-1
            zeros = pc.equal(pc.list_flatten(mask), 0)
            if pc.any(zeros).as_py():
                padded = int(pc.min(pc.filter(pc.list_parent_indices(mask), zeros)).as_py())
        return lengths, padded
    lengths, padded = [], None
    for i in range(len(dataset)):
        row = dataset[i]
        if not isinstance(row, Mapping):
            return [], None
        ids, mask = row.get("input_ids"), row.get("attention_mask")
        if ids is not None and hasattr(ids, "__len__"):
            lengths.append(len(ids))
        if padded is None and mask is not None and 0 in [int(v) for v in mask]:
            padded = i
    return (lengths if len(lengths) == len(dataset) else []), padded


register_padding_reader(
    f"{_MODELS}.fnet.modeling_fnet.FNetBasicFourierTransform",
    "its Fourier transform over the sequence mixes every position, padding included, into each token",
)
register_padding_reader(
    f"{_MODELS}.convbert.modeling_convbert.ConvBertSelfAttention",
    "its span-based convolution reads each token's neighbouring positions, padding included (the "
    "attention mask reaches only its attention scores)",
)
register_padding_reader(
    f"{_MODELS}.yoso.modeling_yoso.YosoSelfAttention",
    "its attention turns the mask into int(1 + mask / 10000), 1 for padded keys too, so every token "
    "attends to the padded positions",
)


def _nystromformer_reason(attention: nn.Module) -> str | None:
    parts = []
    if getattr(attention, "conv_kernel_size", None) is not None:
        kernel = attention.conv_kernel_size
        parts.append(
            f"its depthwise convolution over the values (conv_kernel_size={kernel}) reads the neighbouring "
            "positions, padding included"
        )
    if getattr(attention, "num_landmarks", None) != getattr(attention, "seq_len", None):
        parts.append("its landmarks are unmasked means over segments of the sequence, padding included")
    return "; ".join(parts) or None


register_padding_reader(
    f"{_MODELS}.nystromformer.modeling_nystromformer.NystromformerSelfAttention", _nystromformer_reason
)
