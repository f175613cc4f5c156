"""Deduplicate and redact a text dataset for Confidentially Redacted Training (CRT Alg. 1, lines 1-4).

Exact duplicate rows are removed (near-duplicate rows too with --near-dup, and repeated sentences and
lines masked with --sentence-dedup), then every span a policy finds is replaced by the mask token and
each row is marked public (nothing found by any policy or conservative policy nor by the secrets' own
matcher, no mask) or private in a ``crt_public`` column. Writes the dataset
(``.jsonl``/``.json``/``.csv``/``.parquet`` by suffix, else a ``save_to_disk`` folder) and a JSON report
of counts (no text). Train it with ``SecretProtectionConfig(crt_schedule="alternate_epochs")``.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

HELP = "deduplicate and redact a dataset, marking public and private rows (CRT)"
logger = logging.getLogger("hush.redact")


def _names(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hush_hf.crt.policies import POLICY_NAMES

    data = parser.add_argument_group("data")
    data.add_argument("--dataset", required=True, help="local json/jsonl/parquet/csv/txt file or dataset dir")
    data.add_argument("--split", default="train")
    data.add_argument("--text-column", default="text")
    data.add_argument("--num-proc", type=int, default=None)
    data.add_argument("--output", required=True, help="output file (.jsonl/.json/.csv/.parquet) or folder")
    data.add_argument("--report", default=None, help="report JSON (default: <output>.redaction.json)")
    dedup = parser.add_argument_group("dedup")
    dedup.add_argument("--no-dedup", action="store_true", help="skip exact-duplicate removal")
    dedup.add_argument(
        "--sentence-dedup",
        action="store_true",
        help="also mask repeated sentences (in code: repeated lines) from their second occurrence on",
    )
    dedup.add_argument(
        "--near-dup", type=float, default=None, metavar="JACCARD", help="also remove near duplicates (0.8)"
    )
    policy = parser.add_argument_group("policies")
    policy.add_argument(
        "--policies",
        type=_names,
        default=None,
        help=f"comma-separated policies pi whose spans are masked: {', '.join(POLICY_NAMES)} "
        "(default: secrets,pii,credentials with --secrets, else pii,credentials)",
    )
    policy.add_argument(
        "--conservative",
        type=_names,
        default=[],
        help="comma-separated high-recall policies pi_c: rows they mark are private, nothing is masked",
    )
    policy.add_argument("--secrets", default=None, help="secrets file for the 'secrets' policy")
    policy.add_argument("--case-sensitive", action="store_true")
    policy.add_argument("--phone-regions", type=_names, default=None, help="e.g. US,GB,DE")
    mask = parser.add_argument_group("mask token")
    mask.add_argument("--mask-token", default="<MASK>")
    mask.add_argument("--tokenizer", default=None, help="local tokenizer folder: must know the mask token")
    mask.add_argument(
        "--add-mask-token",
        action="store_true",
        help="add the mask token to --tokenizer; the result is saved to <output>.tokenizer/",
    )


def _save(dataset, output: Path) -> None:
    suffix = output.suffix.lower()
    if suffix in (".jsonl", ".json"):
        dataset.to_json(str(output), lines=suffix == ".jsonl")
    elif suffix == ".csv":
        dataset.to_csv(str(output), index=False)
    elif suffix == ".parquet":
        dataset.to_parquet(str(output))
    else:
        dataset.save_to_disk(str(output))


def check_arguments(args: argparse.Namespace) -> None:
    """ValueError naming the argument, before any data is read (tagging and dedup of a corpus take long,
    and an output that cannot be written would be found only at the end)."""
    import math

    from hush_hf.cli.paths import check_input_file, check_output_file, check_parent

    check_input_file("--secrets", args.secrets)
    if args.num_proc is not None and args.num_proc < 1:
        raise ValueError(f"--num-proc must be >= 1, got {args.num_proc}")
    near = args.near_dup
    if near is not None and not (math.isfinite(near) and 0 < near <= 1):
        raise ValueError(f"--near-dup must be a Jaccard similarity in (0, 1], got {near!r}")
    if not args.mask_token.strip():
        raise ValueError(f"--mask-token must be a non-empty string, got {args.mask_token!r}")
    if args.tokenizer is not None and not Path(args.tokenizer).is_dir():
        raise ValueError(f"--tokenizer {args.tokenizer!r} is not a folder: give a local tokenizer folder")
    check_parent("--output", Path(args.output))
    check_output_file("--report", args.report)


def run(args: argparse.Namespace) -> int:
    from hush_hf.crt import build_policies, dedup_dataset, redact_dataset
    from hush_hf.data import load_text_dataset

    check_arguments(args)
    secret_set = None
    if args.secrets:
        from hush_hf.secrets import SecretSet

        secret_set = SecretSet.load(args.secrets)
    if args.policies is None:
        args.policies = (
            ["secrets", "pii", "credentials"] if secret_set is not None else ["pii", "credentials"]
        )
    if secret_set is None and "secrets" in [*args.policies, *args.conservative]:
        raise ValueError("policy 'secrets' needs --secrets FILE")
    if args.add_mask_token and not args.tokenizer:
        raise ValueError("--add-mask-token needs --tokenizer")
    kwargs = dict(secret_set=secret_set, case_sensitive=args.case_sensitive, phone_regions=args.phone_regions)
    policies = build_policies(args.policies, **kwargs) if args.policies else []
    conservative = build_policies(args.conservative, **kwargs) if args.conservative else []
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    dataset = load_text_dataset(args.dataset, split=args.split)
    report: dict = {"input_rows": len(dataset)}
    if secret_set is not None:  # CRT Prop. 7: what dedup leaves of each secret (indices and counts only)
        from hush_hf.crt import occurrence_counts

        counts = occurrence_counts(dataset, secret_set, text_column=args.text_column)
        report["secret_occurrences"] = {key: value.tolist() for key, value in counts.items()}
        repeated = int((counts["sentences"] > counts["unique"]).sum())
        print(
            f"secrets: {repeated} of {len(secret_set)} repeat a sentence (counted once after dedup)"
        )
    if not args.no_dedup or args.near_dup is not None or args.sentence_dedup:
        dataset, dedup = dedup_dataset(
            dataset,
            text_column=args.text_column,
            sentences=args.sentence_dedup,
            near_threshold=args.near_dup,
            mask_token=args.mask_token,
            num_proc=args.num_proc,
        )
        report["dedup"] = dedup.to_dict()
        print(dedup.summary())
    dataset, redaction = redact_dataset(
        dataset,
        policies,
        text_column=args.text_column,
        conservative_policies=conservative,
        mask_token=args.mask_token,
        tokenizer=tokenizer,
        add_mask_token=args.add_mask_token,
        num_proc=args.num_proc,
        secrets=secret_set,
        case_sensitive=args.case_sensitive,
    )
    report["redaction"] = redaction.to_dict()
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    if redaction.mask_token_added:
        saved = output.with_name(output.name + ".tokenizer")
        tokenizer.save_pretrained(str(saved))
        print(f"added {args.mask_token!r} to the tokenizer, saved to {saved}: resize the model's embeddings")
    _save(dataset, output)
    report_path = Path(args.report) if args.report else output.with_name(output.name + ".redaction.json")
    report_path.write_text(json.dumps(report, indent=2))
    marked = ", ".join(f"{n} {c['rows_marked']}" for n, c in redaction.policies.items())
    print(
        f"redaction: {redaction.rows} rows, {redaction.private_rows} private, "
        f"{redaction.public_rows} public; rows marked per policy: {marked}"
    )
    for name in redaction.marks_everything:
        print(f"note: policy {name!r} marks every row: no public rows, CRT trains everything with DP")
    print(f"dataset written to {output}, report to {report_path}")
    return 0
