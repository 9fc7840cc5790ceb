"""`kfbot action`: the GitHub Action's entry point. What it does, reading the runner's
environment, is `kfbot.github.action`."""

from __future__ import annotations

import argparse

from kfbot.commands.options import add_repo_argument
from kfbot.evaluate.sandbox import credentials
from kfbot.github.action.run import Action


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "action", help="run as the GitHub Action (reads GITHUB_* and INPUT_* variables)",
        description="The GitHub Action's entry point: reads the event, the INPUT_* "
                    "variables and the runner's GITHUB_* variables; see docs/github-action.md.")
    add_repo_argument(p, default=None,
                      help="the checkout to work on (default: $GITHUB_WORKSPACE, else .)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return Action(credentials.original_environment(), args.repo).run()

