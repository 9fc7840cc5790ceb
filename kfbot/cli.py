"""The `kfbot` command: one subcommand module each, one error handler for all."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kfbot import __version__
from kfbot.commands import bench, scan, verify
from kfbot.errors import EXIT_USAGE, KfbotError

COMMANDS = (scan, verify, bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kfbot", description="Make the CUDA kernels in a repository faster, and prove it.")
    parser.add_argument("--version", action="version", version=f"kfbot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.run(args))
    except KfbotError as exc:
        print(f"kfbot: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kfbot: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
