"""Recipes 2-4 (gpt2_canary, gemma2_pretrain, code_completion): each --smoke in a subprocess with its
output files and their content checked, and the import-graph tagging of code_completion."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hush_hf import experiments as ex
from tests.test_recipes_helpers import (
    RECIPES,
    assert_files,
    assert_no_secret_leaks,
    output_texts,
    recipe_module,
    run_recipe,
    single_thread,  # noqa: F401  (autouse fixture)
    whole_words_in,
)

code_completion = recipe_module("code_completion")
code_imports = recipe_module("code_imports")


# ------------------------------------------------------------------------------ gpt2_canary (recipe 2)
def test_gpt2_canary_smoke(tmp_path):
    from hush_hf.audit.canaries import make_canaries
    from hush_hf.planning.plan import ProtectionPlan

    out = tmp_path / "canary"
    # Every arm's code path: uniform_dp is planned (the CRT arm's noise) but trained like hush_hf, so the
    # smoke preset leaves its training out; the KL accountant calibrates in ms.
    run_recipe(["recipes/gpt2_canary.py", "--smoke", "--output_dir", str(out)])
    assert_files(
        out,
        [
            "results.json",
            "results.md",
            "canaries.png",
            "run.log",
            "plans/uniform_dp.json",
            "plans/hush_hf.json",
            "crt_fig3.png",
            "plans/crt_gamma0.5.json",
            "plans/hush_hf_crt_gamma0.5.json",
        ],
    )
    results = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in results["rows"] if r["gamma"] is None}
    assert list(rows) == ["non_private", "hush_hf"]
    uniform = ProtectionPlan.load(out / "plans" / "uniform_dp.json")
    crt_rows = {r["method"]: r for r in results["rows"] if r["gamma"] is not None}
    assert list(crt_rows) == ["non_private_redacted", "crt", "hush_hf_crt"]
    assert {r["gamma"] for r in crt_rows.values()} == {0.5}
    # pi misses 5 of the 10 canaries; dedup leaves one row per canary; pi_c makes every canary row private.
    crt_data = {r["arm"]: r for r in results["crt"]}
    assert crt_data["crt"]["canaries_missed"] == 5 and crt_data["crt"]["dedup_rows_removed"] >= 190
    assert crt_rows["crt"]["noise_multiplier"] == uniform.noise_multiplier  # CRT's DP-SGD noise
    assert crt_rows["non_private_redacted"]["noise_multiplier"] is None
    for row in (crt_rows["crt"], crt_rows["hush_hf_crt"]):
        assert row["certified"] is True
    markdown = (out / "results.md").read_text()
    assert (
        "Max canary exposure (bits) against gamma (CRT Fig. 3)" in markdown and "| gamma = 0.5 |" in markdown
    )
    assert results["data"]["canary_rows"] == 10 * 20
    assert results["data"]["canary_prior"] == pytest.approx(1e-6)
    assert rows["non_private"]["noise_multiplier"] is None and rows["non_private"]["certified"] is False
    assert rows["hush_hf"]["certified"] is True and rows["hush_hf"]["bound_over_target_max"] <= 1.0
    assert uniform.meets_targets and uniform.retained_weight_fraction == 1.0  # every example at rate B/n
    # The LP caps the canaries' copies, so the same targets need less noise than uniform sampling.
    assert 0 < rows["hush_hf"]["noise_multiplier"] < uniform.noise_multiplier
    for row in [*rows.values(), *crt_rows.values()]:
        assert math.isfinite(row["test_perplexity"]) and row["test_perplexity"] > 1
        assert 0 <= row["exposure_mean"] <= row["exposure_max"] <= row["exposure_max_possible"]
        assert len(row["exposure_per_canary"]) == 10
        for attack in ("canary_mia", "example_mia"):
            assert 0.0 <= row[attack]["auc"] <= 1.0
    # The canary values are secrets: none may appear in any output.
    texts = output_texts(out)
    values = [c.value for c in make_canaries(10, 20, seed=0)]
    assert not whole_words_in(values, texts)


# ------------------------------------------------------------------------------ gemma2_pretrain (recipe 3)
def test_gemma2_pretrain_smoke(tmp_path):
    out = tmp_path / "gemma"
    run_recipe(["recipes/gemma2_pretrain.py", "--smoke", "--output_dir", str(out)])
    assert_files(out, ["results.json", "results.md", "fig2_fig3.png", "run.log"])
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert [r["noise_multiplier"] for r in rows] == [0.0, 1e-3, 1e-2, 1e-1]
    for row in rows:
        assert math.isfinite(row["validation_loss"]) and 0 < row["validation_loss"] < math.log(256) + 1
        assert [step for step, _ in row["validation_curve"]] == [3, 6]  # every eval_steps, up to T
        assert 0.0 <= row["extractable_fraction"] <= 1.0 and 0.0 <= row["heldout_extractable_fraction"] <= 1.0
        # 32 sequences, B = 8, T = 6: a sequence is in no batch with probability (1 - 1/4)^6, so even
        # sigma = 0 certifies the posterior only up to 1 minus that (the plan's bound); nothing better.
        assert 1 - 0.75**6 - 1e-6 <= row["posterior_bound_max"] <= 1.0
    assert "| 0.1 |" in (out / "results.md").read_text()


# ------------------------------------------------------------------------------ code_completion (recipe 4)
def test_code_completion_smoke_keeps_module_names_out_of_the_outputs(tmp_path):
    from hush_hf.assets import stdlib_sources

    out = tmp_path / "code"
    run_recipe(["recipes/code_completion.py", "--smoke", "--output_dir", str(out)])
    assert_files(out, ["results.json", "results.md", "module_bounds.png", "run.log", "plans/hush_hf.json"])
    results = json.loads((out / "results.json").read_text())
    assert results["names_revealed"] is False
    assert results["plan"]["meets_targets"] is True
    modules = results["modules"]
    assert len(modules) == results["data"]["secrets"] and all("module" not in row for row in modules)
    sensitive = [row for row in modules if row["sensitive"]]
    assert len(sensitive) == 1 and sensitive[0]["target"] == 1e-3
    assert all(row["target"] == 1e-2 for row in modules if not row["sensitive"])
    assert all(row["bound"] <= row["target"] for row in modules)
    assert set(results["attacks"]) == {"non_private", "hush_hf"}
    # Module names are the secrets. Dotted names are distinctive strings: none may appear at all;
    # plain names may only where the code's own words coincide with them.
    names = set(stdlib_sources(max_files=60)["module"])
    texts = output_texts(out)
    assert not [name for name in names if "." in name and name in texts]
    assert_no_secret_leaks(out, names)


def test_import_graph_counts_definitions_and_imports_not_mentions():
    source = "\n".join(
        [
            '"""Mentions hashlib in a docstring: not an import."""',
            "import os.path, json as j",
            "from . import sibling",
            "from ..pkg import helper",
            "from .sub.mod import name",
            "x = 'import ssl'  # import socket",
        ]
    )
    names, parsed = code_imports.referenced_modules(source, "a.b.c", is_package=False)
    assert parsed
    assert names == {
        "a",
        "a.b",
        "a.b.c",
        "os",
        "os.path",
        "json",
        "a.b.sibling",
        "a.pkg",
        "a.pkg.helper",
        "a.b.sub",
        "a.b.sub.mod",
        "a.b.sub.mod.name",
    }
    package, _ = code_imports.referenced_modules(
        "from . import x\nfrom .. import y", "a.b", is_package=True
    )
    assert package == {"a", "a.b", "a.b.x", "a.y"}


def test_import_graph_falls_back_to_import_lines_when_ast_cannot_parse():
    source = "import zipfile, tarfile as t\nfrom .util import go\nprint 'python 2'\n"
    names, parsed = code_imports.referenced_modules(source, "pkg.mod", is_package=False)
    assert not parsed
    assert {"pkg.mod", "zipfile", "tarfile", "pkg.util", "pkg.util.go"} <= names


def test_module_paths_and_length_matched_alternatives():
    assert code_imports.module_of("email/mime/__init__.py") == ("email.mime", True)
    assert code_imports.module_of("json/decoder.py") == ("json.decoder", False)
    from hush_hf.assets import gpt2_tokenizer
    from hush_hf.secrets import Secret

    tokenizer = gpt2_tokenizer()
    names = ["os", "re", "json", "asyncio.base_events", "email.mime.multipart", "ssl"]
    secrets = [Secret(name=n, prior=1e-4, target_posterior=1e-2, terms=(n,)) for n in names]
    chosen = ex.length_matched_alternatives(secrets, tokenizer, 2, seed=0)
    length = {n: len(tokenizer(" " + n)["input_ids"]) for n in names}
    for j, name in enumerate(names):
        assert name not in chosen[j] and len(chosen[j]) == 2
        nearest = sorted(abs(length[o] - length[name]) for o in names if o != name)[:2]
        assert sorted(abs(length[o] - length[name]) for o in chosen[j]) == nearest


def test_code_completion_refuses_bad_arguments_without_echoing_module_names(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=r"sensitive_modules\[1\] is not a dotted module name") as caught:
        code_completion.main(
            ["--smoke", "--output_dir", str(out), "--sensitive_modules", "base64", "top secret"]
        )
    assert "top secret" not in str(caught.value)
    with pytest.raises(ValueError, match=r"sensitive_target=5e-05 must exceed prior=0\.0001"):
        code_completion.main(["--smoke", "--output_dir", str(out), "--sensitive_target", "5e-5"])
    assert not out.exists()
    args, _ = code_completion.EXPERIMENT.parse(["--reveal-secret-names"])
    assert args.reveal_secret_names is True


def test_secret_rows_name_modules_only_when_asked():
    from hush_hf.planning.plan import plan_protection

    plan = plan_protection(
        [[0], [1], [0, 1]],
        np.full(2, 1e-4),
        np.full(2, 1e-2),
        expected_batch_size=0.3,
        steps=2,
        noise_multiplier=5.0,
        accountant="kl",
    )
    attacks = {"hush_hf": {"per_secret": {1: {"rank": 1.0, "probability": 0.5, "candidates": 3}}}}
    hidden = ex.secret_rows(plan, {1}, attacks, name_key="module")
    assert [set(row) >= {"secret", "bound", "target"} and "module" not in row for row in hidden] == [
        True,
        True,
    ]
    assert hidden[1]["rank_hush_hf"] == 1.0 and hidden[0]["rank_hush_hf"] is None and hidden[1]["sensitive"]
    shown = ex.secret_rows(
        plan, {1}, attacks, names=["alpha", "beta"], fingerprints=["f0", "f1"], name_key="module"
    )
    assert [(r["module"], r["fingerprint"]) for r in shown] == [("alpha", "f0"), ("beta", "f1")]


# ------------------------------------------------------------------------------ sft_jsonl (a user's own file)
def test_sft_jsonl_trains_a_users_file_and_publishes_a_model_that_verifies(tmp_path, capsys):
    from hush_hf.cli import main as hush
    from hush_hf.planning import ProtectionPlan

    sft_jsonl = recipe_module("sft_jsonl")
    texts = [f"note {i}: the budget review moved" + (" to project falcon" * (i % 4 == 0)) for i in range(32)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    secrets = "id,prior,target,terms\nproject-falcon,1e-6,1e-3,falcon;project falcon\n"
    (tmp_path / "secrets.csv").write_text(secrets)
    out = tmp_path / "out"
    argv = ["--dataset_file", str(tmp_path / "data.jsonl"), "--secrets_file", str(tmp_path / "secrets.csv"),
            "--output_dir", str(out), "--max_steps", "2", "--expected_batch_size", "4",
            "--per_device_train_batch_size", "4", "--report_to", "none"]  # fmt: skip
    trainer = sft_jsonl.main(argv)
    assert trainer.state.global_step == 2
    plan = ProtectionPlan.load(out / "hush_plan.json")
    assert plan.secrets.num_examples.tolist() == [8]  # the rows holding the secret, found by the marks
    assert plan.meets_targets and plan.noise_multiplier > 0
    assert "Secret protection" in (out / "README.md").read_text()
    assert hush(["verify", "--as-pushed", str(out)]) == 0  # save_model's files re-check alone
    assert not whole_words_in(["falcon"], output_texts(out))
    with pytest.raises(SystemExit):  # the secrets file is required, and the error says which flag
        sft_jsonl.main(argv[:2] + argv[4:])
    assert "--secrets_file is required" in capsys.readouterr().err


def test_recipes_state_experiments_over_the_public_api_only():
    """Each recipe is at most 250 lines and imports from hush_hf only the names a package exports
    (``__all__`` of ``hush_hf`` or a subpackage, or a subpackage itself): no module internals."""
    import ast
    import importlib

    for path in sorted(RECIPES.glob("*.py")):
        source = path.read_text()
        assert len(source.splitlines()) <= 250, path.name
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                assert not [a.name for a in node.names if a.name.startswith("hush_hf.")], path.name
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hush_hf":
                package = importlib.import_module(node.module)
                assert hasattr(package, "__path__"), f"{path.name} imports the module {node.module}"
                for alias in node.names:
                    exported = getattr(package, alias.name)
                    public = alias.name in package.__all__ or hasattr(exported, "__path__")  # a subpackage
                    assert public, f"{path.name} imports {node.module}.{alias.name}"
