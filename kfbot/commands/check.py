"""`kfbot check [FILES...]`: the light pre-commit hook, without torch or network.

For the changed files (the staged ones with `--staged`, which is how the hook runs,
deletions included; the ones given; or every file changed since the base revision) it
scans the repository, names the kernels the change touches, checks that the changed
code still compiles, and reports every kernel that had a reference test at the base
revision and has none now.

It fails a commit only on evidence: nvcc's own errors (kfbot.commands.compile_check),
a place tree-sitter could read in the committed version and cannot now (for what nvcc
cannot look at: kfbot.commands.syntax_diff), or a lost reference pairing. Everything
else it could not check is a note that names the file and why.

The scans keep each file's facts by content (kfbot.scan.facts_cache), and the base is
scanned only when a changed file may have changed a pairing: a change to a kernel's
body or a test's tolerance needs the working tree's scan alone.

Exit codes (what pre-commit expects: non-zero shows the output and fails the hook):
0 nothing wrong, or nothing to check; 1 a compile error, a syntax error the change
made, or a broken reference pairing; 2 bad usage (not a git repository, an unknown
base revision, a bad config).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot.cache import cache_dir
from kfbot.commands.compile_check import NO_NVCC, TORCH_SECONDS, CompileResult, Compiles, excused
from kfbot.commands.options import add_repo_arguments
from kfbot.commands.syntax_diff import SyntaxFinding, syntax_findings
from kfbot.config import Config, load_config
from kfbot.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, KfbotError
from kfbot.scan.changes import (
    BrokenPairing,
    ChangedKernel,
    base_texts,
    broken_pairings,
    changed_kernels,
    changed_paths,
    given_paths,
    is_kernel_source,
    pairing_may_change,
    resolve_base,
    scan_base,
    staged_paths,
)
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
                                   "touches, checks that they compile (nvcc's front end, or "
                                   "tree-sitter where nvcc cannot run) and fails when a "
                                   "kernel lost its reference test.")
    p.add_argument("files", nargs="*", type=Path,
                   help="changed files (default: every file changed since --base)")
    add_repo_arguments(p)
    p.add_argument("--base", default="HEAD", metavar="REV",
                   help="revision whose reference pairing to compare with")
    p.add_argument("--staged", action="store_true",
                   help="check what is staged for the next commit, deleted files included "
                        "(the pre-commit hook's way; no FILES)")
    p.add_argument("--with-torch", action="store_true",
                   help="compile files that include PyTorch's headers too, with those of the "
                        f"torch installed for this Python (about {TORCH_SECONDS} s a file), "
                        "rather than leave them to tree-sitter")
    p.set_defaults(run=run)


@dataclass(frozen=True)
class Unchecked:
    """A changed file, or some of its lines, that nothing could check, and why."""

    file: str
    why: str

    def text(self) -> str:
        return f"{self.file}: note: {self.why}"


def run(args: argparse.Namespace) -> int:
    root = args.repo.resolve()
    paths = [p for p in _paths(root, args) if is_kernel_source(p)]
    if not paths:
        print("kfbot check: no kernel sources changed")
        return EXIT_OK
    config = load_config(args.config, root)
    facts = cache_dir() / "scan-facts"
    jobs = 1 if warm(facts) else None
    report = scan(root, config, jobs=jobs, cache=facts)
    changed = changed_kernels(root, args.base, paths, report, facts)
    compiles = Compiles(root, to_compile(paths, changed), report.kernels, args.with_torch)
    try:  # the base is read while nvcc runs
        sha = resolve_base(root, args.base)
        broken = _pairings(root, args.base, sha, paths, report,
                           config if args.config else None, facts, jobs)
    finally:
        results = compiles.results()
    cuda = [p for p in paths if source_kind(p) == "cuda"]
    # No commit yet: every file is new, and all it holds is the change's.
    before = base_texts(root, sha, cuda) if sha is not None else dict.fromkeys(cuda)
    results = excused(results, before)
    syntax, unchecked = _syntax(root, paths, results, before, compiles.nvcc is not None)
    _print_kernels(changed, paths)
    _print_compiles(results, syntax, unchecked)
    _print_skipped(results, compiles.nvcc, paths, syntax, unchecked)
    for item in broken:
        print(item.line(args.base))
    failed = broken or syntax or any(r.errors for r in results)
    return EXIT_FAILURE if failed else EXIT_OK


def _paths(root: Path, args: argparse.Namespace) -> list[str]:
    if args.staged and args.files:
        raise KfbotError("--staged checks what is staged: give it no FILES", EXIT_USAGE)
    if args.staged:
        return staged_paths(root, args.base)
    return given_paths(root, args.files) if args.files else changed_paths(root, args.base)


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


def _syntax(root: Path, paths: Sequence[str], results: Sequence[CompileResult],
            before: Mapping[str, bytes | None],
            nvcc: bool) -> tuple[list[SyntaxFinding], list[Unchecked]]:
    """tree-sitter over the changed C/C++/CUDA files nvcc did not parse, and over every
    one when nvcc is not here: the syntax errors the change made (an error nvcc
    reported is not said twice), and what no check could read: changed lines
    tree-sitter could not read before either, files that cannot be read at all."""
    parsed = {r.file for r in results if not r.skipped}
    skipped = {r.file: r.skipped for r in results if r.skipped}
    reported = {(d.file or r.file, d.line) for r in results for d in r.errors}
    files = [p for p in paths if source_kind(p) == "cuda" and (root / p).is_file()
             and p not in parsed and not (nvcc and p.endswith(HEADER_SUFFIXES) and parsed)]
    found: list[SyntaxFinding] = []
    unchecked: list[Unchecked] = []
    for file in files:
        try:
            now = (root / file).read_bytes()
        except OSError as exc:
            unchecked.append(Unchecked(file, f"not checked: it cannot be read ({exc.strerror})"))
            continue
        mine = [f for f in syntax_findings(file, now, before.get(file))
                if (f.file, f.line) not in reported]
        found += [f for f in mine if f.made_by_change]
        note = _blind_spots(file, mine, skipped.get(file))
        if note is not None:
            unchecked.append(note)
    return found, unchecked


def _blind_spots(file: str, findings: Sequence[SyntaxFinding],
                 nvcc_why: str | None) -> Unchecked | None:
    """One note for the places of `file` tree-sitter could not read that are not the
    change's fault, saying why nothing else checked them."""
    blind = sorted({f.line for f in findings if not f.made_by_change})
    if not blind:
        return None
    new = all(f.cause == "new" for f in findings if not f.made_by_change)
    why = nvcc_why or ("nvcc compiles only .cu files" if not file.endswith(".cu") else NO_NVCC)
    lines = ", ".join(map(str, blind[:8])) + (" ..." if len(blind) > 8 else "")
    what = (f"line{'s' if len(blind) > 1 else ''} {lines} of this new file" if new else
            f"changed line{'s' if len(blind) > 1 else ''} {lines}, which it could not read "
            "before the change either")
    return Unchecked(file, f"not checked: tree-sitter cannot read {what}; nvcc did not "
                     f"look ({why})")


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


def _print_compiles(results: Sequence[CompileResult], syntax: Sequence[SyntaxFinding],
                    unchecked: Sequence[Unchecked]) -> None:
    for r in results:
        if not r.skipped and not r.errors:
            how = "nvcc with PyTorch's headers" if r.with_torch else "nvcc front end"
            print(f"{r.file}: compiles ({how}, {r.seconds:.2f} s)")
        for d in r.errors:
            print(f"{d.file or r.file}:{d.line or 0}: error: {d.message}")
    for problem in syntax:
        print(problem.text())
    if syntax:
        print("kfbot check: tree-sitter read those places in the committed version and "
              "cannot now; if the code is valid all the same (its grammar does not know "
              "every form), `kfbot check --with-torch` compiles such files where torch is "
              "installed, and `SKIP=kfbot-check git commit` skips the hook once")
    for item in unchecked:
        print(item.text())


def _print_skipped(results: Sequence[CompileResult], nvcc: str | None, paths: Sequence[str],
                   syntax: Sequence[SyntaxFinding], unchecked: Sequence[Unchecked]) -> None:
    """Why nvcc did not look at some files, once for all of them, and what did instead."""
    instead = "tree-sitter checked the syntax instead"
    if syntax:
        instead += ", and found the errors above"
    elif unchecked:
        instead += ", but for what is noted above"
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
