"""The `kfbot` command: one subcommand module each, one error handler for all."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kfbot import __version__
from kfbot.errors import EXIT_USAGE, KfbotError

# Subcommand modules of kfbot.commands, imported when their parser is built: `kfbot scan`
# need not import the evaluation engine that `verify` and `bench` are built on.
COMMANDS = ("scan", "verify", "bench", "optimize", "lessons", "check", "hook", "action")
# Commands that run untrusted code (candidates, the repository's tests and scripts) or
# hold a token: they start with a clean environment (see kfbot.credentials).
PROTECTED = frozenset({"verify", "bench", "optimize", "action"})


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line parser; with `only`, of that one subcommand (it parses alike)."""
    parser = argparse.ArgumentParser(
        prog="kfbot", description="Make the CUDA kernels in a repository faster, and prove it.")
    parser.add_argument("--version", action="version", version=f"kfbot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        importlib.import_module(f"kfbot.commands.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    # Only a command named first is parsed alone: `kfbot --help` lists them all.
    command = args_in[0] if args_in and args_in[0] in COMMANDS else None
    parser = build_parser(command)
    args = parser.parse_args(args_in)
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


def entry() -> int:
    """The `kfbot` program: `main`, after a protected command has shed its environment."""
    if len(sys.argv) > 1 and sys.argv[1] in PROTECTED:
        from kfbot.credentials import protect

        protect()
    return main()


if __name__ == "__main__":
    sys.exit(entry())
