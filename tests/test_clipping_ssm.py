"""State-space mixers: the per-example replay drops the forward's cache, which is exact for a training
forward over whole sequences (tests/model_families.py: Mamba, Mamba2, FalconMamba, Jamba, Bamba,
Falcon-H1, Zamba2, Granite-MoE-Hybrid, LFM2, one DP step against torch.func); a one-position call with a
cache is decoding and refused."""

from __future__ import annotations

import pytest
import torch

from hush_hf.clipping.registry import RecordedCall
from hush_hf.clipping.rules_ssm import ssm_grads
from tests.model_families import family_named


class _Cache:
    def update(self, *args: object) -> None:  # a transformers Cache has ``update``
        raise AssertionError("the replay must not write to the forward's cache")


def test_a_decoding_call_with_a_cache_is_refused():
    mixer = family_named("Mamba").build(True).double().backbone.layers[0].mixer
    x = torch.randn(2, 1, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="ran one position with a cache"):
        ssm_grads(mixer, RecordedCall((x,), {"cache_params": _Cache()}, None), torch.ones_like(x))


def test_the_replay_without_the_cache_equals_the_replay_of_a_cacheless_call():
    mixer = family_named("Mamba").build(True).double().backbone.layers[0].mixer
    x = torch.randn(2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    g = torch.randn(2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with_cache = ssm_grads(mixer, RecordedCall((x, _Cache()), {}, None), g)
    without = ssm_grads(mixer, RecordedCall((x,), {}, None), g)
    assert with_cache.keys() == without.keys() and "A_log" in with_cache and "conv1d.weight" in with_cache
    for name in without:
        torch.testing.assert_close(with_cache[name].values, without[name].values, rtol=0, atol=0)
