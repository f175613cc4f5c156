"""Turn a dataset and per-secret targets into a protection plan (LP weights, sampling, noise).

Secrets come from a file (JSON/CSV with id, prior, target and optional terms/pattern; examples are
tagged by those terms, or by the id as a word) or from the paper's document-frequency selection.
A dataset that already has a ``secret_ids`` column (checked against the text it was tagged from) or
secret marks (a tokenized dataset saved with ``save_to_disk``, made with ``hush_hf.mark_secrets``) is
used as tagged. The plan is bound to the dataset's rows as given: train exactly those rows, in that
order (plan the tokenized dataset to train tokens). Secret strings are never printed.
"""

from __future__ import annotations

import argparse
import json
import logging

import numpy as np

HELP = "compute a protection plan (and optionally sweep the LP constant c)"
SELECTION_DEFAULTS = {"prior": 1e-10, "target_range": (2e-4, 1e-3), "seed": 0}
logger = logging.getLogger("hush.plan")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hush_hf.accounting.accountants import ACCOUNTANTS, DEFAULT_ACCOUNTANT
    from hush_hf.accounting.budgets import LP_BUDGET_KINDS

    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset",
        required=True,
        help="local json/jsonl/parquet/csv/txt file, saved dataset dir, or Hub name",
    )
    data.add_argument("--split", default="train")
    data.add_argument("--text-column", default="text")
    data.add_argument("--num-proc", type=int, default=None, help="processes for tagging")
    secrets = parser.add_argument_group("secrets (a file, or the document-frequency selection)")
    source = secrets.add_mutually_exclusive_group(required=True)
    source.add_argument("--secrets", help="JSON/JSONL/CSV secrets file")
    source.add_argument(
        "--df-ranks",
        type=int,
        nargs=2,
        metavar=("LO", "HI"),
        help="words ranked [LO, HI) by document frequency become secrets (the paper: 50000 150000)",
    )
    source.add_argument(
        "--df-range", type=int, nargs=2, metavar=("LO", "HI"), help="words in LO..HI documents become secrets"
    )
    # Defaults None (SELECTION_DEFAULTS apply): with --secrets, whose file states each prior and target,
    # giving them is an error rather than silently ignored.
    secrets.add_argument("--prior", type=float, default=None, help="p for the selected words (1e-10)")
    secrets.add_argument(
        "--target-range",
        type=float,
        nargs=2,
        default=None,
        metavar=("LO", "HI"),
        help="r drawn uniformly from [LO, HI] for the selected words (0.0002 0.001)",
    )
    secrets.add_argument("--seed", type=int, default=None, help="seed of the selected words' targets (0)")
    secrets.add_argument("--case-sensitive", action="store_true")
    training = parser.add_argument_group("training")
    training.add_argument("--batch-size", type=float, required=True, help="expected batch size B")
    training.add_argument("--steps", type=int, required=True, help="number of steps T")
    planning = parser.add_argument_group("planning")
    planning.add_argument("--c", type=float, default=1.0, dest="lp_c", help="LP constant c")
    planning.add_argument("--accountant", default=DEFAULT_ACCOUNTANT, choices=tuple(ACCOUNTANTS))
    planning.add_argument(
        "--budget",
        default=None,
        choices=LP_BUDGET_KINDS,
        help="LP budget per secret (default: follows the accountant)",
    )
    planning.add_argument("--solver", default="highs", help="highs, or pulp[:CBC|GUROBI|CPLEX|...]")
    planning.add_argument("--drop-secretless", action="store_true", help="give examples without secrets w=0")
    planning.add_argument("--time-limit", type=float, default=None, help="LP time limit in seconds")
    planning.add_argument(
        "--allow-unmatched",
        action="store_true",
        help="accept secrets that mark no example (an error by default); the plan counts them",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--output", default="hush_plan.json", help="plan JSON path")
    out.add_argument(
        "--sweep-c",
        action="store_true",
        help="also sweep c = 2^-6..2^4 and write sweep_c.json / sweep_c.png beside the plan",
    )


def check_arguments(args: argparse.Namespace) -> None:
    """ValueError naming the argument, before any data is read (a 400K-row corpus takes ~30 s to tag)."""
    from hush_hf.cli.paths import check_input_file, check_output_file
    from hush_hf.planning.plan import _validate_plan_args

    _validate_plan_args(args.batch_size, args.steps, args.lp_c, args.accountant, None)
    if args.time_limit is not None and not (np.isfinite(args.time_limit) and args.time_limit > 0):
        raise ValueError(f"--time-limit must be a positive number of seconds, got {args.time_limit!r}")
    if args.num_proc is not None and args.num_proc < 1:
        raise ValueError(f"--num-proc must be >= 1, got {args.num_proc}")
    check_input_file("--secrets", args.secrets)
    given = [f"--{name.replace('_', '-')}" for name in SELECTION_DEFAULTS if getattr(args, name) is not None]
    if args.secrets is not None and given:
        raise ValueError(
            f"{', '.join(given)}: for the document-frequency selection (--df-ranks/--df-range) only; with "
            "--secrets, the secrets file states every secret's prior and target"
        )
    for name, default in SELECTION_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.secrets is None:
        if args.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {args.seed}")
        if not 0 < args.prior < 1:
            raise ValueError(f"--prior must lie in (0, 1), got {args.prior!r}")
        lo, hi = args.target_range
        if not args.prior < lo <= hi < 1:
            raise ValueError(f"--target-range must satisfy prior < LO <= HI < 1, got {lo!r} {hi!r}")
        name, (lo, hi) = ("--df-ranks", args.df_ranks) if args.df_ranks else ("--df-range", args.df_range)
        if not 0 <= lo < hi:
            raise ValueError(f"{name} must satisfy 0 <= LO < HI, got {lo} {hi}")
    check_output_file("--output", args.output)


def run(args: argparse.Namespace) -> int:
    from hush_hf.data import load_text_dataset
    from hush_hf.planning import plan_protection
    from hush_hf.planning.sweep import plot_sweep, sweep_lp_c
    from hush_hf.secrets import SecretSet

    check_arguments(args)
    secret_set = SecretSet.load(args.secrets) if args.secrets else None  # a bad file fails before the data
    dataset = load_text_dataset(args.dataset, split=args.split)
    secret_set, dataset = _secrets_and_tags(args, dataset, secret_set)
    from hush_hf.data import SECRET_IDS_COLUMN, arrow_columns

    secret_ids = arrow_columns(dataset, [SECRET_IDS_COLUMN])[0][1]  # in row order
    plan_kwargs = dict(
        expected_batch_size=args.batch_size,
        steps=args.steps,
        accountant=args.accountant,
        budget=args.budget,
        solver=args.solver,
        drop_secretless=args.drop_secretless,
        time_limit=args.time_limit,
    )
    plan = plan_protection(
        dataset,  # bound to its rows
        secret_set.priors,
        secret_set.targets,
        lp_c=args.lp_c,
        progress=True,
        allow_unmatched=args.allow_unmatched,
        secret_set_fingerprint=secret_set.fingerprint,
        **plan_kwargs,
    )
    path = plan.save(args.output, include_fingerprint=True)  # a local file; published copies omit it
    print(format_summary(plan))
    print(f"plan written to {path}")
    if args.sweep_c:
        rows = sweep_lp_c(
            secret_ids,
            secret_set.priors,
            secret_set.targets,
            allow_unmatched=args.allow_unmatched,
            **plan_kwargs,
        )
        sweep_json = path.with_name("sweep_c.json")
        sweep_json.write_text(json.dumps(rows, indent=2))
        png = plot_sweep(
            rows,
            path.with_name("sweep_c.png"),
            title=f"{len(secret_set)} secrets, B={args.batch_size:g}, T={args.steps}, {args.accountant}",
        )
        print(format_sweep(rows))
        print(f"sweep written to {sweep_json} and {png}")
    return 0


def _secrets_and_tags(args: argparse.Namespace, dataset, secret_set):
    from hush_hf.secrets import select_by_document_frequency, tagger_for

    if secret_set is None:
        if args.case_sensitive:
            # Selection counts case-folded words; case-sensitive tagging would miss "Word" for "word"
            # and leave examples containing a secret untagged (under-protection).
            raise ValueError("--case-sensitive cannot be combined with --df-ranks/--df-range selection")
        secret_set = select_by_document_frequency(
            dataset,
            text_column=args.text_column,
            rank_range=tuple(args.df_ranks) if args.df_ranks else None,
            df_range=tuple(args.df_range) if args.df_range else None,
            prior=args.prior,
            target_range=tuple(args.target_range),
            seed=args.seed,
            num_proc=args.num_proc,
        )
    logger.info("%d secrets", len(secret_set))
    from hush_hf.data import SECRET_IDS_COLUMN
    from hush_hf.secrets.marks import find_marks_column

    if SECRET_IDS_COLUMN in dataset.column_names or find_marks_column(dataset.column_names) is not None:
        from hush_hf.trainer.plan_setup import prepare_secret_ids

        # Marks -> ids (in step with input_ids); existing ids: fingerprint and tagged text checked.
        dataset = prepare_secret_ids(
            dataset, secret_set=secret_set, text_column=args.text_column, name="--dataset"
        )
    else:
        from hush_hf.secrets.tagging import tag_columns, text_sources

        tagger = tagger_for(secret_set, case_sensitive=args.case_sensitive)
        sources = text_sources(dataset, args.text_column)  # as the trainer tags it (untokenized: all)
        if len(sources) > 1:
            logger.warning("--dataset is not tokenized: its text columns %s are tagged as well as %r",
                           sources[1:], args.text_column)
        dataset = tag_columns(dataset, tagger, sources, num_secrets=len(secret_set), num_proc=args.num_proc)
    return secret_set, dataset


def format_summary(plan) -> str:
    s = plan.summary()
    sec = plan.secrets
    ratio = sec.bound / sec.target
    matched = sec.num_examples[sec.num_examples > 0]
    unmatched = f"; {plan.unmatched_secrets} match NO example" if plan.unmatched_secrets else ""
    lines = [
        "Protection plan",
        f"  examples            {s['examples']:>12,d}   secrets {s['secrets']:,d}{unmatched}",
        f"  memberships         {int(sec.num_examples.sum()):>12,d}   examples per matched secret "
        f"min {int(matched.min()) if matched.size else 0} "
        f"/ median {np.median(matched) if matched.size else 0:g} / max {int(matched.max(initial=0))}",
        f"  B, T, c             {s['expected_batch_size']:g}, {s['steps']}, {s['lp_c']:g}"
        f"   (budget: {s['budget']})",
        f"  retained            {s['retained_fraction']:.2%} of examples have w > 0;"
        f" sum(w)/n = {s['retained_weight_fraction']:.2%}",
        f"  LP                  {plan.lp['solver']}, {plan.lp['status']}, certified gap {plan.lp['gap']:.2e},"
        f" {plan.lp['seconds']:.1f} s",
        f"  max sampling prob   {s['max_sampling_prob']:.3g}",
        f"  noise multiplier    {s['noise_multiplier']:.6g}   ({s['accountant']} accountant"
        f"{'' if plan.calibrated else ', given by the user'})",
        f"  bound / target      max {ratio.max(initial=0):.4f}, median {s['bound_over_target_median']:.4f};"
        f" {int(np.sum(ratio > 0.99))} secrets within 1% of their target",
        f"  all targets met     {'yes' if s['meets_targets'] else 'NO'}",
    ]
    return "\n".join(lines)


def format_sweep(rows) -> str:
    lines = [f"{'c':>10} {'retained':>9} {'sum(w)/n':>9} {'sigma':>10}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['lp_c']:>10.4g}  infeasible: {r['error']}")
        else:
            lines.append(
                f"{r['lp_c']:>10.4g} {r['retained_fraction']:>9.2%} {r['retained_weight_fraction']:>9.2%}"
                f" {r['noise_multiplier']:>10.4g}"
            )
    return "\n".join(lines)
