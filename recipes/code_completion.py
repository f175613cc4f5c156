"""A company's codebase: protect which modules its files use while training a code-completion model.

    accelerate launch recipes/code_completion.py            # offline default, <= 10 min on 2 CPU cores
    accelerate launch recipes/code_completion.py --smoke    # < 60 s (CI)
    accelerate launch recipes/code_completion.py --reveal-secret-names   # module names in the outputs

The CPython standard library stands in for a company's code. The secrets are modules: a file contains
module M if it defines or imports M (``code_imports.py``); an attacker who learns that the codebase uses
M learns the secret. Every module imported by 1 to ``--max_importers`` files is a secret (prior
``--prior``, target ``--target``); the ``--sensitive_modules`` get the stricter ``--sensitive_target``.
Files are cut into sequences of ``--block_size`` tokens (the first ``--chunks_per_file``), each counted as
containing every module of its file (more protection, never less).

Two small GPT-2s are trained for the same T and B: ``non_private`` (plain ``Trainer``) and ``hush_hf`` (LP
weights, tight accountant, calibrated noise). The report gives every module's certified posterior bound
and an extraction attack per model (Hush Def. 3.1 made concrete): the attacker sees the code around an
import with the name cut out and ranks the true name against ``--num_alternatives`` module names of the
same token length. Module names are the secrets: outputs name modules by index (and keyed fingerprint
with ``--fingerprint_key_file``), never by name unless ``--reveal-secret-names``; no file path is written.

Presets: ``offline``: the first 2 sequences of 48 tokens of the ~730 non-test stdlib files, a 2-layer
GPT-2 of width 64, B = 32, T = 50, 20 ordinary modules attacked with 10 alternatives each. ``smoke``: 60
files, T = 3. ``paper``: for a GPU (``--model_name_or_path``, ``--dataset_name`` with ``path`` and
``text`` columns), 20 alternatives per attacked module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from code_imports import import_graph
from tqdm.auto import tqdm

from hush_hf import experiments as ex

RECIPE = "code_completion"
METHODS = ("non_private", "hush_hf")
DEFAULT_SENSITIVE = ["hashlib", "hmac", "secrets", "ssl", "getpass", "base64"]

COMMON = {"learning_rate": 3e-3}
PRESETS: dict[str, dict[str, Any]] = {
    "offline": {
        **COMMON, "max_steps": 50, "expected_batch_size": 32.0, "per_device_train_batch_size": 32,
        "logging_steps": 10, "block_size": 48, "chunks_per_file": 2, "num_probed_modules": 20,
        "num_alternatives": 10,
    },
    "smoke": {
        **COMMON, "max_steps": 3, "expected_batch_size": 8.0, "per_device_train_batch_size": 8,
        "logging_steps": 1, "block_size": 32, "chunks_per_file": 1, "max_files": 60, "num_probed_modules": 4,
        "num_alternatives": 5, "model_width": 32, "sensitive_modules": ["base64"],
    },
    "paper": {
        **COMMON, "max_steps": 1000, "expected_batch_size": 256.0, "per_device_train_batch_size": 32,
        "learning_rate": 5e-4, "logging_steps": 50, "block_size": 256, "chunks_per_file": 16,
        "num_probed_modules": 200, "num_alternatives": 20, "model_layers": 6, "model_width": 512,
    },
}


@dataclass
class CodeCompletionArguments(ex.ExperimentArguments):
    """Arguments of the recipe (training arguments are those of SecretProtectionConfig)."""

    dataset_name: str | None = field(default=None, metadata={"help": "Your code: 'path', 'text' columns."})
    max_files: int | None = field(default=None, metadata={"help": "Keep the first N files."})
    model_name_or_path: str | None = field(default=None, metadata={"help": "A causal LM; default: GPT-2."})
    model_layers: int = field(default=2, metadata={"help": "Layers of the GPT-2 built from its config."})
    model_width: int = field(default=64, metadata={"help": "Width of the GPT-2 built from its config."})
    block_size: int | None = field(default=None, metadata={"help": "Tokens per training sequence."})
    chunks_per_file: int | None = field(default=None, metadata={"help": "Sequences taken from each file."})
    max_importers: int = field(default=30, metadata={"help": "Modules imported by more files: no secret."})
    prior: float = field(default=1e-4, metadata={"help": "p_j of every module secret."})
    target: float = field(default=1e-2, metadata={"help": "r_j of an ordinary module."})
    sensitive_target: float = field(default=1e-3, metadata={"help": "r_j of a sensitive module (stricter)."})
    sensitive_modules: list[str] = field(default_factory=lambda: list(DEFAULT_SENSITIVE),
                                         metadata={"help": "Modules with the stricter target."})
    methods: list[str] = field(default_factory=lambda: list(METHODS), metadata={"help": "Models to train."})
    num_probed_modules: int | None = field(default=None, metadata={"help": "Ordinary modules attacked."})
    num_alternatives: int | None = field(default=None, metadata={"help": "Names ranked with each"})
    reveal_secret_names: bool = field(default=False, metadata={"help": "Write module names in the outputs"})
    fingerprint_key_file: str | None = field(
        default=None, metadata={"help": "Key (>= 16 bytes; created if missing) for keyed fingerprints."})
    attack_seed: int = field(default=0, metadata={"help": "Seed of the probed modules and alternatives."})
    eval_batch_size: int = field(default=32, metadata={"help": "Batch size of the attack."})


def validate(args: CodeCompletionArguments, config: Any) -> None:
    """ValueError naming the field and value for every bad choice, before any work (names by position)."""
    ex.refuse_owned_fields(config, {"noise_multiplier": "hush_hf trains with its calibrated noise",
                                    "secrets_file": "the modules are the secrets",
                                    "plan_file": "the plan is computed from the import graph"})
    for name in ("model_layers", "model_width", "max_importers", "num_alternatives", "eval_batch_size"):
        ex.check_int(name, getattr(args, name), minimum=1)
    ex.check_int("block_size", args.block_size, minimum=8)
    ex.check_int("chunks_per_file", args.chunks_per_file, minimum=1)
    ex.check_int("max_files", args.max_files, minimum=2, allow_none=True)
    ex.check_int("num_probed_modules", args.num_probed_modules, minimum=0)
    ex.check_int("attack_seed", args.attack_seed, minimum=0)
    ex.check_number("prior", args.prior, low=0.0, high=0.5)
    for name in ("target", "sensitive_target"):
        value = getattr(args, name)
        ex.check_number(name, value, low=0.0, high=1.0 - 1e-12)
        if value <= args.prior:
            raise ValueError(f"{name}={value!r} must exceed prior={args.prior!r}")
    for k, module in enumerate(args.sensitive_modules):
        if not all(part.isidentifier() for part in module.split(".")):
            raise ValueError(f"sensitive_modules[{k}] is not a dotted module name")  # the name is not echoed
    ex.check_names("methods", args.methods, METHODS)
    ex.check_whole_batch_size(config)


def load_code(args: CodeCompletionArguments) -> tuple[Any, str]:
    """Files with ``path`` and ``text`` columns (the first ``--max_files``)."""
    from hush_hf.assets import stdlib_sources

    files, source = ex.load_corpus(args.dataset_name, args.dataset_split, ["path", "text"],
                                   offline=lambda: stdlib_sources(max_files=args.max_files),
                                   offline_source="CPython standard library (this interpreter)")
    if args.dataset_name is not None and args.max_files is not None:
        files = files.select(range(min(args.max_files, len(files))))
    return files.select_columns(["path", "text"]), source


def module_secrets(args: CodeCompletionArguments, files: Any) -> tuple[Any, list[list[int]], dict[str, Any]]:
    """(SecretSet, secret ids per file, statistics): the modules that are secrets and who contains them."""
    from hush_hf.secrets import Secret, SecretSet

    modules, contains, unparsed = import_graph(files["path"], tqdm(files["text"], desc="Import graph"))
    importers: dict[str, int] = {}
    for name, names in zip(modules, contains, strict=True):
        for other in set(names) - {name}:
            importers[other] = importers.get(other, 0) + 1
    sensitive = set(args.sensitive_modules)
    for k, name in enumerate(args.sensitive_modules):
        if name not in modules:
            raise ValueError(f"sensitive_modules[{k}] is not a module of the corpus")
    chosen = sorted(m for m in {*modules} if m in sensitive or 0 < importers.get(m, 0) <= args.max_importers)
    index = {m: j for j, m in enumerate(chosen)}
    secrets = SecretSet(Secret(name=m, prior=args.prior, terms=(m,),
                               target_posterior=args.sensitive_target if m in sensitive else args.target)
                        for m in chosen)
    stats = {"files": len(modules), "files_parsed_by_regex": unparsed, "modules": len(set(modules)),
             "modules_imported_somewhere": len(importers), "secrets": len(chosen),
             "sensitive_secrets": sorted(index[m] for m in sensitive)}
    return secrets, [sorted(index[m] for m in names if m in index) for names in contains], stats


def page(results: dict[str, Any]) -> str:
    data, plan = results["data"], results["plan"]
    header = ["model", "modules", "evaluated", "ranked first", "mean posterior", "candidate prior",
              "mean certified bound at that prior"]
    keys = ("num_evaluated", "num_ranked_first", "mean_probability", "mean_candidate_prior",
            "mean_bound_at_candidate_prior")
    attacks = ex.markdown_table(header, [[method, group, *(found[group][k] for k in keys)]
                                      for method, found in results["attacks"].items()
                                      for group in ("sensitive", "ordinary")])
    rows = [r for r in results["modules"] if r["sensitive"]]
    columns = [k for k in ("secret", "fingerprint", "module") if rows and k in rows[0]]
    columns += ["examples", "target", "bound"] + [f"rank_{m}" for m in results["attacks"]]
    sensitive = ex.markdown_table(columns, [[r.get(k) for k in columns] for r in rows])
    return ex.results_page("Code completion on the standard library: modules as secrets", [
        f"Data: {data['source']}: {data['files']} files -> {data['train_examples']} sequences; "
        f"{data['secrets']} module secrets ({len(data['sensitive_secrets'])} sensitive), examples per secret "
        f"{data['examples_per_secret']}.",
        f"Plan (hush_hf): sigma = {plan['noise_multiplier']:.4g}, retained weight "
        f"{plan['retained_weight_fraction']:.3f}, every bound <= its target: {plan['meets_targets']}.",
    ], [("Extraction attack (rank of the true module name among alternatives)", attacks),
        ("Sensitive modules", f"{sensitive}\n\n![bounds](module_bounds.png)")], results=results)


def run(args: CodeCompletionArguments, config: Any, session: ex.Session) -> dict[str, Any]:
    from transformers import DataCollatorForLanguageModeling

    from hush_hf.audit import probes_for_secrets

    output_dir, main_process, watch = session.output_dir, session.main_process, session.watch
    with watch("import graph"):
        files, source = load_code(args)
        secrets, file_secret_ids, stats = module_secrets(args, files)
        sensitive = set(stats["sensitive_secrets"])
    with watch("tokenizing"):
        tokenizer = ex.causal_tokenizer(args.model_name_or_path)
        train = ex.chunk_texts(files["text"], file_secret_ids, tokenizer, block_size=args.block_size,
                               chunks_per_text=args.chunks_per_file)
        texts, secret_ids = train["text"], train["secret_ids"]
        train = train.remove_columns("text")
    with watch("planning"):
        plan = session.on_main_process(
            lambda: ex.plan_for_config(secret_ids, secrets, config, lp_c=config.lp_c, progress=True))
        if main_process:
            plan.save(output_dir / "plans" / "hush_hf.json")
        logger.info("Plan: sigma %.4g, retained weight %.3f, all targets met: %s", plan.noise_multiplier,
                    plan.retained_weight_fraction, plan.meets_targets)
    with watch("probes"):
        probed = ex.probed_secrets(sensitive, len(secrets), args.num_probed_modules, seed=args.attack_seed)
        alternatives = ex.length_matched_alternatives(secrets, tokenizer, args.num_alternatives,
                                                      args.attack_seed)
        probes, skipped = probes_for_secrets(  # window: characters each side, ~one block of tokens in all
            secrets, texts, secret_ids, indices=probed, alternatives=alternatives, seed=args.attack_seed,
            window=args.block_size)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    attacks, runs = {}, {}
    for method in tqdm(list(args.methods), desc="Models"):
        with watch(f"training {method}"):
            model = ex.causal_model(args.model_name_or_path, len(tokenizer), seed=config.seed, n_head=2,
                                    n_layer=args.model_layers, n_embd=args.model_width,
                                    n_positions=4 * args.block_size)  # attack contexts may exceed one block
            private = method != "non_private"
            _, runs[method] = ex.train_model(model, config, plan if private else None, train=train,
                                             collator=collator, run_dir=output_dir / "runs" / method)
        with watch(f"attack {method}"):
            attacks[method] = ex.reconstruction_attack_summary(model, tokenizer, probes, plan, sensitive,
                                                               args.eval_batch_size)
        logger.info("%s: %d of %d sensitive modules ranked first", method,
                    *(attacks[method]["sensitive"][k] for k in ("num_ranked_first", "num_evaluated")))
    names = [s.name for s in secrets] if args.reveal_secret_names else None
    prints = ex.keyed_fingerprints(secrets, args.fingerprint_key_file)
    modules = ex.secret_rows(plan, sensitive, attacks, names=names, fingerprints=prints, name_key="module")
    notes = [
        "Modules are named by index" + (" and keyed fingerprint" if prints else "") + (
            " AND BY NAME (--reveal-secret-names): these outputs contain the secrets." if names
            else "; the names are the secrets and are not written (--reveal-secret-names includes them)."),
        "A sequence counts as containing every module its file defines or imports (errs towards protection).",
        f"Probed modules that could not be attacked: {len(skipped)} (no import context found in the training "
        "sequences)." if skipped else "Every probed module was attacked.",
        "non_private trains with plain transformers.Trainer; it has no guarantee.",
    ]
    results = {
        "recipe": RECIPE, "names_revealed": bool(names),
        "choices": {**ex.run_choices(args, config, leave_out=() if names else ("sensitive_modules",)),
                    "num_sensitive_modules": len(args.sensitive_modules)},
        "data": {"source": source, **stats, "train_examples": len(train),
                 "examples_per_secret": ex.describe_counts(plan.secrets.num_examples)},
        "plan": plan.summary(), "runs": runs, "modules": modules, "notes": notes,
        "attacks": {m: {k: v for k, v in a.items() if k != "per_secret"} for m, a in attacks.items()},
        "files": ["results.json", "results.md", "module_bounds.png", "plans/", "run.log"],
    }
    if main_process:
        ex.bounds_figure(modules, output_dir / "module_bounds.png", what="module")
    return session.finish(results, page)


EXPERIMENT = ex.Experiment(RECIPE, CodeCompletionArguments, PRESETS, validate=validate, run=run)
main, logger = EXPERIMENT.main, EXPERIMENT.logger

if __name__ == "__main__":
    main()
