"""What a DP run may publish: an allow-list of the files in ``output_dir``.

``Trainer.push_to_hub`` uploads all of ``output_dir`` except ``_*`` and ``checkpoint-*``. A script
such as run_clm.py also leaves there ``trainer_state.json`` (the per-step un-noised training loss
and the drawn batch sizes), ``*_results.json``, ``runs/`` (TensorBoard logs) and
``training_args.bin``: statistics of the drawn batches that the noise does not cover. So a DP
run uploads only the model (weights or adapters), its config, the tokenizer or processor, the
model card, the plan and the privacy report; anything else only when named explicitly.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from pathlib import Path

PUBLISHABLE = (
    # weights (full, sharded, adapters) and their index
    "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
    "pytorch_model.bin", "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json",
    "adapter_model.safetensors", "adapter_model.bin", "adapter_config.json",
    # config
    "config.json", "generation_config.json",
    # tokenizer / processor
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
    "*.tiktoken", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
    "processor_config.json",
    # card, plan, privacy report and its plots
    "README.md", "hush_plan.json", "privacy_report.json", "privacy_report.md",
    "bound_over_target.png", "targets.png", "exposure.png", "reconstruction.png",
)
NEVER_BY_PATTERN = ("trainer_state.json", "*_results.json", "runs", "checkpoint-*", "training_args.bin")


def publishable_files(folder: str | Path, extra_files: Iterable[str] = ()) -> list[str]:
    """Paths (relative, POSIX) of the files in ``folder`` a DP run uploads: top-level files matching
    ``PUBLISHABLE``, plus ``extra_files`` (relative paths of files or folders) named explicitly."""
    folder = Path(folder)
    chosen = {
        p.name
        for p in folder.iterdir()
        if p.is_file() and any(fnmatch.fnmatch(p.name, g) for g in PUBLISHABLE)
    }
    for name in extra_files:
        path = folder / name
        if not path.exists():
            raise ValueError(f"extra_files: {name!r} does not exist in {str(folder)!r}")
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        chosen.update(p.relative_to(folder).as_posix() for p in files)
    return sorted(chosen)


def upload_publishable(
    api: object,
    *,
    repo_id: str,
    folder: str | Path,
    commit_message: str,
    token: str | None,
    revision: str | None,
    run_as_future: bool,
    extra_files: Iterable[str] = (),
) -> object:
    """One commit adding exactly :func:`publishable_files` (``api`` is an ``HfApi``)."""
    from huggingface_hub import CommitOperationAdd

    folder = Path(folder)
    operations = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name))
        for name in publishable_files(folder, extra_files)
    ]
    return api.create_commit(
        repo_id=repo_id,
        operations=operations,
        commit_message=commit_message,
        token=token,
        revision=revision,
        run_as_future=run_as_future,
    )
