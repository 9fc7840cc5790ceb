"""The Action's scan mode: the kernel table of the checkout, its problems annotated."""

from __future__ import annotations

from pathlib import Path

from kfbot.config import Config
from kfbot.errors import EXIT_FAILURE, EXIT_OK
from kfbot.github.action_io import Annotation, Level, Result
from kfbot.scan.model import ScanReport
from kfbot.scan.scanner import scan
from kfbot.scan.show.render import to_markdown


def scan_result(config: Config, root: Path, only: set[str] | None = None) -> Result:
    """The kernel table of the checkout, problems (in `only` files, if given) annotated."""
    report = scan(root, config)
    count = len(report.kernels)
    headline = f"{count} CUDA kernel{'s' if count != 1 else ''} found" if count else \
        f"no CUDA kernels found ({report.files_scanned} source files scanned)"
    return Result(headline, to_markdown(report), EXIT_OK if count else EXIT_FAILURE,
                  annotations=problem_annotations(report, only))


def problem_annotations(report: ScanReport, only: set[str] | None = None
                        ) -> tuple[Annotation, ...]:
    levels: dict[str, Level] = {"error": "error", "warning": "warning", "info": "notice"}
    return tuple(Annotation(levels[p.severity], p.message, p.file, p.line, "kfbot scan")
                 for p in report.problems if only is None or p.file in only)
