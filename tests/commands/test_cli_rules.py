"""The rules every kfbot command follows, checked over the parser so that a new command
is held to them too: `--repo` and `--verbose` everywhere, help text on every option and
its default said, durations and percentages with a unit, the subcommand's own usage on
a bad option, and one name for each search setting across the CLI, the Action and the
comments."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kfbot.cli import HelpFormatter, build_parser, main
from kfbot.commands.options import duration_argument, percent_argument
from kfbot.config import Config
from kfbot.errors import KfbotError
from kfbot.github.comments import OPTIONS
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

ROOT = Path(__file__).resolve().parents[2]
# Options that hold a length of time: they must be read with a unit.
TIME_LIKE = re.compile(r"time|timeout|duration|seconds|interval|wait")
# Options that hold a share of something: they must be read with a % sign.
SHARE_LIKE = re.compile(r"threshold|percent|share|fraction")


def commands(parser: argparse.ArgumentParser | None = None,
             path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                           argparse.ArgumentParser]]:
    """Every runnable (sub)command, as (words after `kfbot`, its parser)."""
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from commands(child, (*path, name))
    if path and parser.get_default("run") is not None:
        yield path, parser


COMMANDS = dict(commands())


def test_every_command_is_found() -> None:
    assert set(COMMANDS) >= {("scan",), ("verify",), ("bench",), ("optimize",), ("lessons",),
                             ("check",), ("hook", "verify"), ("action",)}


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_takes_repo_and_verbose(path: tuple[str, ...]) -> None:
    options = {s for a in COMMANDS[path]._actions for s in a.option_strings}
    assert {"--repo", "--verbose", "--help"} <= options


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_option_has_help_and_says_its_default(path: tuple[str, ...]) -> None:
    parser = COMMANDS[path]
    formatter = HelpFormatter(prog="kfbot")
    assert parser.description or parser.format_usage(), path
    for action in parser._actions:
        if action.dest == "help":
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help != argparse.SUPPRESS, f"{path}: {name} has no help"
        if action.option_strings and action.default not in (None, False, [],
                                                             argparse.SUPPRESS):
            assert "default" in (formatter._get_help_string(action) or ""), \
                f"{path}: {name} does not say its default"


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_durations_and_shares_need_a_unit(path: tuple[str, ...]) -> None:
    for action in COMMANDS[path]._actions:
        if action.option_strings and TIME_LIKE.search(action.dest):
            assert action.type is duration_argument, f"{path}: {action.dest}"
        if action.option_strings and SHARE_LIKE.search(action.dest):
            assert action.type is percent_argument, f"{path}: {action.dest}"
    with pytest.raises(argparse.ArgumentTypeError, match="needs a unit"):
        duration_argument("30")
    with pytest.raises(argparse.ArgumentTypeError, match="needs a % sign"):
        percent_argument("5")


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_a_bad_option_shows_the_commands_own_usage(path: tuple[str, ...],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    required = [a for a in COMMANDS[path]._actions
                if not a.option_strings and a.nargs in (None, 1) and a.dest != "command"]
    words = [*path, *("x" for _ in required), "--no-such-option"]
    with pytest.raises(SystemExit) as exited:
        main(words)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.startswith(f"usage: kfbot {' '.join(path)} "), err
    assert f"kfbot {' '.join(path)}: error: unrecognized arguments: --no-such-option" in err


def test_search_settings_have_one_name_everywhere() -> None:
    optimize = {s for a in COMMANDS[("optimize",)]._actions for s in a.option_strings}
    inputs = set(yaml.safe_load((ROOT / "action.yml").read_text())["inputs"])
    for name in ("budget", "time", "islands"):
        assert f"--{name}" in optimize and name in inputs and name in OPTIONS["optimize"]
    assert not any("budget-" in o for o in optimize)


def test_scan_takes_the_repository_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(ROOT / "fixtures" / "example")
    assert main(["scan", example, "--json"]) == 0
    by_path = capsys.readouterr().out
    assert main(["scan", "--repo", example, "--json"]) == 0
    assert capsys.readouterr().out == by_path
    assert main(["scan", example, "--repo", str(ROOT)]) == 2
    assert "two repositories given" in capsys.readouterr().err


def test_an_unknown_kernel_lists_the_kernels() -> None:
    kernels = scan(ROOT / "fixtures" / "example", Config()).kernels
    with pytest.raises(KfbotError, match=r"unknown kernel 'zzz'; the kernels are: "
                                         r"matmul_kernel, saxpy_kernel, softmax_kernel$"):
        select_kernel(kernels, "zzz")
