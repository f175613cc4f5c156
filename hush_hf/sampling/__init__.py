"""Sampling for DP-SGD: weighted Poisson batches and the secret per-step randomness (Hush Alg. 2, line 8)."""

from hush_hf.sampling.poisson import WeightedPoissonSampler
from hush_hf.sampling.seeds import draw_dp_seed, step_seed_sequence

__all__ = ["WeightedPoissonSampler", "draw_dp_seed", "step_seed_sequence"]
