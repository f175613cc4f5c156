"""Recipes: each one's --smoke run in a subprocess (output files and their content), the shared helpers,
and the masked-positions BERT head against an independent per-example reference.

The smoke runs are the slow part (~30-50 s each on 2 cores, most of it imports and planning); one of
them goes through ``accelerate launch --num_processes 1`` to prove the launch path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hush_hf import experiments as ex
from hush_hf.trainer.masked_positions import (
    BertForMaskedPositionsLM,
    labelled_positions,
    masked_positions_loss,
)
from tests.test_recipes_helpers import (
    ACCELERATE,
    RECIPES,
    assert_files,
    assert_no_secret_leaks,
    output_texts,
    recipe_module,
    run_recipe,
    single_thread,  # noqa: F401  (autouse fixture)
    whole_words_in,
)

arxiv_mlm = recipe_module("arxiv_mlm")


# ------------------------------------------------------------------------------ arxiv_mlm (recipe 1)
def test_arxiv_mlm_smoke_under_accelerate_launch(tmp_path):
    out = tmp_path / "arxiv"
    done = run_recipe(
        ["recipes/arxiv_mlm.py", "--smoke", "--output_dir", str(out)],
        launcher=[
            str(ACCELERATE),
            "launch",
            "--num_processes",
            "1",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
        ],
    )
    assert_files(out, ["results.json", "results.md", "fig1.png", "arms.png", "run.log"])
    results = json.loads((out / "results.json").read_text())
    assert results["certified_for_this_run"] is True and results["warning"] is None
    rows = {(r["setting"], r["c_exponent"]): r for r in results["rows"]}
    assert set(rows) == {(s, k) for s in ("paper", "hush_hf") for k in (2, 4)}
    kept = results["data"]["examples_with_a_secret"] / results["data"]["train_examples"]
    for (setting, k), row in rows.items():
        assert row["meets_targets"] is True and row["bound_over_target_max"] <= 1.0
        assert 0 < row["retained_fraction"] <= kept + 1e-12
        assert row["noise_multiplier_trained"] == row["noise_multiplier"]
        for key in ("test_loss_no_noise", "test_loss_noise"):
            if k == 4:  # trained
                assert math.isfinite(row[key]) and 0 < row[key] < 20, (setting, k, key)
            else:  # planned only
                assert key not in row, (setting, k, key)
    for k in (2, 4):
        # The tight accountant certifies the same targets with less noise than the paper's KL route.
        assert rows[("hush_hf", k)]["noise_multiplier"] < rows[("paper", k)]["noise_multiplier"]
    # Relative units: c = 2^4 is the paper's "no preprocessing", every example with a secret kept.
    for setting in ("paper", "hush_hf"):
        assert rows[(setting, 4)]["retained_fraction"] == pytest.approx(kept, abs=1e-12)
        assert rows[(setting, 2)]["retained_fraction"] < rows[(setting, 4)]["retained_fraction"]
        assert rows[(setting, 2)]["noise_multiplier"] < rows[(setting, 4)]["noise_multiplier"]
    # At c = 2^4 both settings train on the same sampling probabilities: one no-noise run serves both.
    assert rows[("paper", 4)]["run_no_noise"] == rows[("hush_hf", 4)]["run_no_noise"]
    assert [r["name"] for r in results["runs"]] == [
        "non_private", "paper_c+4_no_noise", "paper_c+4_noise", "hush_hf_c+4_noise"]
    # The 20 words and the 2 canaries (3 copies each) are the secrets of every plan.
    data = results["data"]
    assert (data["word_secrets"], data["canaries"], data["secrets"]) == (20, 2, 22)
    assert data["trainable_parameters"] == 384 * 384 + 384 + 2 * 384 + 30522  # the MLM head (tied decoder)
    # The four arms at one guarantee; with c = 2^4 the only trained c, hush_hf's arm is the no-LP tight run.
    arms = {a["arm"]: a for a in results["arms"]}
    assert list(arms) == ["non_private", "paper_no_lp", "dp_sgd_tight", "hush_hf"]
    assert arms["non_private"]["sigma"] == 0 and arms["non_private"]["c"] is None
    assert arms["paper_no_lp"]["sigma"] == rows[("paper", 4)]["noise_multiplier"]
    assert arms["dp_sgd_tight"]["name"] == arms["hush_hf"]["name"] == "hush_hf_c+4_noise"
    for arm in arms.values():
        assert math.isfinite(arm["test_loss"]) and 0 <= arm["exposure_mean"] <= arm["exposure_max"] <= 33.3
    loss = {name: arm["test_loss"] for name, arm in arms.items()}
    expected_gap = (loss["paper_no_lp"] - loss["hush_hf"]) / (loss["paper_no_lp"] - loss["non_private"])
    assert results["gap_closed"] == pytest.approx(expected_gap, rel=1e-12)
    plans = sorted(p.name for p in (out / "plans").glob("*.json"))
    assert plans == ["hush_hf_c+4.json", "paper_c+4.json"]  # the plans of the trained c
    table = (out / "results.md").read_text()
    assert "| 2^2 |" in table and "| 2^4 |" in table and "| dp_sgd_tight | 2^4 | tight |" in table
    assert f"hush_hf closes **{100 * results['gap_closed']:.0f}%**" in table
    assert "planning" in results["timings_seconds"] and "planning" in results["cpu_seconds"]
    planning = results["timings_seconds"]["planning"], results["cpu_seconds"]["planning"]
    assert f"planning {planning[0]:.0f} [{planning[1]:.0f}]" in table  # the planning phase on its own
    assert "Training runs" in done.stderr  # progress bars
    words, canary_values = smoke_secrets()
    assert_no_secret_leaks(out, words)
    assert not whole_words_in(canary_values, output_texts(out))


def smoke_secrets() -> tuple[set[str], list[str]]:
    """The secret words and canary values of the arxiv_mlm smoke preset, recomputed outside the run."""
    args, _ = arxiv_mlm.EXPERIMENT.parse(["--smoke"])
    _, _, _, secrets, canaries, num_words = arxiv_mlm.load_data(args)
    assert num_words == 20 and len(canaries) == 2
    return {s.name for s in secrets[:num_words]}, [c.value for c in canaries]


@pytest.mark.filterwarnings("ignore:noise_multiplier=0")
def test_accounting_scale_trains_with_less_noise_and_says_so(tmp_path):
    out = tmp_path / "scaled"
    with pytest.warns(UserWarning, match="below the plan's calibrated"):
        results = arxiv_mlm.main(
            [
                "--smoke",
                "--output_dir",
                str(out),
                "--settings",
                "paper",
                "--c_exponents",
                "4",
                "--train_c_exponents",
                "4",
                "--accounting_scale",
                "10",
            ]
        )
    assert results["certified_for_this_run"] is False
    (row,) = results["rows"]
    assert row["noise_multiplier_trained"] == pytest.approx(row["noise_multiplier"] / 10, rel=1e-15)
    assert {run["sigma"] for run in results["runs"]} == {0.0, row["noise_multiplier_trained"]}
    saved = json.loads((out / "results.json").read_text())
    assert saved["certified_for_this_run"] is False
    assert "HOLD ONLY FOR THE SIMULATED SETTING WITH A 10x LARGER BATCH" in saved["warning"]
    assert (out / "results.md").read_text().startswith("> **WARNING: ACCOUNTING SCALE 10")
    assert (out / "run.log").read_text().count("ACCOUNTING SCALE 10") >= 2  # at the start and the end


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--secret_band", "9", "3"], r"secret_band must be two int values lo <= hi, got \[9, 3\]"),
        (["--train_c_exponents", "3"], r"train_c_exponents \[3\] are not in c_exponents=\[2, 4\]"),
        (["--noise_multiplier", "1.0"], r"noise_multiplier=1\.0: this recipe sets noise_multiplier"),
        (["--accounting_scale", "0.5"], r"accounting_scale must be >= 1 .*got 0\.5"),
        (["--settings", "paper", "paper"], r"settings must be distinct names"),
        (["--secret_selection", "tfidf"], r"secret_selection must be one of \['df', 'rank'\], got 'tfidf'"),
        (["--c_unit", "bits"], r"c_unit must be one of \['relative', 'absolute'\], got 'bits'"),
        (["--trainable", "norms"], r"trainable must be one of \['head', 'lora', 'all'\], got 'norms'"),
        (["--num_canaries", "-1"], r"num_canaries must be an integer >= 0, got -1"),
        (["--test_fraction", "0.9"], r"test_fraction must be a number in \(0, 0\.5\], got 0\.9"),
    ],
)
def test_arxiv_mlm_refuses_bad_arguments_before_any_work(tmp_path, argv, match):
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=match):
        arxiv_mlm.main(["--smoke", "--output_dir", str(out), *argv])
    assert not out.exists()


def test_paper_preset_needs_a_dataset_and_takes_the_papers_settings(tmp_path):
    with pytest.raises(ValueError, match="preset='paper' needs --dataset_name"):
        arxiv_mlm.main(["--preset", "paper", "--output_dir", str(tmp_path / "never")])
    argv = ["--preset", "paper", "--dataset_name", "arxiv.jsonl", "--max_steps", "7"]
    args, config = arxiv_mlm.EXPERIMENT.parse(argv)
    assert (config.expected_batch_size, config.max_steps) == (2048.0, 7)  # explicit flags win over the preset
    assert args.accounting_scale == 10.0 and args.model_name_or_path == arxiv_mlm.PAPER_MODEL
    assert (args.secret_selection, args.secret_band) == ("rank", [50_000, 150_000])
    assert args.c_exponents == args.train_c_exponents == list(range(-6, 5))
    assert config.output_dir == "outputs/arxiv_mlm"


def test_relative_c_unit_makes_c_16_keep_every_example():
    sizes = np.array([50, 100, 0, 75])
    budget = np.array([0.01, 0.004, 0.02, 0.016])
    unit = ex.c_unit_for(sizes, budget, "relative")
    capacity = 16 * unit * budget
    assert np.all(capacity[sizes > 0] >= sizes[sizes > 0] * (1 - 1e-12))
    assert np.isclose(capacity / np.maximum(sizes, 1), 1.0).sum() == 1  # the tightest secret binds exactly
    assert ex.c_unit_for(sizes, budget, "absolute") == 1.0
    with pytest.raises(ValueError, match="no training example contains any secret"):
        ex.c_unit_for(np.zeros(3), budget[:3], "relative")


def test_trainable_subsets_unfreeze_the_head_the_adapters_or_everything():
    """head: the MLM head's transform and output bias, never the tied decoder (the pretrained embeddings);
    lora: rank-8 adapters on every query and value projection plus that head; all: every parameter."""
    trained = {}
    for subset in ("head", "lora", "all"):
        model = ex.bert_masked_lm(None, trainable=subset, seed=0, lora_rank=arxiv_mlm.LORA_RANK)
        trained[subset] = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    head = {n.removeprefix("cls.predictions."): k for n, k in trained["head"].items()}
    assert head == {"bias": 30522, "transform.dense.weight": 384 * 384, "transform.dense.bias": 384,
                    "transform.LayerNorm.weight": 384, "transform.LayerNorm.bias": 384}
    adapters = {n: k for n, k in trained["lora"].items() if ".lora_" in n}
    assert len(adapters) == 6 * 2 * 2 and sum(adapters.values()) == 6 * 2 * 2 * 384 * 8  # layers x q,v x A,B
    others = {n.removeprefix("base_model.model.") for n in trained["lora"] if ".lora_" not in n}
    assert others == set(trained["head"])
    assert sum(trained["all"].values()) == 22_565_376 + 384 * 384 + 3 * 384 + 30522  # encoder + head


# ------------------------------------------------------------------------------ masked-positions head
def tiny_bert_pair(seed: int = 0):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    reference = BertForMaskedLM(config).double()
    model = BertForMaskedPositionsLM(config).double()
    model.load_state_dict(reference.state_dict())
    return reference, model


def mlm_batch(seed: int = 0, b: int = 5, length: int = 12):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (b, length), generator=generator)
    attention = torch.ones(b, length, dtype=torch.long)
    attention[1, 8:] = 0
    labels = torch.full((b, length), -100)
    masked = torch.rand(b, length, generator=generator) < 0.3
    masked[2] = False  # an example with nothing to predict
    masked[3, :] = True  # and one with every position
    labels[masked] = ids[masked]
    labels[1, 8:] = -100
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "position_ids": torch.arange(length).repeat(b, 1),
        "labels": labels,
    }


def test_labelled_positions_puts_each_rows_labels_first_in_order():
    labels = torch.tensor([[-100, 7, -100, 9], [5, -100, -100, -100], [-100, -100, -100, -100]])
    positions, selected = labelled_positions(labels)
    assert positions.tolist() == [[1, 3], [0, 1], [0, 1]]
    assert selected.tolist() == [[7, 9], [5, -100], [-100, -100]]


def test_masked_positions_head_gives_the_same_losses_and_per_example_gradients():
    from hush_hf.clipping import GhostClipper
    from hush_hf.trainer.losses import lm_per_example_loss

    reference, model = tiny_bert_pair()
    batch = mlm_batch()
    expected = lm_per_example_loss(reference, dict(batch))
    losses = masked_positions_loss(model, dict(batch))
    torch.testing.assert_close(losses, expected, rtol=1e-12, atol=1e-12)
    assert losses[2] == 0
    # Independent reference: each example's gradient by its own backward pass on the plain BERT.
    norms = []
    for i in range(losses.shape[0]):
        reference.zero_grad()
        lm_per_example_loss(reference, {k: v[i : i + 1] for k, v in batch.items()}).sum().backward()
        norms.append(torch.sqrt(sum((p.grad**2).sum() for p in reference.parameters() if p.grad is not None)))
    clipper = GhostClipper(model, 1e9)
    try:
        ghost = clipper.per_example_norms(masked_positions_loss(model, dict(batch)))
    finally:
        clipper.remove()
    torch.testing.assert_close(ghost, torch.stack(norms).to(ghost.dtype), rtol=1e-10, atol=1e-12)
    assert ghost[2] == 0


def test_masked_positions_model_scores_every_position_without_labels_and_hf_loss_with_them():
    reference, model = tiny_bert_pair(1)
    batch = mlm_batch(1)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    torch.testing.assert_close(model(**inputs).logits, reference(**inputs).logits)
    expected = reference(**batch).loss.to(torch.float32)
    torch.testing.assert_close(model(**batch).loss, expected, rtol=1e-6, atol=0)


# ------------------------------------------------------------------------------ common helpers
def test_mean_token_loss_is_the_corpus_token_mean_whatever_the_batching():
    from hush_hf.trainer.losses import lm_per_example_loss

    reference, model = tiny_bert_pair(2)
    batch = mlm_batch(2, b=6)
    with torch.no_grad():
        expected = float(reference(**batch).loss)  # transformers: mean over all labelled tokens of the batch
    rows = [{k: v[i] for k, v in batch.items()} for i in range(6)]

    def stack(features):
        return {k: torch.stack([f[k] for f in features]) for k in features[0]}

    for size in (1, 4, 6):
        batches = ex.collate_batches(rows, stack, size)
        assert ex.mean_token_loss(model, batches, masked_positions_loss, causal=False) == pytest.approx(
            expected, rel=1e-9
        )
        assert ex.mean_token_loss(reference, batches, lm_per_example_loss, causal=False) == pytest.approx(
            expected, rel=1e-9
        )


def test_preset_defaults_apply_and_explicit_flags_win():
    args, config = arxiv_mlm.EXPERIMENT.parse([])
    assert args.preset == "offline" and config.output_dir == "outputs/arxiv_mlm"
    assert (config.max_steps, config.expected_batch_size, config.max_grad_norm) == (40, 32.0, 0.0)
    assert config.report_to == [] and args.c_exponents == [-6, 0, 2, 4]
    argv = ["--smoke", "--learning_rate", "0.5", "--c_exponents", "3"]
    args, config = arxiv_mlm.EXPERIMENT.parse(argv)
    assert args.preset == "smoke" and config.output_dir == "outputs/arxiv_mlm_smoke"
    assert (config.max_steps, config.learning_rate, args.c_exponents) == (3, 0.5, [3])
    with pytest.raises(ValueError, match="--smoke conflicts with preset='paper'"):
        arxiv_mlm.EXPERIMENT.parse(["--smoke", "--preset", "paper"])
    with pytest.raises(ValueError, match="preset='huge' is not one of"):
        arxiv_mlm.EXPERIMENT.parse(["--preset", "huge"])


def test_markdown_and_json_helpers():
    table = ex.markdown_table(["a", "b"], [[1.23456, None], [float("nan"), True]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1.235 | — |", "| — | yes |"]
    assert ex.json_ready({"x": np.float64(1.5), "y": [np.int64(2), float("inf")], "p": Path("a")}) == {
        "x": 1.5,
        "y": [2, None],
        "p": "a",
    }


def test_pivot_table_and_series_follow_the_rows():
    rows = [{"c": 1, "s": "a", "x": 0.5}, {"c": 2, "s": "a", "x": 0.25}, {"c": 1, "s": "b", "x": 3}]
    table = ex.pivot_table(rows, row="c", column="s", values={"x": "loss"}, row_format="2^{}")
    assert table.splitlines() == [
        "| c | loss [a] | loss [b] |", "|---|---|---|", "| 2^1 | 0.5 | 3 |", "| 2^2 | 0.25 | — |"]
    assert ex.series_by(rows, "s", "c", "x") == {"a": ([1, 2], [0.5, 0.25]), "b": ([1], [3])}
    unscored = {"c": 3, "s": "a", "x": None}  # a run that was not trained: no point
    assert ex.series_by([*rows, unscored], "s", "c", "x")["a"] == ([1, 2], [0.5, 0.25])


def test_split_holds_out_whole_groups_and_keeps_the_order():
    import datasets

    corpus = datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(10)], "doc": list("aabbbcdddd")})
    train, test = ex.split_held_out(corpus, 0.5, seed=3, group_column="doc")
    assert len(train) + len(test) == 10 and not set(train["doc"]) & set(test["doc"])
    assert len(set(test["doc"])) == 2  # half of the 4 groups
    for part in (train, test):
        assert part["text"] == sorted(part["text"], key=lambda t: int(t.split()[1]))
    rows_train, rows_test = ex.split_held_out(corpus, 0.3, seed=3, max_train=4)
    assert (len(rows_train), len(rows_test)) == (4, 3)
    assert not set(rows_train["text"]) & set(rows_test["text"])


def test_keyed_fingerprints_create_a_private_key_once_and_are_stable(tmp_path):
    import os
    import stat

    from hush_hf.secrets import Secret, secret_fingerprint

    secrets = [Secret(name=n, prior=1e-4, target_posterior=1e-2, terms=(n,)) for n in ("hashlib", "ssl")]
    assert ex.keyed_fingerprints(secrets, None) is None
    key_file = tmp_path / "keys" / "fingerprint.key"
    first = ex.keyed_fingerprints(secrets, key_file)
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600 and len(key_file.read_bytes()) == 32
    assert first == [secret_fingerprint(n, key_file.read_bytes()) for n in ("hashlib", "ssl")]
    assert ex.keyed_fingerprints(secrets, key_file) == first  # the existing key is read, not replaced
    assert not any(n in f for n in ("hashlib", "ssl") for f in first)


def test_blocks_are_consecutive_pieces_of_the_joined_texts():
    texts = ["alpha beta", "gamma", "delta epsilon zeta", "eta"]
    joined = list("\n\n".join(texts).encode()) + list(b"\n\n")
    blocks = ex.make_blocks(texts, ex.ByteTokens(), 7, 4, list(b"\n\n"))
    assert blocks == [joined[7 * k : 7 * k + 7] for k in range(4)]
    with pytest.raises(ValueError, match="gives only 6 blocks of 7 tokens, 7 are needed"):  # 44 bytes
        ex.make_blocks(texts, ex.ByteTokens(), 7, 7, list(b"\n\n"))
    dataset = ex.block_dataset(blocks, with_secret_ids=True)
    assert dataset["secret_ids"] == [[0], [1], [2], [3]] and dataset["labels"] == blocks


# ------------------------------------------------------------------------------ launch configurations
@pytest.mark.parametrize(
    ("environ", "match"),
    [
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, "ACCELERATE_USE_DEEPSPEED='true': DeepSpeed is not supported"),
        ({"ACCELERATE_USE_FSDP": "true"}, "FSDP_VERSION='1': FSDP1 is not supported"),  # accelerate's default
        (
            {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "true"},
            "FSDP_OFFLOAD_PARAMS='true' is not supported",
        ),
        (
            {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_ACTIVATION_CHECKPOINTING": "true"},
            "FSDP_ACTIVATION_CHECKPOINTING='true' is not supported",
        ),
        (
            {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "ACCELERATE_MIXED_PRECISION": "fp16"},
            "ACCELERATE_MIXED_PRECISION='fp16' is not supported .* under FSDP",
        ),
    ],
)
def test_unsupported_launches_are_refused_before_any_work(tmp_path, monkeypatch, environ, match):
    for variable, value in environ.items():
        monkeypatch.setenv(variable, value)
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=match):
        arxiv_mlm.main(["--smoke", "--output_dir", str(out)])
    assert not out.exists()
    off = {"ACCELERATE_USE_DEEPSPEED": "false", "ACCELERATE_USE_FSDP": "0"}
    ex.refuse_unsupported_launch({**environ, **off})  # an explicit "false" is not a request for it
    supported = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}
    for precision in ("no", "bf16"):  # FSDP2 in float32 and in bf16 run
        ex.refuse_unsupported_launch({**supported, "ACCELERATE_MIXED_PRECISION": precision})


def test_accelerate_configs_describe_the_launches_they_are_named_after():
    from accelerate.commands.config.config_args import ClusterConfig

    folder = Path(__file__).resolve().parents[1] / "configs" / "accelerate"
    expected = {"single_gpu.yaml": ("NO", 1), "multi_gpu.yaml": ("MULTI_GPU", 2), "fsdp.yaml": ("FSDP", 2)}
    for name, (kind, processes) in expected.items():
        config = ClusterConfig.from_yaml_file(folder / name)
        assert (config.distributed_type.value, config.num_processes) == (kind, processes), name
        assert config.mixed_precision == "no" and config.use_cpu is False
    fsdp = ClusterConfig.from_yaml_file(folder / "fsdp.yaml").fsdp_config
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_offload_params"] is False


def test_the_fsdp_config_launches_what_the_dp_step_accepts(tmp_path):
    """The environment ``accelerate launch`` derives from configs/accelerate/fsdp.yaml passes the recipes'
    launch check (FSDP2, float32, no offloading); the training itself is tests/test_trainer_fsdp.py."""
    script = tmp_path / "check.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(RECIPES.parent)!r})\n"
        "from hush_hf.experiments import refuse_unsupported_launch\n"
        "refuse_unsupported_launch()\n"
        "print('accepted', os.environ['ACCELERATE_USE_FSDP'], os.environ['FSDP_VERSION'])\n"
    )
    config = "configs/accelerate/fsdp.yaml"
    launcher = [str(ACCELERATE), "launch", "--config_file", config, "--num_processes", "1"]
    done = run_recipe([str(script)], launcher=launcher, timeout=120)
    assert "accepted true 2" in done.stdout
