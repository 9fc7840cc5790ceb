"""The builder's records: what is asked, what is staged and planned, what came out.

Names are part of the records: every build of a recipe compiles its objects with one
TORCH_EXTENSION_NAME (`internal_name`) and exports its own `PyInit_<module_name>`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kfbot.evaluate.model import Diagnostic, KernelResources
from kfbot.scan.model import BuildRecipe, InlineSource

BuildStage = Literal["stage", "compile", "link", "done"]
# How a candidate was built: its kernel alone against the cached host part, or whole.
BuildPath = Literal["fast", "full"]

_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")

# --- requests and results -------------------------------------------------------------


@dataclass(frozen=True)
class BuildRequest:
    recipe: BuildRecipe
    root: Path  # repository root holding the original files
    files: Mapping[str, str] = field(default_factory=dict)  # candidate: rel path -> text
    params: Mapping[str, str] = field(default_factory=dict)  # tunable -> value, as -D
    tag: str = "orig"  # short unique suffix (the candidate hash[:10]) for names
    inline_sources: tuple[InlineSource, ...] = ()  # load_inline: the cuda/cpp texts
    extra_cuda_cflags: tuple[str, ...] = ()  # e.g. ("--use_fast_math",) from a mutator
    # The names the repository's own code uses: its module name and namespaces, not
    # renamed (a build for its tests and scripts, never loaded beside another).
    real_names: bool = False
    # The kernel a candidate optimizes (its bare name): with it, the candidate's build
    # may take the fast path (`fast`); empty for the full build always.
    kernel: str = ""


@dataclass(frozen=True)
class BuildResult:
    ok: bool
    stage: BuildStage  # how far it got
    artifact: Path | None  # the .so
    module_name: str  # the Python import name (PyInit_<module_name> is in the .so)
    library_namespaces: Mapping[str, str]  # TORCH_LIBRARY renames, {"kfln": "kfln_kf<tag>"}
    diagnostics: tuple[Diagnostic, ...]  # errors and warnings (repo files), resources
    resources: tuple[KernelResources, ...]  # ptxas usage of every kernel compiled
    seconds: float
    compiled: int  # objects compiled now
    reused: int  # objects taken from the cache
    key: str  # cache key of the linked artifact
    path: BuildPath = "full"
    # The `PyInit_<init>` the artifact exports, when it is not `module_name`'s: a
    # candidate built by the repository's own build keeps the module's real name.
    init: str = ""


@dataclass(frozen=True)
class LineSpan:
    """A run of lines of a generated file that came from one place in the repository."""

    start: int  # first line in the staged file, 1-based
    count: int
    file: str  # repository file the lines came from
    file_start: int  # its 1-based line of the span's first line


@dataclass(frozen=True)
class StagedFile:
    path: str  # inside the stage folder; the repository path for repository files
    text: str  # as staged: candidate edits and namespace renames applied
    origin: str  # repository file diagnostics should name
    spans: tuple[LineSpan, ...] = ()  # generated files only; empty: lines map one to one
    fallback_line: int | None = None  # for generated lines outside every span

    def locate(self, line: int | None) -> tuple[str, int | None]:
        """The repository file and line a staged line came from."""
        if not self.spans or line is None:
            return self.origin, line
        for span in self.spans:
            if span.start <= line < span.start + span.count:
                return span.file, span.file_start + line - span.start
        return self.origin, self.fallback_line


@dataclass(frozen=True)
class Staging:
    directory: Path
    key: str
    sources: tuple[str, ...]  # translation units, staged paths, in the recipe's order
    files: Mapping[str, StagedFile]  # everything staged, by staged path
    external: Mapping[str, str]  # included headers outside the repository: abs path -> text
    closure: Mapping[str, tuple[str, ...]]  # source -> headers it includes, transitively
    include_dirs: tuple[str, ...]  # stage-relative folders, or absolute outside the repo
    library_namespaces: Mapping[str, str]
    python_module: bool  # some staged file defines PYBIND11_MODULE

    def text(self, path: str) -> str:
        staged = self.files.get(path)
        return staged.text if staged is not None else self.external[path]


@dataclass(frozen=True)
class ObjectPlan:
    source: str  # staged path of the translation unit
    command: tuple[str, ...]  # the compiler call, OUTPUT standing for the object path
    key: str
    cuda: bool


@dataclass(frozen=True)
class CompiledObject:
    """One object file, compiled now or found in the cache, with its compiler output."""

    plan: ObjectPlan
    path: Path
    ok: bool
    reused: bool
    log: str
    returncode: int | None = 0
    seconds: float = 0.0  # compile time; 0 for a reused object
    timeout_s: float = 0.0  # the limit it ran under


@dataclass(frozen=True)
class BuildPlan:
    staging: Staging
    module_name: str  # what Python imports
    internal_name: str  # TORCH_EXTENSION_NAME the objects are compiled with
    objects: tuple[ObjectPlan, ...]
    shim: ObjectPlan | None  # exports PyInit_<module_name>
    cxx: tuple[str, ...]  # the linker driver
    ldflags: tuple[str, ...]  # after the objects, as torch's link rule has them
    dlink: tuple[str, ...]  # nvcc device link command head, empty when not needed
    link_key: str


class StageError(Exception):
    """A candidate that cannot even be staged; reported, never raised to callers."""

    def __init__(self, message: str, file: str | None = None) -> None:
        super().__init__(message)
        self.diagnostic = Diagnostic("build", "stage_error", message, "error", file)



def digest(*parts: object) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def clean(text: str) -> str:
    return _IDENTIFIER.sub("_", text)


def _identifier(name: str) -> str:
    cleaned = clean(name) or "ext"
    return f"_{cleaned}" if cleaned[0].isdigit() else cleaned


def module_name(recipe_name: str, tag: str) -> str:
    """`<name>_kf<tag>`: the last dotted part, as Python looks for PyInit_<that>."""
    return f"{_identifier(recipe_name.rsplit('.', 1)[-1])}_kf{clean(tag)}"


def real_module_name(recipe_name: str) -> str:
    """The name Python finds `PyInit_<name>` by: the last part of the dotted name."""
    return _identifier(recipe_name.rsplit(".", 1)[-1])


def internal_name(recipe_name: str) -> str:
    """The TORCH_EXTENSION_NAME of every build of a recipe.

    Independent of the candidate so that the bindings object is compiled once; a
    small shim object exports each build's own PyInit_<module_name>.
    """
    return f"{_identifier(recipe_name.rsplit('.', 1)[-1])}_kfbot"

