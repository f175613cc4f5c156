"""Settings a user's script can toggle that would break the guarantee without an error (review findings)."""

from __future__ import annotations

import pytest
import torch

from tests.test_trainer import build
from tests.test_trainer_helpers import single_thread, tiny_gpt2  # noqa: F401  (autouse fixture)


def test_neftune_noise_scales_with_the_other_rows_so_it_is_refused(tmp_path):
    # NEFTune's embedding noise is U(-a, a) with a = alpha / sqrt(L d), L the batch's padded width: a short
    # row's noise shrinks when a long row is drawn with it, so its gradient depends on the other rows.
    from transformers.integrations.neftune import activate_neftune, deactivate_neftune

    model = tiny_gpt2().train()
    handle = activate_neftune(model, 5.0)
    embed = model.get_input_embeddings()
    short = torch.full((1, 4), 7)
    with torch.no_grad():
        alone = (embed(short) - torch.nn.functional.embedding(short, embed.weight)).abs().max()
        batch = torch.full((2, 64), 7)
        beside_long = (embed(batch) - torch.nn.functional.embedding(batch, embed.weight))[0, :4].abs().max()
    deactivate_neftune(model, handle)
    d = embed.weight.shape[1]
    assert alone > 5.0 / (64 * d) ** 0.5 >= beside_long  # the bound a of a 64-wide batch, below the row's own

    with pytest.raises(ValueError, match=r"neftune_noise_alpha=5\.0 is not supported"):
        build(tmp_path, neftune_noise_alpha=5.0).train()


def test_a_second_run_on_weights_another_run_trained_is_refused(tmp_path):
    # A new trainer on the same model object (a notebook re-run after a crash or to retry a learning rate)
    # would certify only its own T steps, while the weights went through both runs' 2T.
    model = tiny_gpt2()
    build(tmp_path / "first", model=model, max_steps=2).train()
    second = build(tmp_path / "second", model=model, max_steps=2, dp_seed=99)
    with pytest.raises(ValueError, match=r"already went through 2 optimizer step\(s\) of another DP run"):
        second.train()
    fresh = build(tmp_path / "fresh", model=tiny_gpt2(), max_steps=2, dp_seed=99)
    fresh.train()
    assert fresh.state.global_step == 2
