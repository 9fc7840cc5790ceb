"""The repository's `kfbot.yaml`: found once, parsed strictly, turned into frozen records.

The strict loader (`kfbot.records`) reports a mistake as `kfbot.yaml:7:
tasks[0].tolerence: unknown key`, never as a stack trace or a silently ignored key; a
new section is just a new dataclass. Values that need more than a type (dtype names,
`module:callable` references, relative paths) are `Annotated` with a `Check`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated, Literal

from kfbot.errors import KfbotError
from kfbot.paths import refuse_link
from kfbot.records import (
    AS_TEXT,
    NOT_YAML,
    SOURCE_LINE,
    Check,
    Loader,
    compose,
    is_null,
    read_text,
    suggest,
)

# Looked for in this order; finding more than one is an error rather than a silent
# pick, because editing the file that is ignored is a confusing way to lose an hour.
CONFIG_NAMES = (
    "kfbot.yaml",
    "kfbot.yml",
    ".kfbot.yaml",
    ".github/kfbot.yaml",
    ".github/kfbot.yml",
)

DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8", "bool")


def _dtype_problem(value: str) -> str | None:
    return None if value in DTYPES else f"unknown dtype {value!r}{suggest(value, DTYPES)}"


_IDENT = r"[^\W\d]\w*"
_DOTTED = rf"{_IDENT}(?:\.{_IDENT})*"
_REF = re.compile(rf"{_DOTTED}:{_DOTTED}")


def _ref_problem(value: str) -> str | None:
    if _REF.fullmatch(value):
        return None
    return f"expected 'module.path:callable', got {value!r}"


def _relpath_problem(value: str) -> str | None:
    posix = PurePosixPath(value.replace("\\", "/"))
    if not value or posix.is_absolute() or PureWindowsPath(value).drive:
        return f"expected a path relative to the repository root, got {value!r}"
    if ".." in posix.parts:
        return f"path must not contain '..', got {value!r}"
    return None


def _non_empty_problem(value: str | tuple[object, ...]) -> str | None:
    return None if value else "must not be empty"


def _positive_problem(value: int) -> str | None:
    return None if value > 0 else f"expected a positive integer, got {value}"


def _tolerance_problem(value: float) -> str | None:
    ok = math.isfinite(value) and value >= 0
    return None if ok else f"expected a finite number >= 0, got {value}"


def _version_problem(value: int) -> str | None:
    return None if value == 1 else f"unsupported version {value} (only version 1 is supported)"


_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def duration_seconds(text: str) -> float:
    """'45m', '2h', '1h30m', '90s' in seconds; a bare number has no unit and is refused
    by the check below."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or not any(match.groups()):
        raise ValueError(f"expected a duration with its unit (90s, 45m, 1h30m), got {text!r}")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600.0 + minutes * 60.0 + seconds


def _duration_problem(value: str) -> str | None:
    try:
        return None if duration_seconds(value) > 0 else "expected a duration above zero"
    except ValueError as exc:
        return str(exc)


Text = Annotated[str, Check(_non_empty_problem)]
Duration = Annotated[str, Check(_duration_problem)]
Dtype = Annotated[str, Check(_dtype_problem)]
CallableRef = Annotated[str, Check(_ref_problem)]
RelPath = Annotated[str, Check(_relpath_problem)]
Shape = Annotated[tuple[Annotated[int, Check(_positive_problem)], ...], Check(_non_empty_problem)]
ToleranceValue = Annotated[float, Check(_tolerance_problem)]


@dataclass(frozen=True)
class Tolerance:
    atol: ToleranceValue
    rtol: ToleranceValue


@dataclass(frozen=True)
class ScanConfig:
    """Which files the scan reads; patterns are relative to the root, see `path_included`."""

    include: tuple[Text, ...] = ()  # empty means everything
    exclude: tuple[Text, ...] = ()  # wins over include


@dataclass(frozen=True)
class RepositoryBuildConfig:
    """The repository's own build (its setup.py or CMake, run by kfbot in a scratch copy
    where kfbot cannot build an extension itself)."""

    timeout: Duration = "60m"  # the build of the original; a candidate's has the same

    @property
    def timeout_s(self) -> float:
        return duration_seconds(self.timeout)


@dataclass(frozen=True)
class BuildConfig:
    """How to build a declared task when discovery cannot tell."""

    # repository: the repository builds itself, with `file` (its setup.py or
    # pyproject.toml); `name`, if given, is the module of the library that holds the
    # kernel (else the library is found by the kernel's symbols). The other kinds need
    # a name.
    kind: Literal["load", "load_inline", "setup_py", "repository"]
    name: Text | None = None
    file: RelPath | None = None
    sources: tuple[str, ...] = ()
    defines: dict[Text, Annotated[str, AS_TEXT]] = field(default_factory=dict)
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    include_dirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskConfig:
    """A kernel the repository declares, with what is needed to test and time it."""

    name: Text
    kernel: str | None = None  # kernel name or "file::name"
    files: tuple[RelPath, ...] = ()  # files the optimiser may edit
    op: CallableRef | None = None  # runs the op
    reference: CallableRef | None = None  # pure-PyTorch reference
    inputs: CallableRef | None = None  # input generator
    shapes: tuple[Shape, ...] = ()
    dtypes: tuple[Dtype, ...] = ()
    tolerances: dict[Dtype, Tolerance] = field(default_factory=dict)
    build: BuildConfig | None = None
    in_place: bool = False
    # Floating-point operations of one call, as a Python expression over the op's
    # positional arguments `args`, e.g. "2 * args[0].shape[0] * args[0].shape[1] *
    # args[1].shape[1]" for a matmul; used to report FLOP/s against the device's peak.
    flops: Text | None = None
    # Where the task starts in the config, so a declared fact can point at its source.
    line: int = field(default=0, compare=False, metadata=SOURCE_LINE)


PERMISSIONS = ("read", "triage", "write", "maintain", "admin")


def _speedup_problem(value: float) -> str | None:
    ok = math.isfinite(value) and value >= 1.0
    return None if ok else f"expected a speedup of at least 1.0, got {value}"


@dataclass(frozen=True)
class GithubConfig:
    """How kfbot behaves on GitHub: pull requests it opens and comment commands it obeys."""

    labels: tuple[Text, ...] = ("kfbot",)  # put on every pull request kfbot opens
    draft: bool = False  # open pull requests as drafts
    max_open_prs: Annotated[int, Check(_positive_problem)] = 5  # kfbot PRs open at once
    base: str | None = None  # branch PRs target; default: the repository's default branch
    # The least repository permission a commenter needs for `/kfbot ...` commands,
    # read from the collaborator-permission endpoint, never from author_association.
    min_permission: Literal["read", "triage", "write", "maintain", "admin"] = "write"
    allow_forks: bool = False  # obey commands on PRs from forks (then only with sha=...)
    min_speedup: Annotated[float, Check(_speedup_problem)] = 1.05  # publish only above this
    # A physics-floor flag (over 10x, or above a measured peak): "draft" opens the pull
    # request as a draft labelled REVIEW_LABEL with the flag first; "block" does not open it.
    review_gate: Literal["draft", "block"] = "draft"


@dataclass(frozen=True)
class Config:
    """The whole file; `Config()` is what a repository without one gets."""

    version: Annotated[int, Check(_version_problem)] = 1
    scan: ScanConfig = field(default_factory=ScanConfig)
    tasks: tuple[TaskConfig, ...] = ()
    github: GithubConfig = field(default_factory=GithubConfig)
    repository_build: RepositoryBuildConfig = field(default_factory=RepositoryBuildConfig)
    # The file it was loaded from, relative to the root when inside it; None for defaults.
    path: str | None = field(default=None, compare=False, metadata=NOT_YAML)


# ---- discovery and loading -------------------------------------------------------------


def find_config(root: Path) -> Path | None:
    """The repository's config file, or None; more than one present is an error."""
    found = [name for name in CONFIG_NAMES if (root / name).is_file()]
    if len(found) > 1:
        names = " and ".join(found)
        raise KfbotError(f"found more than one kfbot config: {names}; keep one")
    return root / found[0] if found else None


def load_config(path: Path | None, root: Path) -> Config:
    """Load `path`, or the discovered config when None; defaults when there is none."""
    if path is None:
        path = find_config(root)
        if path is None:
            return Config()
    shown = _shown_path(path, root)
    # A link could point at a credentials file, whose text a parse error would quote.
    refuse_link(path, "config file", shown)
    node = compose(read_text(path, shown), shown)
    if node is None or is_null(node):
        return Config(path=shown)
    config = Loader(shown).load(node, Config)
    _check_task_names(config, shown)
    return dataclasses.replace(config, path=shown)


def _shown_path(path: Path, root: Path) -> str:
    # abspath rather than resolve: a symlinked config should still show where it sits.
    absolute, base = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    try:
        return absolute.relative_to(base).as_posix()
    except ValueError:
        return str(path)


def _check_task_names(config: Config, shown: str) -> None:
    first_line: dict[str, int] = {}
    for index, task in enumerate(config.tasks):
        if task.name in first_line:
            problem = f"duplicate task name {task.name!r} (first at line {first_line[task.name]})"
            raise KfbotError(f"{shown}:{task.line}: tasks[{index}].name: {problem}")
        first_line[task.name] = task.line


# ---- include / exclude -----------------------------------------------------------------


def path_included(config: ScanConfig, rel_path: str) -> bool:
    """Whether the scan should read `rel_path` (relative to the root, `/`-separated).

    A pattern matches a path or any directory above it, so `third_party/**` and
    `third_party` both cover `third_party/sub/y.cu`. `*` stays inside one path segment;
    `**` as a whole segment matches any number of them. Exclude wins over include.
    """
    parts = _segments(rel_path)
    if any(_covers(pattern, parts) for pattern in config.exclude):
        return False
    return not config.include or any(_covers(pattern, parts) for pattern in config.include)


def _segments(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.replace("\\", "/").split("/") if part not in ("", "."))


def _covers(pattern: str, parts: tuple[str, ...]) -> bool:
    pattern_parts = _segments(pattern)
    return any(_glob(pattern_parts, parts[:n]) for n in range(1, len(parts) + 1))


@functools.lru_cache(maxsize=4096)
def _glob(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_glob(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _glob(rest, parts[1:])
