"""What a change did to the kernels the scan finds: which changed, and whose reference
pairing broke. How each changed kernel compares with its version at the base, on a
GPU, is `kfbot.evaluate.against_base`.

    paths = changed_paths(root, "HEAD")                  # or the files pre-commit passes
    report = scan(root, load_config(None, root))
    changed = changed_kernels(root, "HEAD", paths, report=report)
    broken = broken_pairings(root, "HEAD", report)       # reference tests that stopped reaching

"Working tree" means the files under `root` as they are on disk; the base is any git
revision (`HEAD`, a pull request's base SHA). The user's working tree, index and
branches are never written: the base is read out of git into a temporary folder
(`base_tree`, for the scan) or a temporary `git worktree` (`base_worktree`, for
builds), removed afterwards.

git runs as a subprocess here rather than through GitPython: the pre-commit hook that
uses this module must start in well under a second, and importing GitPython alone
takes a tenth of one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot import git
from kfbot.config import CONFIG_NAMES, Config, load_config
from kfbot.errors import EXIT_USAGE, KfbotError
from kfbot.scan.files import source_kind
from kfbot.scan.model import BuildRecipe, Kernel, ReferenceTest, ScanReport
from kfbot.scan.scanner import file_facts, scan

_SYMLINK_MODE = "120000"


# --- git ---------------------------------------------------------------------------------


def resolve_base(root: Path, base: str) -> str | None:
    """The commit `base` names, or None when it is HEAD of a repository with no commit yet."""
    top = git.locate(root).top
    sha = git.commit_of(top, base)
    if sha is not None or base == "HEAD":
        return sha
    raise KfbotError(f"{base}: not a commit in {top}", EXIT_USAGE)


def changed_paths(root: Path, base: str = "HEAD") -> list[str]:
    """Files under `root` (relative to it) that differ between `base` and the working
    tree: modified, added, deleted, staged or not, and untracked ones not ignored."""
    sha = resolve_base(root, base)
    listed = ["ls-files", "-z", "--others", "--exclude-standard"]
    if sha is None:
        listed.append("--cached")
        diff = b""
    else:
        diff = git.run(root, "diff", "--name-only", "-z", "--no-renames", "--relative", sha, "--")
    others = git.run(root, *listed)
    names = [n for n in (diff + b"\0" + others).decode(errors="surrogateescape").split("\0") if n]
    return sorted(set(names))


def staged_paths(root: Path, base: str = "HEAD") -> list[str]:
    """Files under `root` (relative to it) whose staged version differs from `base`:
    what the next commit changes, deletions included, which pre-commit never passes to
    a hook."""
    sha = resolve_base(root, base)
    # Without a commit yet, `diff --cached` compares the index with the empty tree.
    against = [sha] if sha is not None else []
    diff = git.run(root, "diff", "--cached", "--name-only", "-z", "--no-renames", "--relative",
                   *against, "--")
    return sorted({n for n in diff.decode(errors="surrogateescape").split("\0") if n})


def given_paths(root: Path, files: Iterable[Path]) -> list[str]:
    """Files named on a command line (relative to the current folder, as pre-commit
    passes them) made relative to `root`; files outside root are left out."""
    root = root.resolve()
    found = []
    for path in files:
        absolute = Path(os.path.abspath(path))
        for candidate in (absolute, absolute.resolve()):
            if candidate.is_relative_to(root):
                found.append(candidate.relative_to(root).as_posix())
                break
    return found


def is_kernel_source(path: str) -> bool:
    """Whether a change to `path` can change what the scan finds: a C++/CUDA or Python
    source, or the kfbot config file."""
    return source_kind(posixpath.basename(path)) is not None or path in CONFIG_NAMES


def base_texts(root: Path, sha: str, paths: Sequence[str]) -> dict[str, bytes | None]:
    """The bytes of each root-relative path at commit `sha`; None where it was not
    there (or was not a file)."""
    repo = git.locate(root)
    names = [f"{sha}:{posixpath.join(repo.prefix, p) if repo.prefix else p}" for p in paths]
    if not paths:
        return {}
    data = git.run(repo.top, "cat-file", "--batch", stdin="\n".join(names).encode() + b"\n")
    found: dict[str, bytes | None] = {}
    offset = 0
    for path in paths:
        header_end = data.index(b"\n", offset)
        header = data[offset:header_end].split()
        offset = header_end + 1
        if len(header) != 3 or header[1] != b"blob":  # missing, or a folder
            found[path] = None
            offset += int(header[2]) + 1 if len(header) == 3 else 0
            continue
        size = int(header[2])
        found[path] = data[offset:offset + size]
        offset += size + 1  # the content is followed by a newline
    return found


# --- the base revision on disk -------------------------------------------------------------


@contextlib.contextmanager
def base_tree(root: Path, sha: str) -> Iterator[Path]:
    """The sources and config of `root` at commit `sha`, in a temporary folder.

    Only what the scan reads is written (see `is_kernel_source`), straight from git's
    object store: no checkout, nothing written to the repository. Yields the folder
    that stands for `root`.
    """
    repo = git.locate(root)
    with tempfile.TemporaryDirectory(prefix="kfbot-base-") as tmp:
        _export(repo, sha, Path(tmp))
        yield Path(tmp)


def _export(repo: git.Place, sha: str, dest: Path) -> None:
    listing = git.run(repo.top, "ls-tree", "-r", "-z", f"{sha}:{repo.prefix}")
    wanted: list[tuple[str, str]] = []  # (blob id, path)
    for entry in filter(None, listing.decode(errors="surrogateescape").split("\0")):
        meta, _, path = entry.partition("\t")
        mode, kind, blob = meta.split(" ")  # "<mode> <type> <object>\t<path>"
        if kind == "blob" and mode != _SYMLINK_MODE and _scanned(path):
            wanted.append((blob, path))
    if not wanted:
        return
    data = git.run(repo.top, "cat-file", "--batch", stdin="\n".join(b for b, _ in wanted).encode())
    offset = 0
    for _, path in wanted:
        header_end = data.index(b"\n", offset)
        size = int(data[offset:header_end].split()[2])
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data[header_end + 1:header_end + 1 + size])
        offset = header_end + 1 + size + 1  # the content is followed by a newline


def _scanned(path: str) -> bool:
    # The scan never enters dot-folders, except to read the config under .github/.
    hidden = any(part.startswith(".") for part in path.split("/")[:-1])
    return is_kernel_source(path) and (not hidden or path in CONFIG_NAMES)


@contextlib.contextmanager
def base_worktree(root: Path, sha: str) -> Iterator[Path]:
    """A full checkout of commit `sha` in a temporary `git worktree`, for builds and tests.

    Yields the folder that stands for `root` inside it; the worktree is removed
    afterwards, whatever happens. The user's checkout is not touched.
    """
    repo = git.locate(root)
    with tempfile.TemporaryDirectory(prefix="kfbot-worktree-") as tmp:
        tree = Path(tmp) / "tree"
        git.run(repo.top, "worktree", "add", "--detach", "--quiet", str(tree), sha)
        try:
            yield tree / repo.prefix
        finally:
            git.run(repo.top, "worktree", "remove", "--force", str(tree))


def scan_base(root: Path, sha: str, config: Config | None = None,
              cache: Path | None = None, jobs: int | None = None) -> ScanReport:
    """The scan of `root` as it was at commit `sha` (with that commit's config unless
    `config` is given). Paths in the report are relative to root, as in any scan;
    `cache` is the scan's facts cache, if any, and `jobs` its worker processes."""
    with base_tree(root, sha) as tree:
        return scan(tree, config or load_config(None, tree), jobs=jobs, cache=cache)


# --- changed kernels -------------------------------------------------------------------------


@dataclass(frozen=True)
class ChangedKernel:
    """A kernel of the working tree, and the changed files that make up its op."""

    kernel: Kernel
    files: tuple[str, ...]  # root-relative: changed, and defining, launching, binding,
    # building or included by the kernel's sources


def changed_kernels(root: Path, base: str = "HEAD", paths: Sequence[str] | None = None,
                    report: ScanReport | None = None,
                    cache: Path | None = None) -> list[ChangedKernel]:
    """The kernels of the working tree under `root` that a change touches.

    `paths` are the changed files relative to `root` (default: `changed_paths(root,
    base)`); `report` is the working tree's scan when the caller has one already, and
    `cache` the scan's facts cache, if any (the includes are read from it).
    A kernel is touched when a changed file defines or launches it, binds or builds
    its op (the bindings, the build script, a source of its extension that defines no
    other kernel), or is a local header that those files include (followed through
    quoted `#include`s).
    Test files are not part of a kernel: `broken_pairings` looks after them.
    """
    changed = set(changed_paths(root, base) if paths is None else paths)
    changed = {p for p in changed if is_kernel_source(p)}
    if not changed:
        return []
    if report is None:
        report = scan(root, load_config(None, root))
    includes = _Includes(Path(report.root), cache)
    owned = {k.id: {k.file, *(s.file for s in k.launch_sites)} for k in report.kernels}
    anyone = set().union(*owned.values())
    found = []
    for kernel in report.kernels:
        own = _kernel_files(kernel, anyone - owned[kernel.id])
        hit = own & changed
        # Only C/C++/CUDA files are ever included: a changed test needs no include walk.
        headers = {p for p in changed - own if source_kind(p) == "cuda"}
        if headers:
            hit |= includes.closure(own, _include_dirs(kernel)) & headers
        if hit:
            found.append(ChangedKernel(kernel, tuple(sorted(hit))))
    return found


def by_op(changed: Sequence[ChangedKernel]) -> list[tuple[ChangedKernel, ...]]:
    """The changed kernels grouped by the op that reaches them, in scan order.

    Kernels built into one extension and reached through the same bindings are one op
    to verify and time (a change that splits softmax_kernel in two, adding
    softmax_short_rows for short rows, changes one op); a kernel kfbot cannot place
    stays on its own.
    """
    groups: dict[object, list[ChangedKernel]] = {}
    for item in changed:
        build = chosen_build(item.kernel)
        names = tuple(sorted({b.name for b in item.kernel.bindings}))
        key = (build.file, build.name, names) if build is not None and names else item.kernel.id
        groups.setdefault(key, []).append(item)
    return [tuple(group) for group in groups.values()]


def chosen_build(kernel: Kernel) -> BuildRecipe | None:
    """The build a task uses: a declared one first (as `make_task` picks it)."""
    declared = [b for b in kernel.builds if b.origin == "declared"]
    chosen = declared or list(kernel.builds)
    return chosen[0] if chosen else None


def _kernel_files(kernel: Kernel, other_kernels: set[str]) -> set[str]:
    """The files that make up a kernel's op. Sources of its extension that define or
    launch only other kernels are left out: editing softmax.cu does not change a matmul
    kernel that is merely linked into the same module."""
    files = {kernel.file, *kernel.editable_files, *(s.file for s in kernel.launch_sites),
             *(b.file for b in kernel.bindings)}
    for build in kernel.builds:
        files |= {build.file, *(s for s in build.sources if s not in other_kernels)}
    return files


def _include_dirs(kernel: Kernel) -> tuple[str, ...]:
    return tuple(d for b in kernel.builds for d in b.include_dirs)


class _Includes:
    """Local headers reached through quoted `#include`s, each file read once (from the
    scan's facts cache when there is one)."""

    def __init__(self, root: Path, cache: Path | None = None) -> None:
        self.root = root
        self.cache = cache
        self.direct: dict[str, tuple[str, ...]] = {}

    def closure(self, files: Iterable[str], include_dirs: Sequence[str]) -> set[str]:
        seen: set[str] = set()
        todo = [f for f in files if source_kind(f) == "cuda"]
        while todo:
            path = todo.pop()
            if path not in seen:
                seen.add(path)
                todo += self._resolved(path, include_dirs)
        return seen

    def _resolved(self, path: str, include_dirs: Sequence[str]) -> list[str]:
        if path not in self.direct:
            try:
                data = (self.root / path).read_bytes() if (self.root / path).is_file() else b""
            except OSError:
                data = b""
            cuda = file_facts(self.root, path, data, self.cache)[0] if data else []
            self.direct[path] = tuple(i for facts in cuda for i in facts.includes)
        found = []
        for spec in self.direct[path]:
            for folder in (posixpath.dirname(path), *include_dirs):
                candidate = posixpath.normpath(posixpath.join(folder, spec))
                if (self.root / candidate).is_file():
                    found.append(candidate)
                    break
        return found


# --- reference pairing ---------------------------------------------------------------------


@dataclass(frozen=True)
class BrokenPairing:
    """A kernel that had a reference test at the base revision and has none now."""

    kernel: Kernel  # as scanned in the working tree
    had: tuple[ReferenceTest, ...]  # its reference tests at the base revision

    def line(self, base: str = "HEAD") -> str:
        was = ", ".join(f"{r.file}:{r.line} {r.test}" for r in self.had)
        return (f"{self.kernel.file}:{self.kernel.definition.line}: "
                f"{self.kernel.definition.qualified_name}: "
                f"no reference test reaches it any more (at {base}: {was})")


def pairing_may_change(root: Path, sha: str, paths: Sequence[str],
                       cache: Path | None = None) -> str | None:
    """Why the change of `paths` may have changed which kernels have reference tests
    since commit `sha`; None when it cannot have: every changed file was there before
    and what the scan reads from it is the same, line numbers aside (a kernel's body, a
    tolerance or a comment changed). `cache` is the scan's facts cache, if any."""
    if any(p in CONFIG_NAMES for p in paths):
        return "the config file changed"
    before = base_texts(root, sha, paths)
    for path in paths:
        old, now = before[path], root / path
        if old is None or not now.is_file():
            return f"{path} was added or deleted"
        data = now.read_bytes()
        if data != old and _shape(file_facts(root, path, data, cache)) != \
                _shape(file_facts(root, path, old, cache)):
            return f"what the scan reads from {path} changed"
    return None


def _shape(value: object) -> object:
    """Facts without what no pairing depends on (see _NOT_PAIRING)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, tuple(
            (f.name, _shape(getattr(value, f.name))) for f in dataclasses.fields(value)
            if f.name not in _NOT_PAIRING))
    if isinstance(value, (list, tuple)):
        return tuple(_shape(v) for v in value)
    return value


# Line numbers move with every edit above them; the words a function uses link it to
# tunables, never to a test. Every other fact is compared, new ones included.
_NOT_PAIRING = frozenset({"line", "line_offset", "uses"})


def broken_pairings(root: Path, base: str, report: ScanReport,
                    base_report: ScanReport | None = None) -> list[BrokenPairing]:
    """Kernels of `report` (the working tree's scan) that had a reference test at `base`
    and have none now: the test was deleted or renamed away, or it no longer reaches
    the kernel (its binding, launcher or build changed). `base_report` is the base's
    scan when the caller has one (see `scan_base`)."""
    if base_report is None:
        sha = resolve_base(root, base)
        if sha is None:
            return []
        base_report = scan_base(root, sha)
    paired = {k.id: k for k in base_report.kernels if k.references}
    return [BrokenPairing(k, paired[k.id].references) for k in report.kernels
            if k.id in paired and not k.references]
