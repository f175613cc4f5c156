"""Render a privacy report (Markdown + PNG) from a plan and, optionally, an audit."""

from __future__ import annotations

import argparse

HELP = "render privacy_report.{json,md} and plots from a plan and an audit"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, help="hush_plan.json")
    parser.add_argument("--audit", default=None, help="audit.json written by `hush audit`")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--clip-norm", type=float, default=None, help="C used in training")
    parser.add_argument("--noise-multiplier", type=float, default=None, help="sigma used in training")
    parser.add_argument("--model-name", default=None)
    crt = parser.add_argument_group("CRT confidentiality for secrets no tagger marks (CRT Thm. 8.3)")
    crt.add_argument("--crt-recall", type=float, default=None, help="measured recall of the redaction policy")
    crt.add_argument(
        "--crt-conservative-recall", type=float, default=None, help="recall of pi_c (default: --crt-recall)"
    )
    crt.add_argument("--crt-delta", type=float, default=1e-5, help="delta of the per-example (eps, delta)")
    crt.add_argument(
        "--crt-occurrences",
        default=None,
        metavar="REDACTION_JSON",
        help="report of `hush redact --secrets`: each secret's rows and unique occurrences (CRT Prop. 7)",
    )


def check_arguments(args: argparse.Namespace) -> None:
    """ValueError naming the argument, before any file is read."""
    import math
    from pathlib import Path

    from hush_hf.cli.paths import check_input_file, check_parent, check_share

    check_input_file("--plan", args.plan)
    check_input_file("--audit", args.audit, hint=" (`hush audit --output-dir DIR` writes DIR/audit.json)")
    check_input_file("--crt-occurrences", args.crt_occurrences,
                     hint=" (`hush redact --secrets FILE` writes OUTPUT.redaction.json)")
    check_share("--crt-recall", args.crt_recall)
    check_share("--crt-conservative-recall", args.crt_conservative_recall)
    check_share("--crt-delta", args.crt_delta, low_open=True, high_open=True)
    if args.crt_conservative_recall is not None and args.crt_recall is None:
        raise ValueError("--crt-conservative-recall needs --crt-recall (the redaction policies' recall)")
    if args.clip_norm is not None and not (math.isfinite(args.clip_norm) and args.clip_norm > 0):
        raise ValueError(f"--clip-norm must be a positive number, got {args.clip_norm!r}")
    sigma = args.noise_multiplier
    if sigma is not None and not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"--noise-multiplier must be a finite number >= 0, got {sigma!r}")
    if Path(args.output_dir).is_file():
        raise ValueError(f"--output-dir {args.output_dir!r} is a file")
    check_parent("--output-dir", Path(args.output_dir))


def run(args: argparse.Namespace) -> int:
    from hush_hf.audit import render_report

    check_arguments(args)

    paths = render_report(
        args.plan,
        args.audit,
        args.output_dir,
        clip_norm=args.clip_norm,
        noise_multiplier=args.noise_multiplier,
        model_name=args.model_name,
        crt_recall=args.crt_recall,
        crt_conservative_recall=args.crt_conservative_recall,
        crt_delta=args.crt_delta,
        crt_occurrences=args.crt_occurrences,
    )
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0
