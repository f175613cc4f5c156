"""Keyed fingerprints for cross-referencing secrets across runs without storing them.

Plans, logs and reports refer to secrets by index only. A user who wants to match secrets across
runs can compute ``HMAC-SHA256(key, name)`` with a key they keep. The key is never written to any
output, and the hash is keyed rather than salted on purpose: many secrets are low-entropy (a
word, a name, a short number), so an unkeyed hash, or a hash whose salt is stored next to it, is
reversed by hashing every candidate in a dictionary. Without the key that attack is impossible.
"""

from __future__ import annotations

import hashlib
import hmac

FINGERPRINT_LENGTH = 16
MIN_KEY_BYTES = 16


def secret_fingerprint(name: str, key: bytes) -> str:
    """The first 16 hex digits (64 bits) of HMAC-SHA256(key, UTF-8 bytes of ``name``).

    ``key`` must hold at least 16 bytes (e.g. ``secrets.token_bytes(32)``): a short key could itself
    be guessed, which would reopen the dictionary attack.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("secret_fingerprint: name must be a non-empty string")
    if not isinstance(key, (bytes, bytearray)):
        raise ValueError(f"secret_fingerprint: key must be bytes, got a {type(key).__name__}")
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"secret_fingerprint: key must hold at least {MIN_KEY_BYTES} bytes, got {len(key)}")
    digest = hmac.new(bytes(key), name.encode("utf-8"), hashlib.sha256).hexdigest()
    return digest[:FINGERPRINT_LENGTH]
