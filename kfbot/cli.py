"""The `kfbot` command: one subcommand module each, one error handler for all.

Every subcommand is built by `CommandParser`, which gives it the options all of them
share (`--verbose`) and the help layout (every option's default shown); a bad option
is answered with that subcommand's own usage. `tests/commands/test_cli_rules.py` holds every
subcommand to the same rules.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kfbot import __version__, extras
from kfbot.errors import EXIT_USAGE, KfbotError
from kfbot.text import printable

log = logging.getLogger(__name__)

# Subcommand modules of kfbot.commands, imported when their parser is built: `kfbot scan`
# need not import the evaluation engine that `verify` and `bench` are built on.
COMMANDS = ("scan", "verify", "bench", "optimize", "reproduce", "lessons", "check", "hook",
            "action")
# Commands that run untrusted code (candidates, the repository's tests and scripts) or
# hold a token: they start with a clean environment (see kfbot.evaluate.sandbox.credentials).
PROTECTED = frozenset({"verify", "bench", "optimize", "reproduce", "action"})
# Commands that run untrusted code: they take --allow-unsandboxed and read
# `sandbox.allow_unsandboxed` from the repository's config (see kfbot.evaluate.sandbox).
RUNS_CODE = frozenset({"verify", "bench", "optimize", "reproduce", "hook"})
# What a command that holds a secret will import later, imported before any untrusted
# process starts: were kfbot's environment writable to that code (no sandbox, allowed),
# a module it replaced would otherwise run inside kfbot, beside the secrets.
PRELOADED = {
    "optimize": ("kfbot.search", "kfbot.github", "anthropic", "anthropic.resources",
                 "anthropic.types", "github", "httpx", "ssl", "encodings.idna"),
    "action": ("kfbot.search", "kfbot.github", "kfbot.commands", "anthropic",
               "anthropic.resources", "anthropic.types", "github", "httpx", "ssl",
               "encodings.idna"),
}


class HelpFormatter(argparse.HelpFormatter):
    """Says every option's default, unless its help already does."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, [], argparse.SUPPRESS) \
                or action.option_strings == [] or "%(default)" in text:
            return text
        shown = default if not isinstance(default, (list, tuple)) else ", ".join(
            str(d) for d in default)
        return f"{text} (default: {shown})".replace("%", "%%")


class CommandParser(argparse.ArgumentParser):
    """The parser of a subcommand (and of the subcommands under it, as for `hook`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        # SUPPRESS: `kfbot hook -v verify` keeps the -v of `hook`; a nested parser's own
        # default would overwrite it.
        self.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                          help="log what kfbot does to stderr; twice for debug detail")
        self.set_defaults(parser=self)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line parser; with `only`, of that one subcommand (it parses alike).

    A command whose module needs an extra that is not installed is left out of the
    full list; asked for alone, it is a KfbotError with the line that installs it.
    """
    parser = argparse.ArgumentParser(
        prog="kfbot", formatter_class=HelpFormatter,
        description="Make the CUDA kernels in a repository faster, and prove it.")
    parser.add_argument("--version", action="version", version=f"kfbot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for name in COMMANDS if only is None else (only,):
        try:
            module = importlib.import_module(f"kfbot.commands.{name}")
        except ImportError as exc:
            missing = extras.from_import_error(exc, f"kfbot {name}")
            if missing is None or only is not None:
                raise missing or exc from exc
            log.debug("kfbot %s left out: %s", name, missing)
            continue
        module.add_parser(sub)
        if name in RUNS_CODE and name != "hook":
            _add_sandbox_argument(sub.choices[name])
    return parser


def _add_sandbox_argument(p: argparse.ArgumentParser) -> None:
    from kfbot.evaluate.sandbox.policy import ALLOW_VARIABLE

    p.add_argument("--allow-unsandboxed", action="store_true",
                   help="where no sandbox works here, run the repository's code and "
                        f"candidates even while kfbot holds a secret (also {ALLOW_VARIABLE}=1)")


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    # Only a command named first is parsed alone: `kfbot --help` lists them all.
    command = args_in[0] if args_in and args_in[0] in COMMANDS else None
    try:
        parser = build_parser(command)
    except KfbotError as exc:
        return _failed(exc)
    args, unknown = parser.parse_known_args(args_in)
    # Said with the usage of the subcommand they were given to, not the top level's.
    used: argparse.ArgumentParser = getattr(args, "parser", parser)
    if unknown:
        used.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "run", None):
        used.print_help(sys.stderr)
        return EXIT_USAGE
    _logging(getattr(args, "verbose", 0))
    # A CI runner cancels a job with SIGTERM: unwound like ^C, so that the processes
    # kfbot started (a repository's build, its tests) are killed with their groups
    # rather than left running.
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        # `scan --observe` runs the repository's tests too (a plain scan stays light).
        name = str(getattr(args, "command", None) or command or "")
        if name in RUNS_CODE or name == "action" or getattr(args, "observe", False):
            _sandbox_policy(args, name)
        return int(args.run(args))
    except KfbotError as exc:
        return _failed(exc)
    except ImportError as exc:  # an extra the command reached for only now
        missing = extras.from_import_error(exc, f"kfbot {command}")
        if missing is None:
            raise
        return _failed(missing)
    except KeyboardInterrupt:
        print("kfbot: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    finally:  # a caller in the same process (a test, an embedding tool) gets its own back
        signal.signal(signal.SIGTERM, previous)


def _sandbox_policy(args: argparse.Namespace, command: str) -> None:
    """Before any untrusted process: whether it may run unsandboxed, the secrets this
    process holds, and (with a secret) what it will import later, imported before the
    first untrusted process starts."""
    from kfbot.evaluate.sandbox import configure, credentials, held_secrets

    allow = bool(getattr(args, "allow_unsandboxed", False)) or _config_allows(args, command)
    secrets = held_secrets(credentials.original_environment())
    later = PRELOADED.get(command, ()) if secrets else ()
    configure(allow, secrets, lambda: credentials.preload(later))


def _config_allows(args: argparse.Namespace, command: str) -> bool:
    """`sandbox.allow_unsandboxed` of the repository's config. Never in the Action, where
    the checkout may be a pull request's; a config that does not load allows nothing (the
    command reports it when it loads it)."""
    from kfbot.config import load_config

    repo = getattr(args, "repo", None)
    if command == "action" or not isinstance(repo, Path):
        return False
    try:
        return load_config(getattr(args, "config", None), repo.resolve()).sandbox.allow_unsandboxed
    except KfbotError:
        return False


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _failed(exc: KfbotError) -> int:
    print(f"kfbot: error: {printable(str(exc))}", file=sys.stderr)
    return exc.exit_code


def _logging(verbose: int) -> None:
    """kfbot's own loggers: warnings by default, `-v` info, `-vv` debug, all to stderr.
    What a command tells its user is printed, not logged."""
    level = logging.WARNING if not verbose else logging.INFO if verbose == 1 else logging.DEBUG
    handler = _Stderr()
    form = "kfbot: %(levelname)s: %(message)s" if not verbose else \
        "%(asctime)s %(name)s %(levelname)s: %(message)s"
    handler.setFormatter(logging.Formatter(form))
    root = logging.getLogger("kfbot")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


class _Stderr(logging.Handler):
    """Writes to `sys.stderr` as it is when a record comes, not when kfbot started: a
    caller that redirects it (pytest, a wrapper) gets the records."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # logging must never stop a command: say so the logging way
            self.handleError(record)


def entry() -> int:
    """The `kfbot` program: `main`, after a protected command has shed its environment."""
    if len(sys.argv) > 1 and sys.argv[1] in PROTECTED:
        from kfbot.evaluate.sandbox.credentials import protect

        protect()
    return main()


if __name__ == "__main__":
    sys.exit(entry())
