"""What a DP run may publish: an allow-list of the files in ``output_dir``.

``Trainer.push_to_hub`` uploads all of ``output_dir`` except ``_*`` and ``checkpoint-*``. A script
such as run_clm.py also leaves there ``trainer_state.json`` (the per-step un-noised training loss
and the drawn batch sizes), ``*_results.json``, ``runs/`` (TensorBoard logs) and
``training_args.bin``: statistics of the drawn batches that the noise does not cover. So a DP
run uploads only the model (weights or adapters), its config, the tokenizer or processor, the
model card, the plan and the privacy report; anything else only when named explicitly.

The steps that write and upload (``save_model``, ``create_model_card``, ``push_to_hub``, the pushes
during training) are here too, once, for ``SecretProtectionTrainer`` and for any ``Trainer`` (TRL's
``SFTTrainer`` included) made private with ``GhostClippingCallback.attach``. The training record hashes
every weight file in the folder, so a save that leaves one it did not write (an earlier run's
``model.safetensors`` beside this run's adapter) is refused (:func:`check_all_written`).
"""

from __future__ import annotations

import fnmatch
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from hush_hf.trainer import transformers_api

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
    check_files: CheckFiles | None = None,
) -> object:
    """One commit adding exactly :func:`publishable_files` (``api`` is an ``HfApi``), after
    ``check_files(folder, names)`` (which raises to stop the upload)."""
    from huggingface_hub import CommitOperationAdd

    folder = Path(folder)
    names = publishable_files(folder, extra_files)
    if check_files is not None:
        check_files(folder, names)
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name)) for name in names]
    return api.create_commit(
        repo_id=repo_id,
        operations=operations,
        commit_message=commit_message,
        token=token,
        revision=revision,
        run_as_future=run_as_future,
    )


# ---------------------------------------------------------------------------------------------------------
# The publishing steps of a DP run, shared by ``SecretProtectionTrainer`` (its overrides) and by a plain or
# TRL ``Trainer`` given ``GhostClippingCallback.attach`` (routed onto the instance): ``save_weights`` is the
# trainer class's own ``save_model``, ``write_card`` its own ``create_model_card`` (TRL's writes TRL's card)
# and ``write_artifacts(output_dir, **kwargs)`` writes the card section, plan and privacy report
# (``GhostClippingCallback.write_protection_artifacts``).

SaveWeights = Callable[..., None]
CheckFiles = Callable[[Path, list[str]], None]
WriteArtifacts = Callable[..., dict]


def weight_file_stats(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """Top-level weight file name -> (inode, size, mtime, ctime in ns) of each one in ``folder``."""
    from hush_hf.planning.record import is_weight_file

    folder = Path(folder)
    if not folder.is_dir():
        return {}
    stats = {p.name: p.stat() for p in folder.iterdir() if p.is_file() and is_weight_file(p.name)}
    return {name: (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for name, st in stats.items()}


def check_all_written(folder: str | Path, before: dict[str, tuple[int, ...]]) -> None:
    """ValueError if a weight file in ``folder`` is as it was ``before`` a save: the save did not write it,
    yet the training record would hash and certify it with the weights the run trained (e.g. an earlier
    run's ``model.safetensors`` beside a DP run's ``adapter_model.safetensors``)."""
    stale = sorted(name for name, stat in weight_file_stats(folder).items() if before.get(name) == stat)
    if stale:
        raise ValueError(
            f"output_dir {str(folder)!r} holds the weight file {stale[0]!r}, which this save did not write "
            "(an earlier save left it): the training record would certify it as trained by this DP run, and "
            "push_to_hub would upload it; move it out of the folder (or save into an empty one) and save "
            "again"
        )


_SAVED: weakref.WeakKeyDictionary[Any, dict[str, dict[str, tuple[int, ...]]]] = weakref.WeakKeyDictionary()
"""trainer -> folder -> :func:`weight_file_stats` right after the trainer's last checked save there."""


def save_weights_checked(save: Callable[[], None], trainer: Any, folder: str | Path) -> None:
    """``save()``, then :func:`check_all_written` on ``folder`` (on the process that writes files)."""
    before = weight_file_stats(folder) if trainer.args.should_save else {}
    save()
    if trainer.args.should_save:
        check_all_written(folder, before)
        _SAVED.setdefault(trainer, {})[str(Path(folder).resolve())] = weight_file_stats(folder)


def check_saved_by(trainer: Any, folder: str | Path, what: str) -> None:
    """ValueError if a weight file in ``folder`` is not as one of ``trainer``'s checked saves left it:
    the card and record written there would certify it (e.g. TRL's checkpoints write the card into
    ``output_dir`` beside an earlier run's weights, before any save of this one)."""
    saved = _SAVED.get(trainer, {}).get(str(Path(folder).resolve()), {})
    for name, stat in sorted(weight_file_stats(folder).items()):
        if saved.get(name) != stat:
            raise ValueError(
                f"{what}: output_dir {str(folder)!r} holds the weight file {name!r}, which no save_model or "
                "push_to_hub of this trainer wrote (or it changed since): the card would certify it as "
                "trained by this DP run; save the weights with trainer.save_model() first, or move it out"
            )


def sharded_state_dict(trainer: Any) -> bool:
    """FSDP with a state dict type other than FULL_STATE_DICT (Trainer.save_model saves no weights)."""
    if not trainer.is_fsdp_enabled:
        return False
    return "FULL_STATE_DICT" not in str(trainer.accelerator.state.fsdp_plugin.state_dict_type)


def save_model(
    trainer: Any,
    output_dir: str | None,
    internal_call: bool,
    *,
    save_weights: SaveWeights,
    write_artifacts: WriteArtifacts,
) -> None:
    """Save the weights, and beside them the plan, the privacy report and the model card.

    Checkpoints (``internal_call`` with a folder) get only the weights and the DP state;
    ``save_model()`` and ``push_to_hub()`` get the full protection artifacts. Under FSDP2 with a
    sharded state dict, Trainer writes no weights in ``save_model`` (only checkpoints, sharded);
    the published model must be whole, so the full state dict is gathered (every rank calls this)
    and saved.
    """
    final = output_dir is None or not internal_call
    folder = output_dir or trainer.args.output_dir
    if not final:
        save_weights(output_dir, internal_call)
        return

    def save() -> None:
        if sharded_state_dict(trainer):
            state_dict = trainer.accelerator.get_state_dict(trainer.model)  # a collective: all ranks
            if trainer.args.should_save:
                transformers_api.save_weights(trainer, folder, state_dict)
        else:
            save_weights(output_dir, internal_call)

    save_weights_checked(save, trainer, folder)
    if trainer.args.should_save:
        write_artifacts(folder)


def create_model_card(
    trainer: Any, *args: Any, write_card: Callable[..., None], write_artifacts: WriteArtifacts, **kwargs: Any
) -> None:
    """The trainer's own README.md (Trainer's, or TRL's), then the Secret protection section added back
    with the plan and report: every rewrite of the card (push_to_hub, TRL's checkpoints) keeps it. Weight
    files there that no checked save of this trainer wrote are refused (:func:`check_saved_by`)."""
    if trainer.is_world_process_zero():
        check_saved_by(trainer, trainer.args.output_dir, "create_model_card")
    write_card(*args, **kwargs)
    if trainer.is_world_process_zero():
        write_artifacts(trainer.args.output_dir, model_name=kwargs.get("model_name"))


def push_to_hub(
    trainer: Any,
    commit_message: str | None,
    blocking: bool,
    token: str | None,
    revision: str | None,
    private: bool | None,
    *,
    save_weights: SaveWeights,
    extra_files: Sequence[str] = (),
    check_files: CheckFiles | None = None,
    **kwargs: Any,
) -> Any:
    """Upload the model, config, tokenizer, card, plan and privacy report, and nothing else.

    Same steps as ``Trainer.push_to_hub`` (save, model card, one commit), but the commit holds only
    the files :func:`publishable_files` allows: never trainer_state.json, ``*_results.json``, ``runs/``,
    training_args.bin or checkpoints, unless listed in ``extra_files`` (paths relative to ``output_dir``).
    """
    from transformers import trainer as hf_trainer  # its hf_api(), looked up as Trainer does

    args = trainer.args
    trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
    model_name = kwargs.pop("model_name", None)
    if model_name is None and args.should_save:
        model_name = (args.hub_model_id or Path(args.output_dir).name).split("/")[-1]
    token = token if token is not None else args.hub_token
    if trainer.hub_model_id is None:
        trainer.init_hf_repo(token=token, private=private)
    save_weights_checked(lambda: save_weights(None, True), trainer, args.output_dir)  # the artifacts: below
    if not trainer.is_world_process_zero():
        return None
    publishable_files(args.output_dir, extra_files)  # a missing extra file fails before the card
    tags = list(getattr(trainer.model, "model_tags", None) or [])
    if tags:
        given = kwargs.get("tags") or []
        given = [given] if isinstance(given, str) else list(given)
        kwargs["tags"] = given + [t for t in tags if t not in given]
    trainer.create_model_card(model_name=model_name, **kwargs)
    transformers_api.finish_current_push(trainer)
    return upload_publishable(
        hf_trainer.hf_api(),
        repo_id=trainer.hub_model_id,
        folder=args.output_dir,
        commit_message=commit_message,
        token=token,
        revision=revision if revision is not None else args.hub_revision,
        run_as_future=not blocking,
        extra_files=extra_files,
        check_files=check_files,
    )


def push_from_checkpoint(
    trainer: Any,
    checkpoint_folder: str,
    *,
    save_weights: SaveWeights,
    write_artifacts: WriteArtifacts,
    check_files: CheckFiles | None = None,
) -> None:
    """``hub_strategy="every_save"``: push the current model with its artifacts, through the allow-list.

    (Trainer's version uploads all of ``output_dir``; checkpoint strategies are refused at setup,
    since checkpoints hold the secret DP seed.)
    """
    from transformers import trainer as hf_trainer
    from transformers.utils.hub import PushInProgress

    args = trainer.args
    if not trainer.is_world_process_zero() or str(getattr(args.hub_strategy, "value", "")) == "end":
        return
    if not args.hub_always_push and trainer.push_in_progress is not None \
            and not trainer.push_in_progress.is_done():
        return
    trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
    save_weights_checked(lambda: save_weights(args.output_dir, True), trainer, args.output_dir)  # no push
    write_artifacts(args.output_dir)
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(args.output_dir)
    job = upload_publishable(
        hf_trainer.hf_api(),
        repo_id=trainer.hub_model_id,
        folder=args.output_dir,
        commit_message=f"Training in progress, step {trainer.state.global_step}",
        token=args.hub_token,
        revision=args.hub_revision,
        run_as_future=True,
        check_files=check_files,
    )
    if trainer.push_in_progress is None or trainer.push_in_progress.is_done():
        trainer.push_in_progress = PushInProgress([job])
    else:
        trainer.push_in_progress.jobs.append(job)
