"""Every file in a model folder that could hold weights, at any depth, for ``hush verify``.

A certificate names the weight files it certifies (``hush_hf.planning.record``). Other weights beside
them (``consolidated.safetensors``, ``original/model.safetensors``, a GGUF or ONNX export) speak for a
model the certificate says nothing about, so verify fails on any file whose name ends in a suffix that
a framework stores tensors under, or in an archive suffix (an archive can hold anything):

- PyTorch and safetensors: ``.safetensors``, ``.bin``, ``.pt``, ``.pth``, ``.ckpt``, ``.pkl``,
  ``.pickle``, ``.joblib``, ``.nemo``, ``.ot`` (rust-bert);
- llama.cpp and friends: ``.gguf``, ``.ggml``, ``.ggjt``, ``.llamafile``;
- TensorFlow / Keras / Flax / JAX: ``.h5``, ``.hdf5``, ``.keras``, ``.msgpack``, ``.pb``, ``.tflite``,
  ``.index`` and ``.data-NNNNN-of-NNNNN`` (checkpoints), ``.orbax``;
- NumPy, ONNX, others: ``.npz``, ``.npy``, ``.onnx``, ``.ort``, ``.mlmodel``, ``.mlpackage``,
  ``.params`` (MXNet), ``.pdparams`` (Paddle), ``.caffemodel``, ``.engine`` and ``.trt`` (TensorRT),
  ``.mar`` (TorchServe);
- archives: ``.zip``, ``.tar``, ``.gz``, ``.tgz``, ``.bz2``, ``.xz``, ``.zst``, ``.7z``, ``.rar``.

Matching ignores case. One file is not weights although its suffix is: the ``training_args.bin``
that ``Trainer.save_model`` writes at the top level, accepted only when it reads (without unpickling)
as a small pickled ``TrainingArguments``: a ``torch.save`` archive with no tensor storage whose pickle
refers only to transformers / accelerate / PEFT / TRL / hush_hf classes and ``torch.device``, and holds
no raw bytes (:func:`holds_training_arguments_only`).
"""

from __future__ import annotations

import os
import pickletools
import re
import zipfile
from pathlib import Path

WEIGHT_LIKE_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib", ".nemo", ".ot",
    ".gguf", ".ggml", ".ggjt", ".llamafile",
    ".h5", ".hdf5", ".keras", ".msgpack", ".pb", ".tflite", ".index", ".orbax",
    ".npz", ".npy", ".onnx", ".ort", ".mlmodel", ".mlpackage", ".params", ".pdparams", ".caffemodel",
    ".engine", ".trt", ".mar",
    ".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".zst", ".7z", ".rar",
)
_TF_SHARD = re.compile(r"\.data-\d+-of-\d+$", re.IGNORECASE)
TRAINING_ARGS_FILE = "training_args.bin"
#: A pickled TrainingArguments is ~6 KB; larger is not one (and could carry a model in its fields).
TRAINING_ARGS_MAX_BYTES = 64 * 1024
_ARGS_MODULES = ("transformers.", "accelerate.", "peft.", "trl.", "hush_hf.")
_ARGS_GLOBALS = {("torch", "device")}
#: Opcodes that load tensors (persistent ids), raw bytes, or classes named from the stack.
_FORBIDDEN_OPS = {"PERSID", "BINPERSID", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
                  "STACK_GLOBAL", "INST", "OBJ", "EXT1", "EXT2", "EXT4", "NEXT_BUFFER", "READONLY_BUFFER"}


def is_weight_like(name: str) -> bool:
    """Whether a file (or folder, e.g. ``.mlpackage``) name has a suffix weights are stored under."""
    lower = name.lower()
    return lower.endswith(WEIGHT_LIKE_SUFFIXES) or bool(_TF_SHARD.search(lower))


def weight_like_files(folder: str | Path) -> list[str]:
    """Relative POSIX paths of every weight-like file under ``folder``, at any depth (symbolic links
    followed, each real folder once), sorted; ``training_args.bin`` at the top level only when it is a
    pickled TrainingArguments (:func:`holds_training_arguments_only`)."""
    folder = Path(folder)
    found, seen = [], set()
    for root, dirs, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        relative = Path(root).relative_to(folder)
        for name in files + [d for d in dirs if is_weight_like(d)]:
            path = relative / name
            if not is_weight_like(name):
                continue
            if path.as_posix() == TRAINING_ARGS_FILE and holds_training_arguments_only(folder / path):
                continue
            found.append(path.as_posix())
    return sorted(found)


def holds_training_arguments_only(path: str | Path) -> bool:
    """Whether ``path`` is a ``torch.save`` archive of at most ``TRAINING_ARGS_MAX_BYTES`` holding one
    pickle and no tensor storage, whose pickle (read opcode by opcode, never executed) names only
    transformers / accelerate / PEFT / TRL / hush_hf classes and ``torch.device``, and holds no raw bytes."""
    path = Path(path)
    try:
        small = path.is_file() and path.stat().st_size <= TRAINING_ARGS_MAX_BYTES
        if not small or not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [n for n in names if n.endswith("/data.pkl")]
            if len(pickles) != 1 or any("/data/" in n for n in names):
                return False
            data = archive.read(pickles[0])
        for opcode, argument, _ in pickletools.genops(data):
            if opcode.name in _FORBIDDEN_OPS:
                return False
            if opcode.name == "GLOBAL":
                module, _, name = str(argument).partition(" ")
                if not (module.startswith(_ARGS_MODULES) or (module, name) in _ARGS_GLOBALS):
                    return False
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return False
    return True
