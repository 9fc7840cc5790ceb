"""`kfbot bench <kernel> [--candidate ...]`: original against candidate, per shape."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from kfbot.commands.common import add_kernel_arguments, candidate_of, kernel_task, make_engine
from kfbot.errors import EXIT_FAILURE, EXIT_OK
from kfbot.evaluate import render
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.evaluation import Evaluation


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="benchmark a candidate against the original, per shape")
    add_kernel_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    task = kernel_task(args)
    candidate = candidate_of(args, task)
    if not candidate.files:
        # No candidate: time the original against a separately built copy of itself,
        # which shows the noise floor of the measurement.
        candidate = Candidate(params={"KFBOT_SELF_COMPARISON": "1"}, origin="user",
                              rationale="the original against itself")
    with make_engine(task, args.gpu) as engine:
        base = engine.baseline()
        result = engine.evaluate(candidate, bench=True) if base.ok else base
    _emit(task.kernel_name, result, args.format)
    return EXIT_OK if result.ok else EXIT_FAILURE


def _emit(name: str, ev: Evaluation, fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(render.to_json(name, ev), indent=1) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(render.to_markdown(name, ev))
    else:
        console = Console()
        console.print(render.verdict_line(name, ev), highlight=False)
        if ev.timings:
            render.print_timings(ev.timings, console)
        if not ev.ok:
            render.print_checks(ev, console)
        render.print_diagnostics(ev, console)
