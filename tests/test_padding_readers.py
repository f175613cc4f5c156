"""Layers that read padded positions (hush_hf/clipping/padding_readers.py): a padded row is refused before
its forward, naming the layer and why; unpadded rows train exactly (tests/model_families.py, "unpadded
rows only"), and so do padded rows in micro-batches of one (the training options of the same file)."""

from __future__ import annotations

import pytest
import torch

from hush_hf.clipping.padding_readers import padded_rows
from tests.model_families import family_named
from tests.test_model_families import one_step_matches_reference

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given", "ignore:noise_multiplier=0")


@pytest.mark.parametrize(
    ("family", "layer", "reason"),
    [
        ("ConvBERT (MLM)", r"convbert\.encoder\.layer\.0\.attention\.self' \(ConvBertSelfAttention\)",
         "span-based convolution reads each token's neighbouring positions"),
        ("FNet (MLM)", r"fnet\.encoder\.layer\.0\.fourier\.self' \(FNetBasicFourierTransform\)",
         "Fourier transform over the sequence mixes every position"),
        ("YOSO (MLM)", r"yoso\.encoder\.layer\.0\.attention\.self' \(YosoSelfAttention\)",
         r"int\(1 \+ mask / 10000\), 1 for padded keys too"),
        ("Nystromformer (MLM)",
         r"nystromformer\.encoder\.layer\.0\.attention\.self' \(NystromformerSelfAttention\)",
         r"depthwise convolution over the values \(conv_kernel_size=65\)"),
    ],
    ids=["ConvBERT", "FNet", "YOSO", "Nystromformer"],
)  # fmt: skip
def test_a_padded_row_is_refused_naming_the_layer(tmp_path, family: str, layer: str, reason: str):
    base = family_named(family)
    refusal = rf"layer '{layer} reads padded positions \(.*{reason}.*\): .*rows \[\d"
    with pytest.raises(ValueError, match=refusal):
        one_step_matches_reference(tmp_path, base, base.ties[0], padded=True)


def test_padded_rows_are_told_by_the_mask_or_else_by_a_trailing_pad_token():
    ids = torch.tensor([[5, 6, 7], [5, 0, 0], [5, 6, 0]])
    assert padded_rows({"input_ids": ids, "attention_mask": (ids != 0).long()}, 0) == [1, 2]
    assert padded_rows({"input_ids": ids}, 0) == [1, 2]
    assert padded_rows({"input_ids": ids}, None) == []
    assert padded_rows({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 0) == []


def test_nystromformer_landmarks_are_named_too():
    """Fewer landmarks than positions: the landmarks (unmasked segment means) read padding as well."""
    from hush_hf.clipping.padding_readers import padding_readers
    from tests.model_families import _BERT_LIKE, _hf

    model = _hf("NystromformerConfig", "NystromformerForMaskedLM", num_landmarks=8, segment_means_seq_len=64,
                **_BERT_LIKE)(True)  # fmt: skip
    ((path, kind, reason),) = padding_readers(model)
    assert (path, kind) == ("nystromformer.encoder.layer.0.attention.self", "NystromformerSelfAttention")
    assert "conv_kernel_size=65" in reason and "landmarks are unmasked means" in reason
