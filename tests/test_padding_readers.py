"""Layers that read padded positions (hush_hf/clipping/padding_readers.py): a padded row is refused before
its forward, naming the layer and why; unpadded rows train exactly (tests/model_families.py, "unpadded
rows only"), and so do padded rows in micro-batches of one (the training options of the same file)."""

from __future__ import annotations

import datasets
import pytest
import torch

from hush_hf.clipping.padding_readers import padded_rows
from hush_hf.trainer.engine import DPStep
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
    refusal = rf"layer '{layer} reads padded positions \(.*{reason}.*\): .*dataset rows 0 and 1 have 9 and 5"
    forwards = []
    losses = DPStep.losses

    def counted(step, trainer, micro):  # every micro-batch's forward: the refusal must come before all
        forwards.append(micro)
        return losses(step, trainer, micro)

    with pytest.raises(ValueError, match=refusal), pytest.MonkeyPatch.context() as patch:
        patch.setattr(DPStep, "losses", counted)
        one_step_matches_reference(tmp_path, base, base.ties[0], padded=True)
    assert forwards == []


def test_padded_rows_are_told_by_the_mask_or_else_by_a_trailing_pad_token():
    ids = torch.tensor([[5, 6, 7], [5, 0, 0], [5, 6, 0]])
    assert padded_rows({"input_ids": ids, "attention_mask": (ids != 0).long()}, 0) == [1, 2]
    assert padded_rows({"input_ids": ids}, 0) == [1, 2]
    assert padded_rows({"input_ids": ids}, None) == []
    assert padded_rows({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 0) == []
    # the check of each micro-batch (rows tokenised by the collator are not seen up front)
    from hush_hf.clipping.padding_readers import padded_batch_problem

    assert "rows [1, 2] of this micro-batch are padded" in padded_batch_problem(READER, {"input_ids": ids}, 0)
    assert padded_batch_problem(READER, {"input_ids": ids[:1]}, 0) is None


READER = [("encoder.layer.0.fourier", "FNetBasicFourierTransform", "it mixes every position")]


@pytest.mark.parametrize("view", ["whole", "selected"])
def test_the_dataset_is_read_before_any_step_for_rows_a_batch_would_pad(view: str):
    """Rows of several lengths, or rows padded in the dataset itself (padding="max_length"), would be
    padded in a micro-batch of several rows: refused up front, whatever Arrow view the rows come from."""
    from hush_hf.clipping.padding_readers import padded_dataset_problem

    even = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]] * 3, "attention_mask": [[1, 1, 1]] * 3})
    ragged = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7], [5, 6, 7], [5, 6]]})
    prepadded = datasets.concatenate_datasets(
        [even, datasets.Dataset.from_dict({"input_ids": [[5, 6, 0]], "attention_mask": [[1, 1, 0]]})]
    )
    if view == "selected":  # an index mapping over the table: rows are read through it
        ragged, prepadded = ragged.select([2, 0, 1]), prepadded.select([0, 3, 1])
    assert padded_dataset_problem(READER, even, 4) is None
    where = "rows 0 and 1 have 2 and 3 tokens" if view == "selected" else "rows 0 and 2 have 3 and 2 tokens"
    assert where in padded_dataset_problem(READER, ragged, 2)
    assert f"dataset row {1 if view == 'selected' else 3} holds padding" in padded_dataset_problem(
        READER, prepadded, 2
    )
    # micro-batches of one row are cut to the row's own length: nothing to refuse up front
    assert padded_dataset_problem(READER, ragged, 1) is None
    assert padded_dataset_problem(READER, prepadded, 1) is None
    assert padded_dataset_problem([], ragged, 2) is None
    rows = [{"input_ids": [5, 6]}, {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 0]}]
    assert "rows 0 and 1 have 2 and 3 tokens" in padded_dataset_problem(READER, rows, 2)


def test_nystromformer_landmarks_are_named_too():
    """Fewer landmarks than positions: the landmarks (unmasked segment means) read padding as well."""
    from hush_hf.clipping.padding_readers import padding_readers
    from tests.model_families import _BERT_LIKE, _hf

    model = _hf("NystromformerConfig", "NystromformerForMaskedLM", num_landmarks=8, segment_means_seq_len=64,
                **_BERT_LIKE)(True)  # fmt: skip
    ((path, kind, reason),) = padding_readers(model)
    assert (path, kind) == ("nystromformer.encoder.layer.0.attention.self", "NystromformerSelfAttention")
    assert "conv_kernel_size=65" in reason and "landmarks are unmasked means" in reason
