"""Toy models and tokenizers for the audit tests (no test functions here; imported by test_audit_*).

``BigramLM`` is a causal LM with fixed logits: logits at position t are ``table[x_t]``, so every
log-likelihood, rank and greedy continuation can be computed by hand with NumPy.
"""

from __future__ import annotations

import string
from types import SimpleNamespace

import numpy as np
import pytest
import torch

CHARS = ["<pad>", "<unk>", *string.printable[:95]]  # digits, letters, punctuation, space


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models run ~30x faster on one thread when the cores are busy (xdist workers, other jobs)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class BigramLM(torch.nn.Module):
    """A causal LM whose next-token logits depend only on the current token: ``table[x_t]``."""

    def __init__(self, table: np.ndarray) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.as_tensor(table, dtype=torch.float32), requires_grad=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        return SimpleNamespace(logits=self.table[input_ids])


def log_softmax_rows(table: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (the reference for BigramLM's log-probabilities)."""
    table = np.asarray(table, dtype=np.float64)
    shifted = table - table.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def char_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` (one token per character), built offline."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>")


def char_ids(text: str) -> list[int]:
    return [CHARS.index(ch) for ch in text]


def sequence_log_prob(table: np.ndarray, ids: list[int]) -> float:
    """sum_t log P(x_t | x_{t-1}) under BigramLM(table), by NumPy."""
    log_p = log_softmax_rows(table)
    return float(sum(log_p[a, b] for a, b in zip(ids[:-1], ids[1:], strict=True)))


def tiny_gpt2(vocab_size: int = 64, seed: int = 0):
    """A randomly initialised 2-layer GPT-2 (a real HF causal LM with a KV cache), without an EOS token
    so that ``generate`` never stops early."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_positions=128, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return GPT2LMHeadModel(config).eval()


def save_tiny_causal_lm(folder, seed: int = 0):
    """Save a tiny GPT-2 with the character tokenizer to ``folder`` (as a trained model would be)."""
    tokenizer = char_tokenizer()
    model = tiny_gpt2(vocab_size=len(CHARS), seed=seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer
