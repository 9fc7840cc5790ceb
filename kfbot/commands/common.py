"""Shared by the commands that work on one kernel: find it, make its task and engine."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kfbot.config import load_config
from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.candidate_files import load_candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel


def add_kernel_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kernel", help="kernel name, ns::name or file::name")
    p.add_argument("--repo", type=Path, default=Path("."), help="repository folder (default .)")
    p.add_argument("--config", type=Path, help="config file (default: kfbot.yaml if present)")
    p.add_argument("--candidate", type=Path,
                   help="a folder of changed files (repository paths), a .patch, or one file")
    p.add_argument("--gpu", type=int, default=None, help="GPU index (default: the first)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_const", const="json", dest="format")
    fmt.add_argument("--format", choices=("table", "json", "markdown"))
    # On the parser, not the option: the first of two options sharing a dest would
    # set its own default (None), and tables went to stderr.
    p.set_defaults(format="table")


def kernel_task(args: argparse.Namespace) -> KernelTask:
    root = args.repo.resolve()
    config = load_config(args.config, root)
    report = scan(root, config)
    kernel = select_kernel(report.kernels, args.kernel)
    return make_task(kernel, root, config)


def candidate_of(args: argparse.Namespace, task: KernelTask) -> Candidate:
    if args.candidate is None:
        return ORIGINAL
    return load_candidate(args.candidate, task.root, task.editable_files)


def make_engine(task: KernelTask, gpu: int | None) -> Engine:
    return Engine(task, EngineSettings(cache_dir=cache_dir(), gpu=gpu))


def cache_dir() -> Path:
    """Builds and captured inputs live outside the repository: its tree is never written."""
    if "KFBOT_CACHE" in os.environ:
        return Path(os.environ["KFBOT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kfbot"
