"""The ``hush`` command line: planning and auditing secret protection."""

from __future__ import annotations

import argparse
import logging
import sys

from hush_hf.cli import audit as audit_command
from hush_hf.cli import plan as plan_command
from hush_hf.cli import redact as redact_command
from hush_hf.cli import report as report_command

COMMANDS = {
    "plan": plan_command,
    "audit": audit_command,
    "report": report_command,
    "redact": redact_command,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hush", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.add_arguments(
            sub.add_parser(
                name,
                help=module.HELP,
                description=module.__doc__,
                formatter_class=argparse.ArgumentDefaultsHelpFormatter,
            )
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return COMMANDS[args.command].run(args) or 0
    except ValueError as err:  # bad input: one clear line, no traceback
        print(f"hush {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
