"""Check a published certificate: recompute every secret's bound, and every published number with it.

`hush verify MODEL_DIR` reads MODEL_DIR/hush_plan.json and recomputes each secret's bound from the
plan's sampling probabilities and recorded memberships, at the noise multiplier and the number of DP
steps of the plan's training record (what the weights went through; never the plan's intention),
with the plan's accountant. It checks that the plan's numbers agree among themselves (rho_i = B w_i /
sum(w), the per-secret columns, a calibrated sigma meeting every target at its T and being the
smallest that does), that the weight files in MODEL_DIR are exactly those whose SHA-256 the record
lists and that no other weight-like file lies at any depth (``hush_hf.planning.weight_files``), and
that the model card's `hush_hf` metadata and whole Secret protection section and privacy_report.json/.md
state exactly what the recomputation gives (``hush_hf.audit.published``; an absent card or report is
reported, not counted as a pass or a failure), and that MODEL_DIR holds no file of un-noised
statistics of the drawn batches (trainer_state.json, ``*_results.json``, runs/, checkpoints).
With `--secrets`, no published text file (config, tokenizer configuration, card, ...) may spell one of
its secrets.
`--as-pushed` counts only the files `push_to_hub` uploads from MODEL_DIR (for a local output_dir).
`--plan PLAN` checks a plan file (with MODEL_DIR, instead of MODEL_DIR/hush_plan.json); a plan no run
published (no training record) certifies no model. `--secrets FILE` compares the number of secrets and
each secret's prior and target with the plan. `--dataset DATA` recomputes the memberships (its text
column tagged with --secrets, else its `secret_ids` column), compares them with the plan's exactly, and
checks the LP constraints (Hush eq. 1) at the secrets file's priors and targets; a local plan file (with
its keyed row digests) also checks that DATA holds exactly the rows it was made from.
A training record whose DP seed was set by the user (`dp_seed`) or does not say where it came from (a
record written before `dp_seed_source` existed) gets a WARNING line: the bounds then hold only against an
attacker who does not know that seed, and hush_hf cannot tell how secret a chosen seed is. It does not
change the exit status (a chosen seed kept secret is as good as a drawn one, and no file can prove either
way that a seed stayed secret); `--require-drawn-seed` makes it a failure, for a gate that accepts only
seeds hush_hf drew.
Exit status 0 when every target holds and every check passes, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

HELP = "recompute every secret's bound from a published plan; check the weights, card and report (exit 0/1)"
PLAN_FILE = "hush_plan.json"
REPORT_FILE = "privacy_report.json"
CARD_FILE = "README.md"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", nargs="?", default=None,
                        help=f"a saved model folder: weights, {PLAN_FILE}, {CARD_FILE}, {REPORT_FILE}")
    parser.add_argument("--plan", default=None, help=f"a plan file (default: MODEL_DIR/{PLAN_FILE})")
    parser.add_argument("--dataset", default=None,
                        help="the training data, in plan order: recompute which examples hold which secret")
    parser.add_argument("--split", default="train")
    parser.add_argument("--secrets", default=None,
                        help="secrets file: compare priors and targets (and tag --dataset's text with it)")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--show", type=int, default=20, help="secrets listed (closest to their target first)")
    parser.add_argument("--require-drawn-seed", action="store_true",
                        help="fail (exit 1) unless the training record says hush_hf drew the DP seed (not "
                             "set by the user with dp_seed, nor of unknown source)")
    parser.add_argument("--as-pushed", action="store_true",
                        help="check only the files push_to_hub() uploads from MODEL_DIR (a local output_dir: "
                             "its checkpoints, logs and training_args.bin are never uploaded); without it "
                             "every weight-like file at any depth must be certified")


def check_arguments(args: argparse.Namespace) -> Path:
    """The plan path; ValueError naming the argument, before any data is read."""
    if args.model_dir is None and args.plan is None:
        raise ValueError("give MODEL_DIR or --plan")
    if args.model_dir is not None and not Path(args.model_dir).is_dir():
        raise ValueError(f"MODEL_DIR {args.model_dir!r} is not a folder")
    from hush_hf.cli.paths import check_input_file

    plan = Path(args.plan) if args.plan is not None else Path(args.model_dir) / PLAN_FILE
    check_input_file("plan", str(plan))
    check_input_file("--secrets", args.secrets)
    if args.as_pushed and args.model_dir is None:
        raise ValueError("--as-pushed needs MODEL_DIR")
    if args.show < 0:
        raise ValueError(f"--show must be >= 0, got {args.show}")
    return plan


def dataset_memberships(args: argparse.Namespace, plan: Any, secret_set: Any) -> tuple[list, Any, dict, str]:
    """(checks, the (secrets x examples) matrix recomputed from --dataset or None, its plan columns, where
    the memberships came from)."""
    from hush_hf.data import load_text_dataset
    from hush_hf.planning.consistency import Check
    from hush_hf.planning.memberships import membership_matrix
    from hush_hf.planning.plan import SAMPLING_PROB_COLUMN, WEIGHT_COLUMN
    from hush_hf.secrets.tagging import dataset_fingerprint
    from hush_hf.trainer.plan_setup import SECRET_IDS_COLUMN, column

    dataset = load_text_dataset(args.dataset, split=args.split)
    names = dataset.column_names
    if len(dataset) != plan.num_examples:
        rows = Check("dataset", False, f"{len(dataset)} rows, the plan covers {plan.num_examples} examples")
        return [rows], None, {}, ""
    checks = []
    if plan.rows is not None:  # a local plan file: its keyed row digests (published copies omit them)
        try:
            plan.check_rows(dataset, what="--dataset")
            checks.append(Check("rows", True, "every row is the one the plan was made from (row digests)"))
        except ValueError as error:
            checks.append(Check("rows", False, str(error)))
    if secret_set is not None and len(secret_set) != plan.num_secrets:
        return [Check("dataset", None, "not compared: --secrets and the plan have different numbers of "
                                       "secrets")], None, {}, ""
    if secret_set is not None and args.text_column in names:
        from hush_hf.secrets import tagger_for
        from hush_hf.secrets.tagging import tag_columns, text_sources

        sources = text_sources(dataset, args.text_column)  # the columns the trainer tags (untokenized: all)
        dataset = tag_columns(dataset, tagger_for(secret_set), sources, num_secrets=len(secret_set),
                              overwrite=True)  # a tagged folder: tag it again
        named = ", ".join(map(repr, sources))
        source = f"its column{'s' if len(sources) > 1 else ''} {named} tagged with --secrets"
    elif SECRET_IDS_COLUMN in names:
        from hush_hf.secrets.tagging import check_secret_ids_current

        try:
            unchecked = check_secret_ids_current(dataset, text_column=args.text_column, what="--dataset")
            if unchecked:
                print(f"warning: {unchecked}")
        except ValueError as error:
            checks.append(Check("dataset", False, str(error)))
        found = dataset_fingerprint(dataset)
        if secret_set is not None and found is not None:
            same = found == secret_set.fingerprint
            checks.append(Check("dataset", same, f"its '{SECRET_IDS_COLUMN}' were tagged with "
                                                 + ("this secret set" if same else "another secret set than "
                                                    "--secrets (fingerprints differ)")))
        source = f"its '{SECRET_IDS_COLUMN}' column"
    elif secret_set is not None:
        raise ValueError(f"--dataset has no text column {args.text_column!r} and no '{SECRET_IDS_COLUMN}' "
                         f"column (columns: {names})")
    else:
        raise ValueError(f"--dataset has no '{SECRET_IDS_COLUMN}' column: give --secrets to tag its text")
    membership = membership_matrix(column(dataset, SECRET_IDS_COLUMN), plan.num_secrets)
    columns = {c: column(dataset, c) for c in (WEIGHT_COLUMN, SAMPLING_PROB_COLUMN) if c in names}
    return checks, membership, columns, f"--dataset ({source})"


def published_files_checks(model_dir: Path, among: list[str] | None, secret_set: Any) -> list:
    """What else the folder publishes: no file of un-noised statistics of the drawn batches
    (trainer_state.json's per-step losses, ``*_results.json``, ``runs/``, checkpoints: what a DP push
    never uploads, ``hush_hf.trainer.publishing.NEVER_BY_PATTERN``; not looked for in ``among``, the
    files a push uploads), and, with ``secret_set``, no text file that spells one of its secrets
    (``hush_hf.trainer.published_text``)."""
    import fnmatch

    from hush_hf.planning.consistency import Check
    from hush_hf.trainer.published_text import first_spelled
    from hush_hf.trainer.publishing import NEVER_BY_PATTERN

    # What a push never uploads, but training_args.bin: every save_model writes it beside the weights.
    statistics = [g for g in NEVER_BY_PATTERN if g != "training_args.bin"]
    files = among if among is not None else sorted(
        p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file()
    )
    checks = []
    if among is None:
        found = [name for name in files
                 if any(fnmatch.fnmatch(part, g) for part in name.split("/") for g in statistics)]
        checks.append(Check(
            "published files", not found,
            f"{len(found)} file(s) of un-noised statistics of the drawn batches lie beside the weights (e.g. "
            f"{found[0]!r}); a local output_dir: check it with --as-pushed" if found
            else "no trainer_state.json, *_results.json, runs/ or checkpoint beside the weights",
        ))
    if secret_set is not None:
        spelled = first_spelled(model_dir, files, secret_set)
        checks.append(Check(
            "published text", spelled is None,
            f"{spelled[0]} spells secret {spelled[1]} of --secrets" if spelled is not None
            else "no published text file spells a secret of --secrets",
        ))
    return checks


def model_dir_checks(model_dir: Path, plan: Any, plan_digest: str, verification: Any, *,
                     as_pushed: bool = False, secret_set: Any = None) -> list:
    """The weights against the record's digests; the card and privacy report against the recomputation;
    the other published files (:func:`published_files_checks`). ``as_pushed``: only the files
    ``push_to_hub`` uploads from ``model_dir`` count."""
    from hush_hf.audit.certificate import certificate_block, recomputed_report
    from hush_hf.audit.published import check_card, check_report
    from hush_hf.planning.consistency import Check
    from hush_hf.planning.record import compare_weights

    record = plan.training
    if record is None:
        detail = (f"the plan records no training run, so it certifies none of the weights in "
                  f"{str(model_dir)!r} (a plan from `hush plan`, or the record was removed)")
        return [Check("training record", False, detail)]
    among = None
    if as_pushed:
        from hush_hf.trainer.publishing import publishable_files

        among = publishable_files(model_dir)
    problems = compare_weights(record.weights, model_dir, among=among)
    if not record.weights and not problems:
        problems = ["the training record lists no weight files, and there are none here"]
    checks = [Check("weights", not problems, "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)"
                                                                       if len(problems) > 3 else "")
                    if problems else f"{len(record.weights)} file(s) match the SHA-256 digests in the plan")]
    block = certificate_block(plan, plan_digest, verification)
    recomputed = recomputed_report(plan, verification, block)
    report_check, stated = check_report(model_dir / REPORT_FILE, recomputed, plan)
    checks.append(check_card(model_dir / CARD_FILE, block, stated))
    checks.append(report_check)
    return checks + published_files_checks(model_dir, among, secret_set)


def run(args: argparse.Namespace) -> int:
    from hush_hf.jsonfile import read_json
    from hush_hf.planning import consistency
    from hush_hf.planning.consistency import Check
    from hush_hf.planning.plan import ProtectionPlan
    from hush_hf.planning.verification import certified_bounds

    plan_path = check_arguments(args)
    data = read_json(plan_path, what="plan file")
    plan = ProtectionPlan.from_json(data, source=f"plan file {str(plan_path)!r}")
    secret_set = None
    if args.secrets is not None:
        from hush_hf.secrets import SecretSet

        secret_set = SecretSet.load(args.secrets)
    checks: list[Check] = [consistency.check_sampling(plan)]
    membership, source = None, "the plan"
    if args.dataset is not None:
        found, membership, columns, source = dataset_memberships(args, plan, secret_set)
        checks += found
        if membership is not None:
            checks.append(consistency.check_memberships(plan, membership))
            checks += consistency.check_plan_columns(plan, columns)
    if membership is None and plan.memberships is None:
        print(f"plan: {plan_path}")
        print("FAILED: the plan records no memberships (which examples contain which secret), so no bound "
              "can be recomputed; give the training data with --dataset")
        return 1
    used = membership if membership is not None else plan.memberships
    verification = certified_bounds(plan, membership=membership)
    checks.append(consistency.check_stated_numbers(plan, verification, used, data.get("summary")))
    checks.append(consistency.check_calibration(plan, used))
    priors, targets = plan.secrets.prior, plan.secrets.target
    if secret_set is not None:
        checks += consistency.check_secret_set(plan, secret_set.priors, secret_set.targets,
                                               secret_set.fingerprint)
        if len(secret_set) == plan.num_secrets:
            priors, targets = secret_set.priors, secret_set.targets
    checks.append(consistency.check_lp_constraints(plan, priors, targets, used))
    if args.model_dir is not None:
        checks += model_dir_checks(Path(args.model_dir), plan, data["digest"], verification,
                                   as_pushed=args.as_pushed, secret_set=secret_set)
    elif plan.training is not None:
        checks.append(Check("weights", None, "not compared with the record's digests: give MODEL_DIR"))
    seed = seed_source_check(plan, args.require_drawn_seed)
    if seed is not None:
        checks.append(seed)

    print_result(plan_path, plan, verification, source, checks, args.show)
    warning = seed_warning_line(plan)
    if warning is not None:
        print(warning)
    failed = [c for c in checks if c.passed is False]
    if verification.meets_targets and not failed:
        unchecked = sum(c.passed is None for c in checks)
        print(f"OK: all {plan.num_secrets} targets hold at what was trained, and every check passed"
              + (f" ({unchecked} could not be made, see above)" if unchecked else "")
              + ("; the bounds hold only against an attacker who does not know the DP seed (WARNING above)"
                 if warning is not None else ""))
        return 0
    reasons = []
    if not verification.meets_targets:
        reasons.append(f"{verification.over_target.size} of {plan.num_secrets} secrets exceed their targets "
                       f"({verification.worst()})")
    if failed:
        reasons.append("failed: " + ", ".join(c.name for c in failed))
    print("FAILED: " + "; ".join(reasons))
    return 1


def seed_warning_line(plan: Any) -> str | None:
    """The WARNING line for a training record whose DP seed hush_hf did not draw (user-set or unknown)."""
    record = plan.training
    if record is None or record.dp_seed_source == "drawn":
        return None
    origin = ("was set by the user (dp_seed), not drawn by hush_hf" if record.dp_seed_source == "user" else
              "is of unknown origin (the training record does not say; it may have been set by the user)")
    return (f"WARNING: the DP seed {origin}: every bound holds only against an attacker who does not know "
            "that seed; anyone who knows or guesses it can reproduce the batches and subtract the noise")


def seed_source_check(plan: Any, require_drawn: bool) -> Any:
    """With ``--require-drawn-seed``: a check that the record says hush_hf drew the seed (None otherwise)."""
    from hush_hf.planning.consistency import Check

    if not require_drawn or plan.training is None:
        return None
    source = plan.training.stated_seed_source
    return Check("DP seed", source == "drawn", f"the training record says the seed was {source!r}"
                 + ("" if source == "drawn" else " (--require-drawn-seed accepts only 'drawn')"))


def print_result(plan_path: Path, plan: Any, verification: Any, source: str, checks: list, show: int) -> None:
    from hush_hf.audit.report import SEED_WORDS

    record = plan.training
    print(f"plan: {plan_path} ({plan.num_secrets} secrets, {plan.num_examples} examples; memberships from "
          f"{source})")
    if record is None:
        print(f"no training record: this plan certifies no model; bounds at its own noise multiplier "
              f"{plan.noise_multiplier:.6g} and T={plan.steps}, accountant {plan.accountant}")
    else:
        public = f" (+ {record.public_steps} CRT public steps)" if record.public_steps else ""
        print(f"trained (the plan's training record): noise multiplier {record.noise_multiplier:.6g} "
              f"(planned {plan.noise_multiplier:.6g}), {record.dp_steps} DP steps{public} of T={plan.steps}, "
              f"C={record.clip_norm:g}, B={plan.expected_batch_size:g}, accountant {plan.accountant}, "
              f"DP seed {SEED_WORDS[record.stated_seed_source]}")
    if show:
        print(verification.table(limit=show))
    width = max(len(c.status) for c in checks)
    for check in checks:
        print(f"{check.status:<{width}}  {check.name}: {check.detail}")
