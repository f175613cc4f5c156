"""Where the secret DP seed of a run lives: a private folder outside ``output_dir``.

Whoever knows the seed knows every batch and every noise draw (:mod:`hush_hf.sampling.seeds`), and can
subtract the noise from the published weights. ``output_dir`` is what people upload
(``huggingface-cli upload org/model out/``, ``push_to_hub(extra_files=["checkpoint-4"])``), so nothing
secret is written there: a checkpoint records a random, non-secret *run id*; the seed is in
``<dp_state_dir>/<run_id>.json`` (owner-only, folder 0700), written by rank 0 when the first checkpoint
is saved (a run that saves no checkpoint leaves no seed on disk). ``dp_state_dir`` defaults to
``$HUSH_HF_DP_STATE_DIR``, else ``$XDG_CACHE_HOME/hush_hf/dp_state`` (``~/.cache/hush_hf/dp_state``);
one inside ``output_dir`` is refused. Delete a run's file once its checkpoints will not be resumed.

Resuming from checkpoint k reads the seed back: batches and noise of steps k+1..T are those the
interrupted run drew (bit-exact weights on deterministic hardware), so a resumed run releases nothing
the uninterrupted run would not have. Without the seed file a resume is refused, never continued with a
fresh seed, because fresh randomness for steps k+1..T is sound only if nothing computed from the lost
steps k+1..K (K: where the first attempt stopped) was released and the decision to rerun did not depend
on them; the tool can verify neither:

- a later checkpoint m > k of the first attempt (in ``output_dir``, copied elsewhere, or pushed with
  ``hub_strategy="every_save"``) is a release of steps k+1..m. With a fresh seed the same examples would
  pay for steps k+1..m twice, under independent noise: 2(m - k) + k steps of data access against the T
  the noise is calibrated for; two independent noisy views of the same step average the noise away;
- even with nothing released, a rerun chosen after seeing the first attempt (its un-noised losses in
  ``trainer_state.json``/``runs/``, a divergence, an out-of-memory error caused by long examples) is a
  data-dependent choice among runs, which the per-secret accounting of one run does not cover
  (selection among DP runs costs privacy: Papernot and Steinke 2022). With the stored seed a rerun
  reproduces the same run, so there is nothing to choose from.

So the only sound continuation without the seed is a new run from step 0 with a fresh model.

The seed file must also be the run's own: a file with the right run id but another valid seed (copied
from another run, or rewritten) would resume with randomness nobody accounted for. The seed file holds
a random 256-bit key beside the seed, and every checkpoint records the keyed digest
HMAC-SHA256(key, run id, seed) (:func:`seed_commitment`); a resume recomputes it from the file and
refuses one that differs. The key is secret like the seed and stays in the file, so the digest in a
checkpoint (which may be uploaded) reveals nothing about the seed, even an explicit low-entropy
``dp_seed``; finding another (key, seed) pair with the same digest is finding an HMAC-SHA256 collision.

The file also says where the seed came from (``dp_seed_source``: ``"drawn"`` by hush_hf or set by the
``"user"``), so that a resumed run's training record states its first run's source
(:class:`hush_hf.planning.record.TrainingRecord`); a file written before the field existed gives None
(unknown), never ``"drawn"``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path
from typing import NamedTuple

from hush_hf.jsonfile import loads_json, read_text
from hush_hf.planning.record import DP_SEED_SOURCES, check_seed_source
from hush_hf.sampling.seeds import check_dp_seed

DP_STATE_DIR_ENV = "HUSH_HF_DP_STATE_DIR"
SEED_FILE_VERSION = 2  # 1 held no digest key: its seed cannot be bound to the run
RUN_ID_BYTES = 16
DIGEST_KEY_BYTES = 32
SEED_FILE_KEYS = ("format_version", "run_id", "dp_seed", "digest_key", "dp_seed_source")
COMMITMENT_PREFIX = "hmac-sha256:"
_COMMITMENT = re.compile(re.escape(COMMITMENT_PREFIX) + "[0-9a-f]{64}")
_DOMAIN = b"hush_hf dp seed commitment\0"


def default_dp_state_dir() -> Path:
    """``$HUSH_HF_DP_STATE_DIR``, else ``$XDG_CACHE_HOME/hush_hf/dp_state`` (``~/.cache`` by default)."""
    configured = os.environ.get(DP_STATE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "hush_hf" / "dp_state"


def resolve_dp_state_dir(dp_state_dir: str | Path | None, output_dir: str | Path) -> Path:
    """The folder seeds are kept in (``dp_state_dir``, or the default); a ValueError if it is inside
    ``output_dir``, where an upload of ``output_dir`` would take it."""
    folder = default_dp_state_dir() if dp_state_dir is None else Path(dp_state_dir).expanduser()
    resolved, output = folder.resolve(), Path(output_dir).expanduser().resolve()
    if resolved == output or output in resolved.parents:
        source = "dp_state_dir" if dp_state_dir is not None else f"default: ${DP_STATE_DIR_ENV} or ~/.cache"
        raise ValueError(
            f"dp_state_dir {str(folder)!r} ({source}) lies inside output_dir {str(output_dir)!r}: uploading "
            "output_dir would publish the secret DP seed; set dp_state_dir (or $HUSH_HF_DP_STATE_DIR) to a "
            "private folder outside it"
        )
    return folder


def new_run_id() -> str:
    """A random run id (32 hex digits). Not secret: it only names the seed file."""
    return secrets.token_hex(RUN_ID_BYTES)


def check_run_id(run_id: object, where: str) -> str:
    if not isinstance(run_id, str) or len(run_id) != 2 * RUN_ID_BYTES or not all(
        c in "0123456789abcdef" for c in run_id
    ):
        raise ValueError(f"{where}: run_id must be {2 * RUN_ID_BYTES} lowercase hex digits")
    return run_id


def seed_path(folder: str | Path, run_id: str) -> Path:
    return Path(folder) / f"{check_run_id(run_id, 'seed file')}.json"


def save_dp_seed(folder: str | Path, run_id: str, dp_seed: int, *, source: str | None = None) -> Path:
    """Write ``<folder>/<run_id>.json`` holding the seed, where it came from (``source``: ``"drawn"``,
    ``"user"``; None writes none: unknown) and a fresh digest key (0600, folder 0700), atomically; a file
    already there must hold the same seed (it is written once per run and never changes, so its key, the
    digest checkpoints record, and the source stay the first run's)."""
    path = seed_path(folder, run_id)
    dp_seed = check_dp_seed(dp_seed)
    source = check_seed_source(source, "dp_seed_source")
    if path.is_file():
        if _read_seed_file(path, run_id).seed != dp_seed:
            raise RuntimeError(f"seed file {str(path)!r} holds another seed than this run's")
        return path
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = secrets.token_hex(DIGEST_KEY_BYTES)
    recorded = f', "dp_seed_source": "{source}"' if source is not None else ""
    text = (f'{{"format_version": {SEED_FILE_VERSION}, "run_id": "{run_id}", "dp_seed": "{dp_seed}", '
            f'"digest_key": "{key}"{recorded}}}\n')
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def seed_commitment(folder: str | Path, run_id: str) -> str:
    """``hmac-sha256:<hex>``: HMAC-SHA256 keyed with the seed file's key over the run id and the seed
    (16 bytes, big-endian); what a checkpoint records so that a resume can tell the run's own seed file."""
    path = seed_path(folder, run_id)
    file = _read_seed_file(path, run_id)
    return _commitment(file.seed, file.key, run_id)


def check_commitment(commitment: object, where: str) -> str:
    if not isinstance(commitment, str) or not _COMMITMENT.fullmatch(commitment):
        raise ValueError(f"{where}: seed_digest must be '{COMMITMENT_PREFIX}' and 64 hex digits")
    return commitment


def _commitment(dp_seed: int, key: bytes, run_id: str) -> str:
    message = _DOMAIN + run_id.encode("ascii") + b"\0" + dp_seed.to_bytes(16, "big")
    return COMMITMENT_PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()


def load_dp_seed(folder: str | Path, run_id: str, *, checkpoint: str | Path | None,
                 commitment: str | None = None) -> int:
    """The seed of run ``run_id`` from ``<folder>/<run_id>.json``; a one-line ValueError naming the file
    and how to provide it when it is missing (``checkpoint``: what is being resumed, for the message).

    ``commitment``: the keyed digest the checkpoint recorded (:func:`seed_commitment`); a file whose
    key and seed give another one is refused in one line naming it (it is not this run's seed file)."""
    path = seed_path(folder, run_id)
    what = f"checkpoint {str(checkpoint)!r}" if checkpoint is not None else f"run {run_id}"
    if not path.is_file():
        raise ValueError(
            f"cannot resume {what}: the secret DP seed of its run is not in {str(path)!r}. Put the file "
            f"{run_id}.json from the dp_state_dir of the machine that trained it there, or point "
            f"dp_state_dir (or ${DP_STATE_DIR_ENV}) at the folder holding it. Without it the run cannot "
            "continue soundly (fresh randomness would redo steps whose results may have been released; see "
            "hush_hf.trainer.seed_store): start again from step 0 with a fresh model"
        )
    seed, key, _ = _read_seed_file(path, run_id)
    if commitment is not None and not hmac.compare_digest(_commitment(seed, key, run_id), commitment):
        raise ValueError(
            f"cannot resume {what}: DP seed file {str(path)!r} has the run id {run_id} but not the seed of "
            "the run that saved the checkpoint (its keyed digest differs from the one the checkpoint "
            "recorded); put that run's own seed file there, or start again from step 0 with a fresh model"
        )
    return seed


def load_dp_seed_source(folder: str | Path, run_id: str) -> str | None:
    """Where run ``run_id``'s seed came from, as its seed file says (``"drawn"``, ``"user"``; None: a file
    written before the source was recorded). Read after :func:`load_dp_seed` found the file."""
    return _read_seed_file(seed_path(folder, run_id), run_id).source


class _SeedFile(NamedTuple):
    seed: int
    key: bytes
    source: str | None  # None: written before the source was recorded (unknown)


def _read_seed_file(path: Path, run_id: str) -> _SeedFile:
    """The seed, digest key and seed source of a seed file, read and checked once; a one-line ValueError
    naming the file (never the values)."""
    data = loads_json(read_text(path, what="DP seed file"), source=f"DP seed file {str(path)!r}",
                      shown_keys=SEED_FILE_KEYS)
    if isinstance(data, dict) and data.get("format_version") == 1:
        raise ValueError(f"DP seed file {str(path)!r}: format_version 1 holds no digest key, so its seed "
                         "cannot be bound to a checkpoint; start again from step 0 with a fresh model")
    if not isinstance(data, dict) or data.get("format_version") != SEED_FILE_VERSION:
        raise ValueError(f"DP seed file {str(path)!r}: not a seed file of format_version {SEED_FILE_VERSION}")
    if data.get("run_id") != run_id:
        raise ValueError(f"DP seed file {str(path)!r} belongs to another run than its name says")
    seed = data.get("dp_seed")
    if not isinstance(seed, str) or not (seed.isascii() and seed.isdigit()):
        raise ValueError(f"DP seed file {str(path)!r}: dp_seed must be a decimal string (value not shown)")
    key = data.get("digest_key")
    if not isinstance(key, str) or not re.fullmatch(f"[0-9a-f]{{{2 * DIGEST_KEY_BYTES}}}", key):
        raise ValueError(f"DP seed file {str(path)!r}: digest_key must be {2 * DIGEST_KEY_BYTES} lowercase "
                         "hex digits (value not shown)")
    source = data.get("dp_seed_source")
    if source is not None and source not in DP_SEED_SOURCES:
        raise ValueError(f"DP seed file {str(path)!r}: dp_seed_source must be 'drawn' or 'user' (or absent: "
                         "unknown)")
    seed = check_dp_seed(int(seed), f"DP seed file {str(path)!r} dp_seed")
    return _SeedFile(seed, bytes.fromhex(key), source)
