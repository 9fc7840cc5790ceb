"""`kfbot check [FILES...]`: the light pre-commit hook, without torch or network.

For the changed files (the ones pre-commit passes, or every file changed since the
base revision when none are given) it scans the repository, names the kernels the
change touches, checks their syntax (nvcc's front end over the changed `.cu` files;
tree-sitter over what nvcc cannot parse here, see kfbot.commands.compile_check) and
reports every kernel that had a reference test at the base revision and has none now.

The scans keep each file's facts by content (kfbot.scan.facts_cache), and the base is
scanned only when a changed file may have changed a pairing: a change to a kernel's
body or a test's tolerance needs the working tree's scan alone.

Exit codes (what pre-commit expects: non-zero shows the output and fails the hook):
0 nothing wrong, or nothing to check; 1 a syntax or compile error or a broken
reference pairing; 2 bad usage (not a git repository, an unknown base revision, a bad
config).
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Sequence
from pathlib import Path

from kfbot.cache import cache_dir
from kfbot.changes import (
    BrokenPairing,
    ChangedKernel,
    base_texts,
    broken_pairings,
    changed_kernels,
    changed_lines,
    changed_paths,
    given_paths,
    is_kernel_source,
    pairing_may_change,
    resolve_base,
    scan_base,
)
from kfbot.commands.compile_check import (
    NO_NVCC,
    CompileResult,
    Compiles,
    SyntaxProblem,
    syntax_check,
)
from kfbot.commands.options import add_repo_arguments
from kfbot.config import Config, load_config
from kfbot.errors import EXIT_FAILURE, EXIT_OK
from kfbot.scan.facts_cache import warm
from kfbot.scan.files import source_kind
from kfbot.scan.model import ScanReport
from kfbot.scan.scanner import scan

log = logging.getLogger(__name__)

HEADER_SUFFIXES = (".cuh", ".h", ".hpp", ".hh", ".hxx", ".inl", ".cuinl")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("check", help="pre-commit: scan and compile-check changed kernels "
                                     "(no torch, no GPU)",
                       description="The light pre-commit hook: names the kernels a change "
                                   "touches, checks their syntax (nvcc's front end, or "
                                   "tree-sitter where nvcc cannot run) and fails when a "
                                   "kernel lost its reference test.")
    p.add_argument("files", nargs="*", type=Path,
                   help="changed files (default: every file changed since --base)")
    add_repo_arguments(p)
    p.add_argument("--base", default="HEAD", metavar="REV",
                   help="revision whose reference pairing to compare with")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    root = args.repo.resolve()
    paths = given_paths(root, args.files) if args.files else changed_paths(root, args.base)
    paths = [p for p in paths if is_kernel_source(p)]
    if not paths:
        print("kfbot check: no kernel sources changed")
        return EXIT_OK
    config = load_config(args.config, root)
    facts = cache_dir() / "scan-facts"
    jobs = 1 if warm(facts) else None
    report = scan(root, config, jobs=jobs, cache=facts)
    changed = changed_kernels(root, args.base, paths, report, facts)
    compiles = Compiles(root, to_compile(paths, changed), report.kernels)
    try:  # the base is read while nvcc runs
        sha = resolve_base(root, args.base)
        broken = _pairings(root, args.base, sha, paths, report,
                           config if args.config else None, facts, jobs)
    finally:
        results = compiles.results()
    syntax = _syntax(root, sha, paths, results, compiles.nvcc is not None)
    _print_kernels(changed, paths)
    _print_compiles(results, syntax)
    _print_skipped(results, compiles.nvcc, paths, syntax)
    for item in broken:
        print(item.line(args.base))
    failed = broken or syntax or any(r.errors for r in results)
    return EXIT_FAILURE if failed else EXIT_OK


def to_compile(paths: Sequence[str], changed: Sequence[ChangedKernel]) -> list[str]:
    """The changed `.cu` files, and those that define or launch a kernel whose changed
    header they include: a header is only ever compiled as part of a `.cu` file."""
    files = [p for p in paths if p.endswith(".cu")]
    for item in changed:
        if any(f.endswith(HEADER_SUFFIXES) for f in item.files):
            k = item.kernel
            files += [f for f in (k.file, *(s.file for s in k.launch_sites)) if f.endswith(".cu")]
    return list(dict.fromkeys(files))


def _pairings(root: Path, base: str, sha: str | None, paths: Sequence[str],
              report: ScanReport, config: Config | None, facts: Path,
              jobs: int | None) -> list[BrokenPairing]:
    if sha is None:
        print(f"kfbot check: {base} has no commit yet: reference pairing not compared")
        return []
    why = pairing_may_change(root, sha, paths, facts)
    if why is None:
        log.info("the base is not scanned: no changed file can change a pairing")
        return []
    log.info("the base is scanned: %s", why)
    return broken_pairings(root, base, report,
                           scan_base(root, sha, config, cache=facts, jobs=jobs))


def _syntax(root: Path, sha: str | None, paths: Sequence[str],
            results: Sequence[CompileResult], nvcc: bool) -> list[SyntaxProblem]:
    """tree-sitter over the changed C/C++/CUDA files nvcc did not parse, and over every
    one when nvcc is not here; an error nvcc reported is not said twice."""
    parsed = {r.file for r in results if not r.skipped}
    reported = {(d.file or r.file, d.line) for r in results for d in r.errors}
    files = [p for p in paths if source_kind(p) == "cuda" and (root / p).is_file()
             and p not in parsed and not (nvcc and p.endswith(HEADER_SUFFIXES) and parsed)]
    # No commit yet: every file is new, and all its errors are the change's.
    before = base_texts(root, sha, files) if sha is not None else dict.fromkeys(files)
    found = []
    for file in files:
        # Asked only of a file the base has, so only when there is a base commit.
        lines = functools.partial(changed_lines, root, sha or "", file)
        found += [e for e in syntax_check(file, (root / file).read_bytes(), before[file], lines)
                  if (e.file, e.line) not in reported]
    return found


def _print_kernels(changed: Sequence[ChangedKernel], paths: Sequence[str]) -> None:
    files = f"{len(paths)} changed file{'s' if len(paths) != 1 else ''}"
    if not changed:
        print(f"kfbot check: no kernel is touched by the {files}")
        return
    print(f"kfbot check: {len(changed)} kernel{'s' if len(changed) != 1 else ''} "
          f"touched by the {files}:")
    for item in changed:
        k = item.kernel
        refs = f"{len(k.references)} reference test{'s' if len(k.references) != 1 else ''}" \
            if k.references else "NO REFERENCE TEST"
        print(f"  {k.definition.qualified_name} ({k.file}:{k.definition.line}; {refs}; changed: "
              f"{', '.join(item.files)})")


def _print_compiles(results: Sequence[CompileResult], syntax: Sequence[SyntaxProblem]) -> None:
    for r in results:
        if not r.skipped and not r.errors:
            print(f"{r.file}: compiles (nvcc front end, {r.seconds:.2f} s)")
        for d in r.errors:
            print(f"{d.file or r.file}:{d.line or 0}: error: {d.message}")
        if r.errors and not any(d.file for d in r.errors):
            print(r.output.strip())  # a failure that names no line: show nvcc's own words
    for problem in syntax:
        print(problem.text())


def _print_skipped(results: Sequence[CompileResult], nvcc: str | None, paths: Sequence[str],
                   syntax: Sequence[SyntaxProblem]) -> None:
    """Why nvcc did not look at some files, once for all of them, and what did instead."""
    instead = "tree-sitter checked the syntax instead" if not syntax else \
        "tree-sitter checked the syntax instead, and found the errors above"
    if nvcc is None:
        if any(source_kind(p) == "cuda" for p in paths):
            print(f"kfbot check: {NO_NVCC}: {instead}")
        return
    by_reason: dict[str, list[str]] = {}
    for r in results:
        if r.skipped:
            by_reason.setdefault(r.skipped, []).append(r.file)
    for reason, files in by_reason.items():
        print(f"kfbot check: nvcc skipped {', '.join(files)}: {reason}; {instead}")
