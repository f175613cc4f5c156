"""Keyed fingerprints of secret names, so that outputs can refer to a secret across runs without naming it.

The key lives in a private file (created with mode 0600 when missing); without the key a fingerprint
cannot be recomputed from a guess.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def keyed_fingerprints(secrets: Sequence[Any], key_file: str | Path | None) -> list[str] | None:
    """Keyed fingerprints of the secrets' names (``hush_hf.secrets.secret_fingerprint``), with the key
    read from ``key_file`` or, when it does not exist, created there (32 random bytes, owner-only);
    None without a key file."""
    if key_file is None:
        return None
    import os
    import secrets as random_source

    from hush_hf.secrets import secret_fingerprint

    path = Path(key_file)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
            handle.write(random_source.token_bytes(32))
        logger.info("Created a fingerprint key in %s: keep it private", path)
    key = path.read_bytes()
    return [secret_fingerprint(s.name, key) for s in secrets]
