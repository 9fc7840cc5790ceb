"""`kfbot scan [PATH]`: list every kernel, how it is built, reached and tested."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from kfbot.config import Config, load_config
from kfbot.errors import EXIT_FAILURE, EXIT_OK
from kfbot.scan.explain import explain
from kfbot.scan.model import ScanReport
from kfbot.scan.render import json_text, print_table, to_markdown
from kfbot.scan.scanner import paused_gc, scan
from kfbot.scan.select import select_kernel

# rich is imported only where a table or a progress bar is drawn: a scan piped to a
# file or another program draws neither, and need not pay for importing it.

PROGRESS_MIN_FILES = 500


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("scan", help="find CUDA kernels, their builds, bindings and tests")
    p.add_argument("path", nargs="?", default=".", help="repository folder (default: .)")
    p.add_argument("--config", type=Path, help="config file (default: kfbot.yaml if present)")
    p.add_argument("--kernel", action="append", default=[],
                   help="show only this kernel (name, ns::name or file::name); repeatable")
    p.add_argument("--explain", metavar="KERNEL",
                   help="print how the scan reached this kernel from its tests (each link with "
                        "file:line), or the first link it could not follow and why")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_const", const="json", dest="format",
                     help="print the JSON report (schema: kfbot/schemas/scan-v1.json)")
    fmt.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: cores)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    root = Path(args.path)
    config = load_config(args.config, root)
    # The report is a million small objects that live until the command ends: the
    # cyclic collector would only walk them again and again while it is written.
    with paused_gc():
        report = _scan_with_progress(root, config, args.jobs)
        if args.explain:
            sys.stdout.write(explain(report, select_kernel(report.kernels, args.explain)))
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


def _scan_with_progress(root: Path, config: Config, jobs: int | None) -> ScanReport:
    if not sys.stderr.isatty():
        return scan(root, config, jobs=jobs)
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("scanning", total=None)

        def tick(done: int, total: int) -> None:
            if total >= PROGRESS_MIN_FILES:
                bar.update(task, completed=done, total=total)

        return scan(root, config, progress=tick, jobs=jobs)


def _emit(report: ScanReport, fmt: str) -> None:
    if fmt == "json":
        # One string, one write: json.dump with indent writes in thousands of small pieces.
        sys.stdout.write(json_text(report) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(to_markdown(report))
    else:
        from rich.console import Console

        # A pipe or a file gets a wide table rather than rich's 80-column default.
        wide = sys.stdout.isatty() or "COLUMNS" in os.environ
        print_table(report, Console(width=None if wide else 200))
