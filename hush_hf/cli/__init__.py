"""The ``hush`` command line: planning and auditing secret protection."""

from __future__ import annotations

import argparse
import logging
import sys

from hush_hf.cli import audit as audit_command
from hush_hf.cli import plan as plan_command
from hush_hf.cli import redact as redact_command
from hush_hf.cli import report as report_command
from hush_hf.cli import verify as verify_command

COMMANDS = {
    "plan": plan_command,
    "audit": audit_command,
    "report": report_command,
    "redact": redact_command,
    "verify": verify_command,
}
USER_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """Argument errors as one line on stderr (``hush plan: error: ...``) and exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(USER_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="hush", description=__doc__)
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
    except (ValueError, OSError) as err:  # bad input or an unreadable file: one clear line, no traceback
        message = " ".join(str(err).split())
        print(f"hush {args.command}: error: {message}", file=sys.stderr)
        return USER_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
