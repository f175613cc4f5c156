"""Attack a trained model and write the evidence: exposure of canaries, k-extractability, membership
inference and secret reconstruction, next to the certified bounds (audit.json, privacy_report.*)."""

from __future__ import annotations

import argparse
import json

HELP = "attack a trained model (canaries, extraction, membership, secrets) and write a privacy report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", required=True, help="a saved model (with hush_plan.json beside it)")
    parser.add_argument("--dataset", default=None, help="the training data (file, saved dataset or Hub name)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--heldout", default=None, help="data not trained on, for membership inference")
    parser.add_argument("--secrets", default=None, help="secrets file, for secret reconstruction")
    parser.add_argument("--canaries", default=None, help="canary file written by hush_hf.audit.save_canaries")
    parser.add_argument("--reference-model", default=None, help="reference model for calibrated MIA")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--max-examples", type=int, default=1000)
    parser.add_argument("--prefix-length", type=int, default=50)
    parser.add_argument("--suffix-length", type=int, default=50)
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="most tokens per model input; longer texts are cut (default: the model's positions)",
    )
    parser.add_argument(
        "--exposure-method", default="auto", choices=("auto", "exact", "empirical", "skewnorm")
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)


def check_arguments(args: argparse.Namespace) -> None:
    """ValueError naming the argument, before the model or any data is read."""
    from pathlib import Path

    if not Path(args.model_dir).is_dir():
        raise ValueError(f"--model-dir {args.model_dir!r} is not a folder")
    if not (Path(args.model_dir) / "config.json").is_file():
        raise ValueError(f"--model-dir {args.model_dir!r} has no config.json: not a saved model")
    from hush_hf.cli.paths import check_input_file

    for name in ("secrets", "canaries"):
        check_input_file(f"--{name}", getattr(args, name))
    if args.reference_model is not None and not Path(args.reference_model).is_dir():
        raise ValueError(f"--reference-model {args.reference_model!r} is not a folder")
    for name in ("max_examples", "prefix_length", "suffix_length", "batch_size", "max_length"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if Path(args.output_dir).is_file():
        raise ValueError(f"--output-dir {args.output_dir!r} is a file")


def run(args: argparse.Namespace) -> int:
    from hush_hf.audit import run_audit
    from hush_hf.data import load_text_dataset

    check_arguments(args)

    def load(name):
        return None if name is None else load_text_dataset(name, split=args.split)

    report = run_audit(
        args.model_dir,
        load(args.dataset),
        output_dir=args.output_dir,
        secrets=args.secrets,
        canaries=args.canaries,
        heldout=load(args.heldout),
        reference_model_dir=args.reference_model,
        text_column=args.text_column,
        max_examples=args.max_examples,
        prefix_length=args.prefix_length,
        suffix_length=args.suffix_length,
        max_length=args.max_length,
        exposure_method=args.exposure_method,
        batch_size=args.batch_size,
        seed=args.seed,
        device=args.device,
    )
    print(json.dumps(report.get("attacks", {}), indent=2, default=str)[:4000])
    print(f"audit written to {args.output_dir}")
    return 0
