"""Recompute every secret's posterior bound from a saved plan and check it against its target.

`hush verify MODEL_DIR` reads MODEL_DIR/hush_plan.json (and the noise multiplier training used, from
MODEL_DIR/privacy_report.json: the smaller of it and the plan's, since bounds shrink as noise grows)
and recomputes each bound from the plan's sampling probabilities, the recorded memberships, sigma and
T with the plan's accountant. `--plan PLAN --dataset DATA` takes the memberships from the dataset's
`secret_ids` column instead (or tags its text column with `--secrets`); a local plan file (with its
row digests) also checks that DATA holds the rows it was made from. Prints targets against bounds;
exit status 0 when every target holds, 1 when one does not, 2 for bad input.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

HELP = "recompute every secret's bound from a saved plan and check it against its target (exit 0/1)"
PLAN_FILE = "hush_plan.json"
REPORT_FILE = "privacy_report.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", nargs="?", default=None,
                        help=f"a saved model folder with {PLAN_FILE} (and {REPORT_FILE}) beside the weights")
    parser.add_argument("--plan", default=None, help=f"a plan file (default: MODEL_DIR/{PLAN_FILE})")
    parser.add_argument("--dataset", default=None,
                        help="the training data, in plan order: recompute which examples hold which secret")
    parser.add_argument("--split", default="train")
    parser.add_argument("--secrets", default=None, help="secrets file to tag --dataset with (if untagged)")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--noise-multiplier", type=float, default=None,
                        help="the sigma training used (default: see above)")
    parser.add_argument("--show", type=int, default=20, help="secrets listed (closest to their target first)")


def check_arguments(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """(plan path, report path or None); ValueError naming the argument, before any data is read."""
    if args.model_dir is None and args.plan is None:
        raise ValueError("give MODEL_DIR or --plan")
    if args.model_dir is not None and not Path(args.model_dir).is_dir():
        raise ValueError(f"MODEL_DIR {args.model_dir!r} is not a folder")
    plan = Path(args.plan) if args.plan is not None else Path(args.model_dir) / PLAN_FILE
    if not plan.is_file():
        raise ValueError(f"plan file {str(plan)!r} does not exist")
    if args.secrets is not None and args.dataset is None:
        raise ValueError("--secrets tags --dataset: give --dataset too")
    if args.secrets is not None and not Path(args.secrets).is_file():
        raise ValueError(f"--secrets file {args.secrets!r} does not exist")
    sigma = args.noise_multiplier
    if sigma is not None and not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"--noise-multiplier must be a finite number >= 0, got {sigma!r}")
    if args.show < 0:
        raise ValueError(f"--show must be >= 0, got {args.show}")
    report = Path(args.model_dir) / REPORT_FILE if args.model_dir is not None else None
    return plan, report if report is not None and report.is_file() else None


def trained_noise_multiplier(plan: object, report_path: Path | None) -> tuple[float, str]:
    """The sigma to verify at: the smaller of the plan's and the one the privacy report records."""
    from hush_hf.jsonfile import read_json

    sigma, source = float(plan.noise_multiplier), "the plan"
    if report_path is not None:
        report = read_json(report_path, what="privacy report")
        training = report.get("training") if isinstance(report, dict) else None
        recorded = (training or {}).get("noise_multiplier")
        if recorded is not None:
            if isinstance(recorded, bool) or not isinstance(recorded, (int, float)) or not recorded >= 0:
                raise ValueError(
                    f"privacy report {str(report_path)!r}: training.noise_multiplier={recorded!r} is not a "
                    "number >= 0"
                )
            if recorded < sigma:
                sigma, source = float(recorded), "the privacy report (training used less noise than planned)"
    return sigma, source


def dataset_secret_ids(args: argparse.Namespace, plan: object) -> object:
    """The dataset's ``secret_ids`` (tagged with --secrets when it has none), checked against the plan."""
    from hush_hf.data import load_text_dataset
    from hush_hf.trainer.plan_setup import SECRET_IDS_COLUMN, check_secret_ids_match, column

    dataset = load_text_dataset(args.dataset, split=args.split)
    if len(dataset) != plan.num_examples:
        raise ValueError(
            f"--dataset has {len(dataset)} rows but the plan covers {plan.num_examples} examples"
        )
    if plan.rows is not None:  # a local plan file: the rows themselves (published copies omit the digests)
        plan.check_rows(dataset, what="--dataset")
    if SECRET_IDS_COLUMN in dataset.column_names:
        from hush_hf.secrets.tagging import check_secret_ids_current

        unchecked = check_secret_ids_current(dataset, text_column=args.text_column, what="--dataset")
        if unchecked:
            print(f"warning: {unchecked}")
    else:
        if args.secrets is None:
            raise ValueError(f"--dataset has no '{SECRET_IDS_COLUMN}' column: give --secrets to tag it")
        from hush_hf.secrets import SecretSet, tag_dataset, tagger_for

        secret_set = SecretSet.load(args.secrets)
        if len(secret_set) != plan.num_secrets:
            raise ValueError(
                f"--secrets has {len(secret_set)} secrets but the plan covers {plan.num_secrets}"
            )
        if args.text_column not in dataset.column_names:
            raise ValueError(
                f"--dataset has no text column {args.text_column!r} (columns: {dataset.column_names})"
            )
        dataset = tag_dataset(dataset, tagger_for(secret_set), text_column=args.text_column,
                              num_secrets=len(secret_set))
    secret_ids = column(dataset, SECRET_IDS_COLUMN)
    check_secret_ids_match(plan, secret_ids)
    return secret_ids


def run(args: argparse.Namespace) -> int:
    from hush_hf.planning.plan import ProtectionPlan
    from hush_hf.planning.verification import recompute_bounds

    plan_path, report_path = check_arguments(args)
    plan = ProtectionPlan.load(plan_path)
    if args.noise_multiplier is not None:
        sigma, source = float(args.noise_multiplier), "--noise-multiplier"
    else:
        sigma, source = trained_noise_multiplier(plan, report_path)
    secret_ids = dataset_secret_ids(args, plan) if args.dataset is not None else None
    verification = recompute_bounds(plan, sigma, secret_ids=secret_ids)
    print(f"plan: {plan_path} ({plan.num_secrets} secrets, {plan.num_examples} examples)")
    print(f"noise multiplier {sigma:.6g} (from {source}), T={plan.steps}, accountant {plan.accountant}")
    if args.show:
        print(verification.table(limit=args.show))
    held = plan.num_secrets - verification.over_target.size
    if verification.meets_targets:
        print(f"OK: all {plan.num_secrets} targets hold")
        return 0
    print(f"FAILED: {verification.over_target.size} of {plan.num_secrets} secrets exceed their targets "
          f"({held} hold); {verification.worst()}")
    return 1
