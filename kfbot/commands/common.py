"""Shared by the commands that work on one kernel: find it, make its task and engine."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from kfbot import extras
from kfbot.cache import cache_dir
from kfbot.commands.observing import add_observe_arguments, observed, wanted
from kfbot.commands.options import add_format_arguments, add_repo_arguments
from kfbot.config import load_config
from kfbot.errors import KfbotError
from kfbot.evaluate.baseline.steps import StepReport
from kfbot.evaluate.baseline.unready import unready_steps
from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.candidate_files import load_candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.task import KernelTask, TaskError, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search import progress

log = logging.getLogger(__name__)


def add_kernel_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kernel", help="kernel name, ns::name or file::name (as `kfbot scan` "
                                  "lists them)")
    add_repo_arguments(p)
    p.add_argument("--candidate", type=Path, metavar="PATH",
                   help="a folder of changed files (repository paths), a .patch, or one file "
                        "(default: none, the original alone)")
    p.add_argument("--gpu", type=int, default=None, metavar="N",
                   help="GPU index (default: the first)")
    add_format_arguments(p, "print the results as JSON")
    add_observe_arguments(p)


class Unready(KfbotError):
    """No task can be made of the kernel: the baseline's steps say which failed, why,
    and what kfbot.yaml would get past it."""

    def __init__(self, error: TaskError, steps: tuple[StepReport, ...]) -> None:
        super().__init__(str(error), error.exit_code)
        self.steps = steps


def kernel_task(args: argparse.Namespace) -> KernelTask:
    """The task of the kernel named on the command line, once kernels can run here."""
    extras.require("torch", f"kfbot {args.command}")  # the GPU worker runs this interpreter
    root = args.repo.resolve()
    config = load_config(args.config, root)
    report = scan(root, config)
    kernel = select_kernel(report.kernels, args.kernel)
    make = wanted(args.observe, [kernel], root)
    report = observed(root, report, make, args.file_timeout, confirm=[kernel.id])
    kernel = select_kernel(report.kernels, kernel.id)
    try:
        task = make_task(kernel, root, config, report.kernels)
    except TaskError as exc:
        raise Unready(exc, unready_steps(kernel, report, exc)) from exc
    log.info("%s: editable files %s; build %s", task.kernel_id, ", ".join(task.editable_files),
             task.build.kind if task.build is not None else "none found")
    return task


def candidate_of(args: argparse.Namespace, task: KernelTask) -> Candidate:
    if args.candidate is None:
        return ORIGINAL
    return load_candidate(args.candidate, task.root, task.editable_files)


def make_engine(task: KernelTask, gpu: int | None) -> Engine:
    return Engine(task, EngineSettings(cache_dir=cache_dir(), gpu=gpu,
                                       progress=progress.build_heartbeat))
