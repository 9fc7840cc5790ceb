"""`kfbot scan [--repo DIR]`: list every kernel, how it is built, reached and tested."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from pathlib import Path

from kfbot import terminal
from kfbot.cache import cache_dir
from kfbot.commands.observing import add_observe_arguments, observed
from kfbot.commands.options import add_config_argument, add_format_arguments, add_repo_argument
from kfbot.config import Config, load_config
from kfbot.errors import EXIT_FAILURE, EXIT_OK, KfbotError
from kfbot.scan.facts_cache import warm
from kfbot.scan.model import ScanReport
from kfbot.scan.scanner import paused_gc, scan
from kfbot.scan.select import select_kernel
from kfbot.scan.show.explain import explain
from kfbot.scan.show.render import print_table, to_markdown, write_json

log = logging.getLogger(__name__)

# rich is imported only where a table or a progress bar is drawn: a scan piped to a
# file or another program draws neither, and need not pay for importing it.

PROGRESS_MIN_FILES = 500
# The facts cache's folder under the kfbot cache: the pre-commit hook's, so that each
# reads back what the other parsed.
FACTS = "scan-facts"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("scan", help="find CUDA kernels, their builds, bindings and tests",
                       description="List every CUDA kernel of a repository: where it is "
                                   "defined and launched, how Python reaches it, how it is "
                                   "built, its tunables and its PyTorch reference tests.")
    p.add_argument("path", nargs="?", type=Path, metavar="PATH",
                   help="the same as --repo, which every command takes")
    add_repo_argument(p, default=None, help="the repository folder (default: .)")
    add_config_argument(p)
    p.add_argument("--kernel", action="append", default=[], metavar="NAME",
                   help="show only this kernel (name, ns::name or file::name); repeatable "
                        "(default: every kernel)")
    add_format_arguments(p, "print the JSON report (schema: kfbot/schemas/scan-v1.json)")
    p.add_argument("--explain", metavar="KERNEL",
                   help="print how the scan reached this kernel from its tests (each link with "
                        "file:line), or the first link it could not follow and why")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes (default: one per core; one when the facts cache "
                        "holds this scan code's facts)")
    add_observe_arguments(p, always=True)
    p.add_argument("--no-cache", action="store_true",
                   help="read every file again rather than reuse the facts kept by content "
                        "under the kfbot cache ($KFBOT_CACHE, else ~/.cache/kfbot)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    root = _root(args.path, args.repo)
    config = load_config(args.config, root)
    # The report is a million small objects that live until the command ends: the
    # cyclic collector would only walk them again and again while it is written.
    with paused_gc():
        started = time.perf_counter()
        facts = None if args.no_cache else cache_dir() / FACTS
        jobs = args.jobs or (1 if facts is not None and warm(facts) else None)
        report = _scan_with_progress(root, config, jobs, facts)
        report = observed(root.resolve(), report, args.observe, args.file_timeout)
        log.info("scanned %d files of %s in %.2f s: %d kernels, %d problems",
                 report.files_scanned, report.root, time.perf_counter() - started,
                 len(report.kernels), len(report.problems))
        if args.explain:
            explained = select_kernel(report.kernels, args.explain)
            sys.stdout.write(explain(report, explained, terminal.width()))
            return EXIT_OK
        if args.kernel:
            chosen = [select_kernel(report.kernels, spec) for spec in args.kernel]
            report = dataclasses.replace(report, kernels=tuple(chosen))
        _emit(report, args.format or "table")
    if not report.kernels:
        print(f"kfbot: no CUDA kernels found under {report.root} "
              f"({report.files_scanned} source files scanned)", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def _root(path: Path | None, repo: Path | None) -> Path:
    """`kfbot scan PATH` is `kfbot scan --repo PATH`; given both, they must agree."""
    if path is not None and repo is not None and path.resolve() != repo.resolve():
        raise KfbotError(f"two repositories given: {path} and --repo {repo}; give one")
    return path or repo or Path(".")


def _scan_with_progress(root: Path, config: Config, jobs: int | None,
                        cache: Path | None) -> ScanReport:
    if not sys.stderr.isatty():
        return scan(root, config, jobs=jobs, cache=cache)
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("scanning", total=None)

        def tick(done: int, total: int) -> None:
            if total >= PROGRESS_MIN_FILES:
                bar.update(task, completed=done, total=total)

        return scan(root, config, progress=tick, jobs=jobs, cache=cache)


def _emit(report: ScanReport, fmt: str) -> None:
    if fmt == "json":
        write_json(report, sys.stdout)
        sys.stdout.write("\n")
    elif fmt == "markdown":
        sys.stdout.write(to_markdown(report))
    else:
        from rich.console import Console

        # A pipe or a file gets a wide table rather than rich's 80-column default.
        wide = sys.stdout.isatty() or "COLUMNS" in os.environ
        print_table(report, Console(width=None if wide else 200))
