"""A tokenizer saved beside the weights must not spell a protected secret in its added tokens.

``save_model`` and ``push_to_hub`` publish the tokenizer files (tokenizer.json, tokenizer_config.json,
added_tokens.json) with the weights, and the card says no secret's content is published anywhere in the
repository. Tokens added from the private corpus (a code name, a customer id made one token) are written
there verbatim, outside the noise. So each added token is tagged with the run's secrets (the ones
``SecretProtectionTrainer`` was given: a plan alone names no secret's content, and nothing can be checked)
and a token holding one is refused, by id, never shown. The base vocabulary is not tagged: a vocabulary
learned on the private corpus itself is not detected (its common words would match secrets made of them).
"""

from __future__ import annotations

from typing import Any


def added_tokens(processing_class: Any) -> list[tuple[int, str]]:
    """(id, text) of the tokens added to the tokenizer of ``processing_class`` (a tokenizer, or a processor
    holding one), by id; empty when it has none or no ``get_added_vocab``."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    vocab = getattr(tokenizer, "get_added_vocab", None)
    if not callable(vocab):
        return []
    return sorted((int(token_id), str(text)) for text, token_id in vocab().items())


def check_added_tokens(processing_class: Any, secrets: Any, what: str) -> None:
    """ValueError (one line, no secret content) if an added token holds one of ``secrets`` (a SecretSet or
    a secrets file; None: nothing to check against)."""
    tokens = added_tokens(processing_class) if secrets is not None else []
    if not tokens:
        return
    from hush_hf.secrets import tagger_for
    from hush_hf.trainer.plan_setup import load_secrets

    tagger = tagger_for(load_secrets(secrets))
    for token_id, text in tokens:
        found = tagger(text)
        if found:
            raise ValueError(
                f"{what}: the tokenizer's added token id {token_id} holds protected secret {min(found)}, and "
                "the tokenizer files saved beside the weights would publish it verbatim (the card says no "
                "secret's content is published); train with a tokenizer whose added tokens hold no secret"
            )
