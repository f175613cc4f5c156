"""hush_hf: per-secret reconstruction protection for Hugging Face training (Ganesh et al. 2025)."""

__version__ = "0.1.0"
