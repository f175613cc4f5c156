"""The text files published beside the weights must not spell a protected secret.

The card says that no secret's content is published anywhere in the repository, but ``save_model`` and
``push_to_hub`` publish more than the noised weights: ``config.json`` (a classifier's ``id2label`` made
from the private data's labels), the tokenizer's configuration (a chat template or system prompt written
for the private data, added tokens), ``generation_config.json``, the card text ``Trainer`` and TRL write
(model and dataset names) and any ``extra_files``. Those are written verbatim, outside the noise. So
every published text file is read with the run's secrets (the ones the trainer was given; a plan alone
names no secret's content) after it is written and before it is uploaded, and one that spells a secret
is refused, naming the file and the secret's number, never its content.

JSON files are read string by string (keys and values, escapes decoded), so words of neighbouring keys do
not join into a false match; other text files are read whole. Not read: weights, images, and the base
vocabulary (``tokenizer.json``, ``vocab.*``, ``merges.txt``, ``*.model``, ``*.tiktoken``), whose every
common word would match a secret made of it (added tokens are checked on their own,
:mod:`hush_hf.trainer.tokenizer_secrets`); and ``hush_plan.json``, which names secrets by number and
holds one digest per row. Likewise the ``sha256:`` digests the card and the report state (the plan's, the
weights', the seed commitment): 64 hex digits of a hash spell nothing, but a short numeric secret
(a 3-digit canary) matches a run of digits inside one now and then, and the weights' and the
commitment's digests change from run to run.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from hush_hf.planning.record import _DIGEST, DIGEST_PREFIX

TEXT_SUFFIXES = (".json", ".jinja", ".md", ".txt", ".yaml", ".yml")
NOT_READ = (
    "tokenizer.json", "vocab.json", "vocab.txt", "merges.txt", "hush_plan.json", "*.model", "*.tiktoken",
)


def is_read(name: str) -> bool:
    """Whether the published file ``name`` (a relative path) is read for secrets."""
    base = Path(name).name
    return base.endswith(TEXT_SUFFIXES) and not any(fnmatch.fnmatch(base, g) for g in NOT_READ)


def _json_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _json_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _json_strings(item)


def texts_of(path: Path) -> Iterator[str]:
    """The texts of a published file: each string of a JSON file (keys included), else the whole text."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".json":
        yield text
        return
    try:
        value = json.loads(text)
    except json.JSONDecodeError:  # not JSON after all: read as text
        yield text
        return
    yield from _json_strings(value)


def first_spelled(folder: str | Path, names: Iterable[str], secrets: Any) -> tuple[str, int] | None:
    """(file name, secret number) of the first file of ``names`` in ``folder`` that :func:`is_read`
    reads and that spells one of ``secrets`` (a SecretSet or a secrets file); None if none does."""
    names = sorted(n for n in names if is_read(n) and (Path(folder) / n).is_file())
    if not names:
        return None
    from hush_hf.secrets import tagger_for
    from hush_hf.trainer.plan_setup import load_secrets

    tagger = tagger_for(load_secrets(secrets))
    for name in names:
        for text in texts_of(Path(folder) / name):
            found = tagger(_DIGEST.sub(DIGEST_PREFIX, text))  # a digest read as its prefix alone
            if found:
                return name, min(found)
    return None


def check_published_text(folder: str | Path, names: Iterable[str], secrets: Any, what: str) -> None:
    """ValueError (one line, no secret content) if :func:`first_spelled` finds a file spelling one of
    ``secrets`` (None: the secrets are not known, nothing is read)."""
    found = first_spelled(folder, names, secrets) if secrets is not None else None
    if found is not None:
        raise ValueError(
            f"{what}: {found[0]} in {str(folder)!r} spells protected secret {found[1]}, and would publish it "
            "verbatim beside weights whose card says no secret's content is published; take the secret out "
            "of what wrote that file (a config's label names, a chat template, a model or dataset name, an "
            "extra file) and save again; do not publish the folder as is"
        )


def published_text_files(folder: str | Path) -> list[str]:
    """The files of ``folder`` a save publishes (:func:`hush_hf.trainer.publishing.publishable_files`)
    that :func:`is_read` reads."""
    from hush_hf.trainer.publishing import publishable_files

    return [name for name in publishable_files(folder) if is_read(name)]
