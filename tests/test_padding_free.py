"""Every example alone whatever the collator: padding-free batches and padding without a mask.

Written as the attacks of the issue that found them, each followed by the check that stops it:

- transformers' ``DataCollatorWithFlattening`` (TRL's padding-free mode) puts the drawn examples end to
  end in one row. Before, the DP step clipped that row as ONE example (``dp_batch_size`` 1), so one
  example could move the clipped sum by up to 2C. Now the row is cut back into the drawn examples: with
  the same ``dp_seed`` the flattened run trains the right-padded run's weights, and logs the drawn count.
- a collator returning ``input_ids`` and ``labels`` only, left-padded: the shortest row's loss moved when it
  sat next to the longest. Now the mask is inferred from where the drawn tokens sit, and re-padded right.
- a collator that couples rows in a way a row cut from the batch cannot show (it writes the batch's size
  into every row): the first-step check collates each row alone and refuses it.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorWithFlattening

from hush_hf.trainer.example_rows import ExampleRowsCollator, example_rows
from hush_hf.trainer.padding import right_align
from tests.test_example_independence import train as train_run
from tests.test_trainer_helpers import (
    pad_collate,
    parameters,
    single_thread,  # noqa: F401  (autouse fixture)
    tiny_gpt2,
    token_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given", "ignore:noise_multiplier=0")


def causal_rows(n: int = 8, seed: int = 5):
    return token_dataset(n, seed=seed, min_len=3, max_len=11).remove_columns("attention_mask")


def flattening(**kwargs):
    return DataCollatorWithFlattening(return_tensors="pt", **kwargs)


# ----------------------------------------------------------------------------- the layout itself
@pytest.mark.parametrize(
    "options",
    [{}, {"return_flash_attn_kwargs": True}, {"return_seq_idx": True}, {"return_position_ids": False}],
    ids=["position-ids", "cu-seq-lens", "seq-idx", "no-position-ids"],
)
def test_a_flattened_batch_becomes_the_right_padded_batch(options):
    features = [dict(row) for row in causal_rows(5)]
    flat = flattening(**options)(features)
    assert flat["input_ids"].shape[0] == 1  # the attack: five examples, one row
    rows = example_rows(flat, features, pad_token_id=0)
    padded = pad_collate([{**f, "attention_mask": [1] * len(f["input_ids"])} for f in features])
    assert rows["input_ids"].shape[0] == len(features)
    assert torch.equal(rows["input_ids"], padded["input_ids"])
    assert torch.equal(rows["attention_mask"], padded["attention_mask"])
    # labels: the flattening collator writes -100 at each example's first token, which a causal LM never
    # scores (position t predicts label t + 1); every other label is the padded collator's
    assert torch.equal(rows["labels"][:, 1:], padded["labels"][:, 1:])
    assert bool((rows["labels"][:, 0] == -100).all())
    assert not {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "seq_idx"} & set(rows)
    if options.get("return_position_ids", True):
        lengths = padded["attention_mask"].sum(dim=1)
        for r, n in enumerate(lengths.tolist()):
            assert rows["position_ids"][r, :n].tolist() == list(range(n))


def test_a_packed_row_with_several_documents_stays_one_example():
    """TRL's BFD packing: one dataset row holds several documents (position_ids restart inside it); it
    is one example of the plan, so the cut follows the drawn rows, never the restarts."""
    features = [
        {"input_ids": [5, 6, 7, 8, 9], "labels": [5, 6, 7, 8, 9], "position_ids": [0, 1, 2, 0, 1]},
        {"input_ids": [10, 11, 12], "labels": [10, 11, 12], "position_ids": [0, 1, 2]},
    ]
    flat = {
        "input_ids": torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]]),
        "labels": torch.tensor([[-100, 6, 7, -100, 9, -100, 11, 12]]),
        "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2]]),
    }
    rows = example_rows(flat, features, pad_token_id=0)
    assert rows["input_ids"].tolist() == [[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]]
    assert rows["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]]
    assert rows["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert rows["labels"].tolist() == [[-100, 6, 7, -100, 9], [-100, 11, 12, -100, -100]]


def test_trailing_padding_of_a_flattened_row_is_dropped_but_real_tokens_are_refused():
    features = [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}]
    padded_tail = {
        "input_ids": torch.tensor([[5, 6, 7, 8, 9, 0, 0]]),
        "labels": torch.tensor([[-100, 6, 7, -100, 9, -100, -100]]),
    }
    assert example_rows(padded_tail, features, pad_token_id=0)["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    real_tail = {
        "input_ids": torch.tensor([[5, 6, 7, 8, 9, 4]]),
        "labels": torch.tensor([[-100, 6, 7, -100, 9, 4]]),
    }
    with pytest.raises(ValueError, match="1 tokens after the drawn examples that are not padding"):
        example_rows(real_tail, features, pad_token_id=0)


@pytest.mark.parametrize(
    "batch, message",
    [
        (
            {"input_ids": torch.tensor([[5, 6, 7], [8, 9, 0], [1, 1, 1]])},
            "3 rows for 2 drawn examples: an example split",
        ),
        ({"input_ids": torch.tensor([[5, 6, 7, 9, 8]])}, "changed, dropped or reordered tokens"),
        ({"input_ids": torch.tensor([[5, 6, 7, 8]])}, "changed, dropped or reordered tokens"),
        ({"input_ids": torch.tensor([[5, 6, 7, 8, 9]]), "extra": torch.tensor([[1, 2]])}, "'extra'"),
    ],
    ids=["more-rows", "reordered", "dropped", "unknown-key"],
)
def test_batches_whose_examples_cannot_be_found_are_refused(batch, message):
    with pytest.raises(ValueError, match=message):
        example_rows(batch, [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}], pad_token_id=0)


def test_three_drawn_examples_in_two_rows_are_refused():
    batch = {"input_ids": torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])}
    with pytest.raises(ValueError, match="neither one row per example nor one flattened row"):
        example_rows(batch, [{"input_ids": [5, 6]}, {"input_ids": [7, 8]}, {"input_ids": [9, 10]}])


def test_left_padding_without_a_mask_gets_the_mask_of_the_drawn_tokens():
    features = [
        {"input_ids": [5, 6, 7, 8], "labels": [5, 6, 7, 8]},
        {"input_ids": [9, 10], "labels": [9, 10]},
    ]
    left = {
        "input_ids": torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]]),
        "labels": torch.tensor([[5, 6, 7, 8], [-100, -100, 9, 10]]),
    }
    rows = right_align(example_rows(left, features), encoder_decoder=False)
    assert rows["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert rows["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert rows["labels"].tolist() == [[5, 6, 7, 8], [9, 10, -100, -100]]


def test_an_empty_draw_collates_to_the_empty_batch():
    assert ExampleRowsCollator(flattening())([]) == {}


# ----------------------------------------------------------------------------- through the trainer
def left_padded_without_mask(features):
    """The issue's collator: input_ids and labels only, padded on the left."""
    width = max(len(f["input_ids"]) for f in features)
    return {
        "input_ids": torch.tensor([[0] * (width - len(f["input_ids"])) + f["input_ids"] for f in features]),
        "labels": torch.tensor([[-100] * (width - len(f["labels"])) + f["labels"] for f in features]),
    }


def right_padded(features):
    return pad_collate([{**f, "attention_mask": [1] * len(f["input_ids"])} for f in features])


def train(data, collator, tmp_path, *, plain=False, steps=3):
    """The DP run of tests/test_example_independence.py (noise on, fixed seed) on a float64 tiny GPT-2;
    returns its trained weights and the logged drawn batch sizes."""
    model = tiny_gpt2(seed=0).double()
    trainer = train_run(model, data, collator, tmp_path, plain=plain, steps=steps)
    logs = trainer.state.log_history
    return parameters(model), [log["dp_batch_size"] for log in logs if "dp_batch_size" in log]


@pytest.mark.parametrize("plain", [False, True], ids=["SecretProtectionTrainer", "attach"])
def test_flattened_and_unmasked_left_padded_runs_train_the_right_padded_model(tmp_path, plain):
    data = causal_rows(8)
    reference, sizes = train(data, right_padded, tmp_path / "right", plain=plain)
    assert max(sizes) > 1  # draws of several examples, logged as such
    for name, collator in [("flat", flattening()), ("left", left_padded_without_mask)]:
        trained, logged = train(data, collator, tmp_path / name, plain=plain)
        assert logged == sizes, name  # the drawn count, not the number of rows the collator made
        for key, value in reference.items():
            assert torch.allclose(trained[key], value, rtol=0, atol=1e-12), (name, key)


def batch_size_token(features):
    """A planted coupling no row cut from the batch shows: every row starts with the batch's size."""
    return pad_collate(
        [
            {
                "input_ids": [3 + len(features)] + f["input_ids"],
                "labels": [3 + len(features)] + f["labels"],
                "attention_mask": [1] * (1 + len(f["input_ids"])),
            }
            for f in features
        ]
    )


def test_the_first_step_check_collates_each_row_alone(tmp_path):
    with pytest.raises(ValueError, match="example independence check failed"):
        train(causal_rows(8), batch_size_token, tmp_path)
