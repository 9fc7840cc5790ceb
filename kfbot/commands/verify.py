"""`kfbot verify <kernel> [--candidate ...]`: build, and check against the reference."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from kfbot.commands.common import (
    Unready,
    add_kernel_arguments,
    candidate_of,
    kernel_task,
    make_engine,
)
from kfbot.errors import EXIT_FAILURE, EXIT_OK, KfbotError
from kfbot.evaluate import render
from kfbot.evaluate.baseline.machine import environment_step
from kfbot.evaluate.baseline.step_reports import skipped
from kfbot.evaluate.baseline.steps import StepName, StepReport, first_failure
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.task import KernelTask


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("verify", help="check a kernel (and a candidate) against its reference")
    add_kernel_arguments(p)
    p.add_argument("--adequacy", action="store_true",
                   help="also run the repository's test against mutants of the op "
                        "(no work, lower precision, NaN, answers from input statistics or "
                        "a strided subsample, the last call replayed) to see whether it can "
                        "be trusted as a judge")
    p.add_argument("--explain", action="store_true",
                   help="print each step of the original's baseline (environment, pair, "
                        "build, import, capture, reference, comparison) with its outcome, its "
                        "evidence and the kfbot.yaml that would fix a failed one; the "
                        "environment (CUDA torch, driver, nvcc, pytest, the tests' imports) "
                        "is checked first, before any build")
    p.add_argument("--finalist", action="store_true",
                   help="also rebuild a copy of the repository with the candidate its own way "
                        "and run its reference tests (slow)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=args.format != "table")
    try:
        task = kernel_task(args)
    except Unready as unready:  # no build or binding found: known without this machine
        if not args.explain:
            raise
        render.print_steps(unready.steps, console)
        return unready.exit_code
    candidate = candidate_of(args, task)
    if args.explain and not _environment(task, console):
        return EXIT_FAILURE  # nothing after it could get through: said in a second
    with make_engine(task, args.gpu) as engine:
        if args.explain:
            before = engine.prepare_baseline()
            failure = first_failure(before)
            if failure is not None:  # the answer is known; the GPU is not needed for it
                render.print_steps([*before, _not_compared(f"the {failure.step} step failed")],
                                   console)
                return EXIT_FAILURE
            render.print_steps(before, console)
            try:
                base = engine.baseline()
            except KfbotError as exc:  # no GPU here: every step but the last is answered
                render.print_steps([_not_compared(str(exc))], console)
                return exc.exit_code
            render.print_steps(base.steps[len(before):], console)
        else:
            base = engine.baseline()
        results = {"original": base}
        if base.ok and candidate.files:
            results["candidate"] = engine.evaluate(candidate, bench=False)
        final = engine.finalist(candidate) if args.finalist else None
        gate = engine.adequacy() if args.adequacy else None
    _emit(task.kernel_name, results, args.format, console, args.explain)
    if gate is not None:
        console.print(f"test adequacy: {gate.summary()}", highlight=False)
    if final is not None:
        mark = "passed" if final.passed else "FAILED"
        console.print(f"finalist check {mark}: {final.reason} ({final.seconds:.0f} s)",
                      highlight=False)
        if not final.passed:
            console.print(final.output_tail[-3000:], highlight=False, markup=False)
    passed = all(r.ok for r in results.values()) and (final is None or final.passed)
    return EXIT_OK if passed else EXIT_FAILURE


def _not_compared(why: str) -> StepReport:
    return StepReport("comparison", "skipped", f"not run: {why}")


def _environment(task: KernelTask, console: Console) -> bool:
    """The cheap checks first (CUDA torch, driver, nvcc, pytest, the tests' imports),
    before a build that takes a minute; False when one failed."""
    step = environment_step(task)
    render.print_steps([step], console)
    if step.failed:
        later: tuple[StepName, ...] = ("pair", "build", "import", "capture", "reference",
                                       "comparison")
        render.print_steps(skipped("environment", later), console)
    return not step.failed


def _emit(name: str, results: dict[str, Evaluation], fmt: str, console: Console,
          explained: bool) -> None:
    if fmt == "json":
        json.dump({k: render.to_json(name, v) for k, v in results.items()}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    for label, ev in results.items():
        if fmt == "markdown":
            sys.stdout.write(render.to_markdown(f"{name} ({label})", ev))
            continue
        console.print(render.verdict_line(f"{name} ({label})", ev), highlight=False)
        if not explained:
            render.print_failed_step(ev, console)
        render.print_checks(ev, console)
        render.print_findings(ev, console)
        render.print_diagnostics(ev, console)
