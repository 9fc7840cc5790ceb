"""Build an extension the way its repository does, object by object, with a cache.

A candidate usually changes one small `.cu` file, while the bindings `.cpp` that
includes all of torch takes most of the compile time. So the builder does not run
torch's ninja build: it asks torch for the exact flags once, then compiles each
translation unit itself, keyed by everything that can change the object (compiler,
flags, the source and every local header it includes), and links the objects.

Every build happens in a staged copy of the files it needs, with the candidate's
edits applied, compiled from inside that copy with relative paths: objects and
compiler messages then do not depend on where the copy lives, which is what lets
one candidate reuse another's objects, and diagnostics name repository files.

A bad candidate never raises: it yields a `BuildResult` with `ok=False`, the stage
it stopped at and the compiler's diagnostics. Only a missing tool (nvcc, torch, a
C++ compiler) raises `KfbotError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from kfbot.errors import EXIT_MISSING_TOOL, EXIT_USAGE, KfbotError
from kfbot.evaluate import torch_build
from kfbot.evaluate.candidate import NVCC_FLAGS_PARAM, nvcc_flags
from kfbot.evaluate.diagnostics import (
    parse_compiler_output,
    parse_ptxas_resources,
    resource_diagnostics,
)
from kfbot.evaluate.model import Diagnostic, KernelResources
from kfbot.evaluate.sandbox import untrusted_env
from kfbot.paths import inside
from kfbot.scan import treesitter as tsx
from kfbot.scan.model import BuildRecipe, InlineSource

BuildStage = Literal["stage", "compile", "link", "done"]

INCLUDE_Q = "(preproc_include path: [(string_literal) (system_lib_string)] @path)"
MACRO_Q = """(function_definition declarator: (function_declarator
  declarator: (identifier) @macro parameters: (parameter_list . (_) @first))
  body: (compound_statement)
  (#match? @macro "^(PYBIND11_MODULE|TORCH_LIBRARY|TORCH_LIBRARY_IMPL|TORCH_LIBRARY_FRAGMENT)$"))"""
STRING_Q = "(string_literal (string_content) @content)"
# Namespaces that belong to torch: an extension registers kernels into them
# (TORCH_LIBRARY_IMPL(aten, ...)) but never owns them, so they are never renamed.
TORCH_NAMESPACES = frozenset({"_", "aten", "prim", "prims", "quantized", "c10d", "profiler"})
DEFINING_MACROS = frozenset({"TORCH_LIBRARY", "TORCH_LIBRARY_FRAGMENT"})
CUDA_SUFFIXES = (".cu", ".cuh")  # torch's _is_cuda_file
PTXAS_VERBOSE = ("-Xptxas", "-v")  # resource usage of every kernel, in the compile log
OUTPUT = "$out"  # stands for the object path in a planned command
# include_dirs travel through torch's flag writer as absolute paths under this mark,
# and come back as paths relative to the stage folder.
STAGE_MARK = "/__kfbot_stage__"
COMPILE_TIMEOUT_S = 1800.0
LINK_TIMEOUT_S = 600.0
DEFAULT_ARCH = "90"
_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")
_ARCH = re.compile(r"^(?:sm_|compute_)?(?P<major>\d+)(?P<minor>\d)(?P<suffix>[a-z]?)$")
_MISSING_LIB = re.compile(r"cannot find -l(?P<lib>\S+?):?(?:\s|$)")
# One shared tree-sitter parser, and builds stage in parallel threads.
_PARSE_LOCK = threading.Lock()


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


class _StageError(Exception):
    """A candidate that cannot even be staged; reported, never raised to callers."""

    def __init__(self, message: str, file: str | None = None) -> None:
        super().__init__(message)
        self.diagnostic = Diagnostic("build", "stage_error", message, "error", file)


# --- names, architectures, toolkit ----------------------------------------------------


def _clean(text: str) -> str:
    return _IDENTIFIER.sub("_", text)


def _identifier(name: str) -> str:
    clean = _clean(name) or "ext"
    return f"_{clean}" if clean[0].isdigit() else clean


def module_name(recipe_name: str, tag: str) -> str:
    """`<name>_kf<tag>`: the last dotted part, as Python looks for PyInit_<that>."""
    return f"{_identifier(recipe_name.rsplit('.', 1)[-1])}_kf{_clean(tag)}"


def internal_name(recipe_name: str) -> str:
    """The TORCH_EXTENSION_NAME of every build of a recipe.

    Independent of the candidate so that the bindings object is compiled once; a
    small shim object exports each build's own PyInit_<module_name>.
    """
    return f"{_identifier(recipe_name.rsplit('.', 1)[-1])}_kfbot"


def arch_list(arch: str) -> str:
    """A TORCH_CUDA_ARCH_LIST entry: "90" and "sm_90" -> "9.0", "90a" -> "9.0a"."""
    text = arch.strip()
    if re.fullmatch(r"\d+\.\d[a-z]?(\+PTX)?", text):
        return text
    match = _ARCH.match(text)
    if match is None:
        raise KfbotError(
            f"unknown CUDA architecture {arch!r}: expected e.g. 90 or sm_90a", EXIT_USAGE
        )
    return f"{match['major']}.{match['minor']}{match['suffix']}"


def _may_have_gpu() -> bool:
    # Saves a torch import in a child process on machines that have no NVIDIA driver.
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidiactl")


def default_arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST if set, else the visible GPU's, else sm_90."""
    configured = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if configured and configured != "native":
        return configured
    found = torch_build.visible_gpu_arch() if _may_have_gpu() else None
    return arch_list(found or DEFAULT_ARCH)


@dataclass(frozen=True)
class Toolkit:
    nvcc: str
    cuda_home: str


def find_toolkit() -> Toolkit:
    """nvcc from CUDA_HOME / CUDA_PATH, else from PATH; one line when there is none."""
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(variable)
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return Toolkit(os.path.join(home, "bin", "nvcc"), home)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise KfbotError(
            "nvcc not found: put the CUDA toolkit's bin folder on PATH or set CUDA_HOME",
            EXIT_MISSING_TOOL,
        )
    return Toolkit(nvcc, _cuda_home(nvcc))


def _cuda_home(nvcc: str) -> str:
    """The toolkit folder holding include/cuda_runtime.h, also behind wrapper scripts."""
    home = Path(nvcc).resolve().parent.parent
    if (home / "include" / "cuda_runtime.h").exists():
        return str(home)
    try:
        # Lists the steps it would run, starting with its own folder; runs nothing.
        dry = subprocess.run(
            [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return str(home)
    for line in (dry.stdout + dry.stderr).splitlines():
        if line.startswith("#$ _HERE_="):  # nvcc's own bin folder
            return str(Path(line.split("=", 1)[1].strip()).parent)
    return str(home)


def _require_compiler(command: Sequence[str]) -> None:
    if not command or shutil.which(command[0]) is None:
        shown = " ".join(command) or "(none)"
        raise KfbotError(
            f"C++ compiler not found: {shown} (set CXX or install g++)", EXIT_MISSING_TOOL
        )


# --- hashing --------------------------------------------------------------------------


def _digest(*parts: object) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def _resolved(command: Sequence[str]) -> tuple[str, ...]:
    """The programs before the first flag (ccache, the compiler) as the files they run,
    so that another toolkit or compiler is another key."""
    words: list[str] = []
    for word in command:
        if word.startswith("-"):
            break
        found = shutil.which(word)
        words.append(os.path.realpath(found) if found else word)
    return tuple(words)


def object_key(
    command: Sequence[str], source: str, text: str, headers: Iterable[tuple[str, str]]
) -> str:
    """Cache key of one object: what is run, on what, with which local headers."""
    return _digest(
        "object",
        _resolved(command),
        list(command),
        torch_build.torch_version(),
        source,
        text,
        sorted(headers),
    )


# --- the candidate's view of the repository -------------------------------------------


def _normal(path: str) -> str:
    return posixpath.normpath(path.replace(os.sep, "/"))


@dataclass(frozen=True)
class _Tree:
    """The repository with the candidate's files laid over it.

    Paths are repository-relative ('/'-separated), or absolute for files outside it.
    """

    root: Path
    files: Mapping[str, str]

    def canonical(self, path: str) -> str:
        normal = _normal(path)
        if not os.path.isabs(path) and normal != ".." and not normal.startswith("../"):
            return normal
        absolute = Path(os.path.normpath(self.root / path))
        try:
            return absolute.relative_to(self.root).as_posix()
        except ValueError:
            return str(absolute)

    def exists(self, path: str) -> bool:
        return path in self.files or (self.root / path).is_file()

    def read(self, path: str) -> str | None:
        if path in self.files:
            return self.files[path]
        if not self.inside(path):
            return None
        try:
            # Line endings kept; the editable files were checked to be UTF-8 when the task
            # was made, so only files kfbot never commits can lose a byte here.
            return (self.root / path).read_bytes().decode("utf-8", errors="replace")
        except OSError:
            return None

    def inside(self, path: str) -> bool:
        """Relative, and its real path (links followed) stays in the repository."""
        return not os.path.isabs(path) and inside(self.root, self.root / path)


def _tree(request: BuildRequest) -> _Tree:
    root = request.root.resolve()
    return _Tree(root, {_normal(k): v for k, v in request.files.items()})


# --- includes -------------------------------------------------------------------------


def _parse(text: str) -> tsx.Tree:
    with _PARSE_LOCK:
        return tsx.parse_cuda(text.encode("utf-8"))


def includes(text: str) -> list[tuple[str, bool]]:
    """Every `#include` as (path as written, quoted?), in order."""
    found: list[tuple[str, bool]] = []
    tree = _parse(text)
    for match in tsx.matches(INCLUDE_Q, tree.root_node):
        node = match["path"]
        found.append((tsx.text(node)[1:-1].strip(), node.type == "string_literal"))
    return found


def _resolve(
    tree: _Tree, including: str, spec: str, quoted: bool, include_dirs: Sequence[str]
) -> str | None:
    """Where the compiler finds `spec`: next to the includer (quoted only), then -I.

    Headers found nowhere local are system or toolkit headers: not staged, not keyed.
    """
    folders = [posixpath.dirname(including)] if quoted else []
    for folder in [*folders, *include_dirs]:
        candidate = tree.canonical(posixpath.join(folder, spec) if folder else spec)
        if tree.exists(candidate):
            return candidate
    return None


def _closure(
    tree: _Tree, sources: Sequence[str], texts: Mapping[str, str], include_dirs: Sequence[str]
) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Per source, the local headers it includes transitively; and every text read."""
    known = dict(texts)
    direct: dict[str, list[str]] = {}
    closure: dict[str, tuple[str, ...]] = {}
    for source in sources:
        seen: dict[str, None] = {}
        pending = [source]
        while pending:
            path = pending.pop()
            if path not in direct:
                direct[path] = _direct_includes(tree, path, known, include_dirs)
            for header in direct[path]:
                if header not in seen and header != source:
                    seen[header] = None
                    pending.append(header)
        closure[source] = tuple(sorted(seen))
    return closure, known


def _direct_includes(
    tree: _Tree, path: str, known: dict[str, str], include_dirs: Sequence[str]
) -> list[str]:
    if path not in known:
        known[path] = tree.read(path) or ""
    found = (
        _resolve(tree, path, spec, quoted, include_dirs) for spec, quoted in includes(known[path])
    )
    return [header for header in found if header is not None]


# --- load_inline's generated files ----------------------------------------------------


def _pieces_file(
    path: str,
    recipe: BuildRecipe,
    prefix: Sequence[str],
    pieces: Sequence[tuple[str, str, int]],
    suffix: Sequence[str],
) -> StagedFile:
    """Lines joined the way load_inline joins them, remembering where each piece came from.

    `pieces` are (text, repository file, 1-based line of the text's first line).
    """
    texts = [*prefix, *(text for text, _, _ in pieces), *suffix]
    spans: list[LineSpan] = []
    line = 1 + sum(p.count("\n") + 1 for p in prefix)
    for text, file, first in pieces:
        count = text.count("\n") + 1
        spans.append(LineSpan(line, count, file, first))
        line += count
    return StagedFile(path, "\n".join(texts), recipe.file, tuple(spans), recipe.line)


def inline_main_cpp(recipe: BuildRecipe, pieces: Sequence[tuple[str, str, int]]) -> StagedFile:
    """main.cpp as load_inline writes it: torch/extension.h, the C++ sources, bindings."""
    module: list[str] = []
    if recipe.functions:
        module.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        module += [
            f'm.def("{name}", torch::wrap_pybind_function({name}), "{name}");'
            for name in recipe.functions
        ]
        module.append("}")
    return _pieces_file("main.cpp", recipe, ["#include <torch/extension.h>"], pieces, module)


def inline_cuda_cu(recipe: BuildRecipe, pieces: Sequence[tuple[str, str, int]]) -> StagedFile:
    """cuda.cu as load_inline writes it: three includes, then the CUDA sources."""
    prefix = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
    return _pieces_file("cuda.cu", recipe, prefix, pieces, [])


def _inline_pieces(request: BuildRequest, tree: _Tree, language: str) -> list[tuple[str, str, int]]:
    mine = [s for s in request.inline_sources if s.build == request.recipe.name]
    pieces: list[tuple[str, str, int]] = []
    for source in mine or request.inline_sources:
        if source.language != language:
            continue
        if source.text is not None:
            pieces.append((source.text, request.recipe.file, source.line_offset + 1))
            continue
        path = tree.canonical(source.path or "")
        text = tree.read(path) if source.path else None
        if text is None:
            raise _StageError(
                f"inline {language} source {source.path!r} of "
                f"{request.recipe.name} could not be read",
                request.recipe.file,
            )
        pieces.append((text, path, 1))
    return pieces


def _inline_files(request: BuildRequest, tree: _Tree) -> list[StagedFile]:
    cpp = _inline_pieces(request, tree, "cpp")
    cuda = _inline_pieces(request, tree, "cuda")
    if not cpp and not cuda:
        raise _StageError(
            f"load_inline build {request.recipe.name} has no inline sources to build",
            request.recipe.file,
        )
    staged = [inline_main_cpp(request.recipe, cpp)]
    return [*staged, inline_cuda_cu(request.recipe, cuda)] if cuda else staged


# --- registration renames -------------------------------------------------------------


@dataclass(frozen=True)
class _Macro:
    name: str
    argument: str  # the first macro argument as written
    start: int  # its byte offsets
    end: int


def _macros(text: str) -> list[_Macro]:
    if "PYBIND11_MODULE" not in text and "TORCH_LIBRARY" not in text:
        return []  # most files: no parse needed
    tree = _parse(text)
    return [
        _Macro(
            tsx.text(m["macro"]),
            tsx.text(m["first"]).strip(),
            m["first"].start_byte,
            m["first"].end_byte,
        )
        for m in tsx.matches(MACRO_Q, tree.root_node)
    ]


def _owned_namespaces(texts: Iterable[str]) -> set[str]:
    """Namespaces this build defines (and may rename); never torch's own."""
    return {
        macro.argument
        for text in texts
        for macro in _macros(text)
        if macro.name in DEFINING_MACROS and macro.argument not in TORCH_NAMESPACES
    }


def _rename_edits(text: str, renames: Mapping[str, str]) -> list[tuple[int, int, bytes]]:
    edits: list[tuple[int, int, bytes]] = []
    for macro in _macros(text):
        if macro.name == "PYBIND11_MODULE" and macro.argument != "TORCH_EXTENSION_NAME":
            edits.append((macro.start, macro.end, b"TORCH_EXTENSION_NAME"))
        elif macro.name != "PYBIND11_MODULE" and macro.argument in renames:
            edits.append((macro.start, macro.end, renames[macro.argument].encode()))
    if renames and any(f"{old}::" in text for old in renames):
        edits += _qualified_string_edits(text, renames)
    return edits


def _qualified_string_edits(text: str, renames: Mapping[str, str]) -> list[tuple[int, int, bytes]]:
    """C++ strings such as "kfln::layernorm" (schemas, dispatcher look-ups) follow too."""
    edits: list[tuple[int, int, bytes]] = []
    tree = _parse(text)
    for match in tsx.matches(STRING_Q, tree.root_node):
        node = match["content"]
        old, sep, _ = tsx.text(node).partition("::")
        if sep and old in renames:
            edits.append(
                (node.start_byte, node.start_byte + len(old.encode()), renames[old].encode())
            )
    return edits


def rename_registrations(text: str, renames: Mapping[str, str]) -> str:
    """Rewrite TORCH_LIBRARY* namespaces and PYBIND11_MODULE's literal name in place.

    Byte offsets come from tree-sitter, so comments and strings that merely
    mention a namespace are left alone, and line numbers never move.
    """
    edits = _rename_edits(text, renames)
    if not edits:
        return text
    data = text.encode("utf-8")
    for start, end, new in sorted(edits, reverse=True):
        data = data[:start] + new + data[end:]
    return data.decode("utf-8")


# --- staging --------------------------------------------------------------------------


def _include_dirs(tree: _Tree, recipe: BuildRecipe) -> tuple[str, ...]:
    return tuple(dict.fromkeys(tree.canonical(folder) for folder in recipe.include_dirs))


def _repository_sources(request: BuildRequest, tree: _Tree) -> list[StagedFile]:
    staged: list[StagedFile] = []
    for source in request.recipe.sources:
        path = tree.canonical(source)
        text = tree.read(path) if tree.inside(path) else None
        if text is None:
            raise _StageError(
                f"source {source} of {request.recipe.name} is missing or outside the repository",
                source,
            )
        staged.append(StagedFile(path, text, path))
    if not staged:
        raise _StageError(f"build {request.recipe.name} lists no sources", request.recipe.file)
    return staged


def _write_stage(directory: Path, files: Mapping[str, StagedFile]) -> None:
    """Write the stage folder whole, then rename it into place (builds share it)."""
    if directory.is_dir():
        return
    directory.parent.mkdir(parents=True, exist_ok=True)
    scratch = directory.parent / f".{directory.name}.{uuid.uuid4().hex}"
    for path, staged in files.items():
        target = scratch / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(staged.text.encode("utf-8"))
    try:
        os.rename(scratch, directory)
    except OSError:  # another build staged the same content first
        shutil.rmtree(scratch, ignore_errors=True)
        if not directory.is_dir():
            raise


def stage(request: BuildRequest, stage_root: Path) -> Staging:
    """Materialize what the build reads, with the candidate's edits and the renames."""
    tree = _tree(request)
    recipe = request.recipe
    generated = (
        _inline_files(request, tree)
        if recipe.kind == "load_inline"
        else _repository_sources(request, tree)
    )
    folders = _include_dirs(tree, recipe)
    sources = [staged.path for staged in generated]
    closure, texts = _closure(tree, sources, {s.path: s.text for s in generated}, folders)
    local = {path: text for path, text in texts.items() if tree.inside(path)}
    suffix = f"_kf{_clean(request.tag)}"
    renames = {ns: ns + suffix for ns in sorted(_owned_namespaces(local.values()))}
    files = {
        path: StagedFile(path, rename_registrations(text, renames), path)
        for path, text in local.items()
    }
    files.update(
        {s.path: replace(s, text=rename_registrations(s.text, renames)) for s in generated}
    )
    key = _digest("stage", sorted((p, s.text) for p, s in files.items()))
    directory = stage_root / key
    _write_stage(directory, files)
    python_module = any(
        m.name == "PYBIND11_MODULE" for staged in files.values() for m in _macros(staged.text)
    )
    return Staging(
        directory,
        key,
        tuple(sources),
        files,
        {p: t for p, t in texts.items() if not tree.inside(p)},
        closure,
        folders,
        renames,
        python_module,
    )


# --- flags ----------------------------------------------------------------------------


def _defined_names(flags: Sequence[str]) -> set[str]:
    names: set[str] = set()
    for index, flag in enumerate(flags):
        if flag == "-D" and index + 1 < len(flags):
            names.add(flags[index + 1].partition("=")[0])
        elif flag.startswith("-D") and len(flag) > 2:
            names.add(flag[2:].partition("=")[0])
    return names


def _without_defines(flags: Sequence[str], names: Iterable[str]) -> list[str]:
    """`flags` less every -DNAME / -DNAME=V / `-D NAME=V` of the given names."""
    drop = set(names)
    kept: list[str] = []
    skip = False
    for index, flag in enumerate(flags):
        if skip:
            skip = False
            continue
        if flag == "-D" and index + 1 < len(flags) and flags[index + 1].partition("=")[0] in drop:
            skip = True
        elif not (flag.startswith("-D") and flag[2:].partition("=")[0] in drop):
            kept.append(flag)
    return kept


def _define(name: str, value: str) -> str:
    return f"-D{name}={value}" if value != "" else f"-D{name}"


def _recipe_flags(
    recipe: BuildRecipe, extra_cuda: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(cflags, cuda cflags) as the repository passes them.

    setup.py's define_macros reach every compile but are not among the flag lists.
    """
    written = _defined_names([*recipe.extra_cflags, *recipe.extra_cuda_cflags])
    macros = tuple(_define(n, v) for n, v in recipe.defines if n not in written)
    return ((*recipe.extra_cflags, *macros), (*recipe.extra_cuda_cflags, *extra_cuda, *macros))


def _marked(folder: str) -> str:
    if os.path.isabs(folder):
        return folder
    return STAGE_MARK if folder == "." else f"{STAGE_MARK}/{folder}"


def _unmark(flags: Sequence[str]) -> tuple[str, ...]:
    return tuple(flag.replace(f"{STAGE_MARK}/", "").replace(STAGE_MARK, ".") for flag in flags)


def _is_cuda(path: str) -> bool:
    return path.endswith(CUDA_SUFFIXES)


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) is not None


def _params_for(flags: Sequence[str], text: str, params: Mapping[str, str]) -> dict[str, str]:
    """The tunables that can matter to one translation unit.

    A -D for a name that neither its local sources nor its own flags mention
    cannot change the object; leaving it out keeps the torch-heavy bindings
    object cached while a tunable of the kernel file is swept.
    """
    defined = _defined_names(flags)
    return {n: v for n, v in params.items() if n in defined or _mentions(text, n)}


def _command(
    flags: torch_build.TorchFlags, source: str, cuda: bool, params: Mapping[str, str], text: str
) -> tuple[str, ...]:
    """One compile, as torch's ninja rules spell it (less the dependency files)."""
    if cuda:
        head, pre, post = flags.nvcc, flags.cuda_cflags, (*flags.cuda_post_cflags, *PTXAS_VERBOSE)
    else:
        head, pre, post = flags.cxx, flags.cflags, flags.post_cflags
    used = _params_for([*pre, *post], text, params)
    used.pop(NVCC_FLAGS_PARAM, None)
    defines = [_define(name, value) for name, value in sorted(used.items())]
    extra = nvcc_flags(params) if cuda else ()
    return (
        *head,
        *_without_defines(pre, used),
        "-c",
        source,
        "-o",
        OUTPUT,
        *_without_defines(post, used),
        *defines,
        *extra,
    )


def _shim_text(module: str, internal: str) -> str:
    return (
        "// Import hook of this build: forwards to the bindings' own entry point.\n"
        f'extern "C" void* PyInit_{internal}();\n'
        f'extern "C" __attribute__((visibility("default"))) void* PyInit_{module}() '
        f"{{ return PyInit_{internal}(); }}\n"
    )


def _shim_plan(cxx: Sequence[str], module: str, internal: str) -> ObjectPlan:
    command = (*cxx, "-fPIC", "-x", "c++", "-c", "-", "-o", OUTPUT)
    text = _shim_text(module, internal)
    return ObjectPlan("<shim>", command, object_key(command, "<shim>", text, ()), False)


def _ldflags(flags: torch_build.TorchFlags) -> tuple[str, ...]:
    shared = () if "-shared" in flags.ldflags else ("-shared",)
    return (*flags.ldflags, *shared)


# --- running tools --------------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    returncode: int | None  # None: timed out
    output: str
    seconds: float = 0.0


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


def _write_atomic(path: Path, data: bytes) -> None:
    scratch = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    scratch.write_bytes(data)
    os.replace(scratch, path)


def _with_output(command: Sequence[str], output: str) -> list[str]:
    return [output if word == OUTPUT else word for word in command]


# --- the builder ----------------------------------------------------------------------


def _cpu_count() -> int:
    # The cores this process may use (a container's share), not the host's.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


class Builder:
    """Builds recipes and candidates; one instance is shared by every build of a run."""

    def __init__(self, cache_dir: Path, arch: str | None = None, jobs: int | None = None) -> None:
        self.toolkit = find_toolkit()
        torch_build.require_torch()
        self.cache_dir = Path(cache_dir).resolve()
        self.arch_list = arch_list(arch) if arch else default_arch_list()
        self.arch = arch or self.arch_list
        self.jobs = max(1, jobs or _cpu_count())
        self._slots = threading.BoundedSemaphore(self.jobs)  # compiler processes, all builds
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        for folder in ("stage", "objects", "artifacts"):
            (self.cache_dir / folder).mkdir(parents=True, exist_ok=True)

    # planning

    def stage(self, request: BuildRequest) -> Staging:
        """Stage `request`'s files (exposed for tests and for the search's reports)."""
        return stage(request, self.cache_dir / "stage")

    def flags(self, request: BuildRequest, staging: Staging) -> torch_build.TorchFlags:
        """torch's flags for this recipe, with include folders relative to the stage."""
        recipe = request.recipe
        cflags, cuda_cflags = _recipe_flags(recipe, request.extra_cuda_cflags)
        with_cuda = any(map(_is_cuda, staging.sources)) or bool(recipe.extra_cuda_cflags)
        asked = torch_build.FlagRequest(
            internal_name(recipe.name),
            cflags,
            cuda_cflags,
            tuple(_marked(folder) for folder in staging.include_dirs),
            with_cuda,
            self.arch_list,
            self.toolkit.cuda_home,
        )
        found = torch_build.torch_flags(asked)
        _require_compiler(found.cxx)
        return torch_build.TorchFlags(
            *(_unmark(getattr(found, f.name)) for f in fields(torch_build.TorchFlags))
        )

    def plan(self, request: BuildRequest) -> BuildPlan:
        """Stage, then name every object and the artifact by its cache key; nothing runs."""
        staging = self.stage(request)
        flags = self.flags(request, staging)
        objects = tuple(
            self._object_plan(flags, staging, source, request.params) for source in staging.sources
        )
        module = module_name(request.recipe.name, request.tag)
        internal = internal_name(request.recipe.name)
        shim = (
            _shim_plan(flags.cxx, module, internal)
            if staging.python_module and module != internal
            else None
        )
        dlink = (*flags.nvcc, *flags.cuda_dlink_post_cflags) if flags.cuda_dlink_post_cflags else ()
        ldflags = _ldflags(flags)
        keys = [o.key for o in objects] + ([shim.key] if shim else [])
        link_key = _digest("link", keys, _resolved(flags.cxx), flags.cxx, ldflags, dlink, module)
        return BuildPlan(
            staging, module, internal, objects, shim, flags.cxx, ldflags, dlink, link_key
        )

    def _object_plan(
        self,
        flags: torch_build.TorchFlags,
        staging: Staging,
        source: str,
        params: Mapping[str, str],
    ) -> ObjectPlan:
        headers = [(h, staging.text(h)) for h in staging.closure[source]]
        everything = "\n".join([staging.text(source), *(text for _, text in headers)])
        cuda = _is_cuda(source) and bool(flags.nvcc)
        command = _command(flags, source, cuda, params, everything)
        return ObjectPlan(
            source, command, object_key(command, source, staging.text(source), headers), cuda
        )

    # building

    def build(self, request: BuildRequest) -> BuildResult:
        """Build one request; a bad candidate is a result with `ok=False`, never raised."""
        started = time.monotonic()
        try:
            plan = self.plan(request)
        except _StageError as problem:
            return BuildResult(
                ok=False,
                stage="stage",
                artifact=None,
                module_name=module_name(request.recipe.name, request.tag),
                library_namespaces={},
                diagnostics=(problem.diagnostic,),
                resources=(),
                seconds=time.monotonic() - started,
                compiled=0,
                reused=0,
                key="",
            )
        return self._build_planned(plan, started)

    def build_many(self, requests: Sequence[BuildRequest]) -> list[BuildResult]:
        """Build in parallel (compiles still share the `jobs` slots); results in order."""
        if not requests:
            return []
        workers = min(len(requests), 2 * self.jobs + 2)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kfbot-build") as pool:
            return list(pool.map(self.build, requests))

    def _build_planned(self, plan: BuildPlan, started: float) -> BuildResult:
        objects = self._compile_all(plan)
        diagnostics, resources = self._object_findings(plan, objects)
        stage: BuildStage = "compile"
        artifact: Path | None = None
        if all(o.ok for o in objects):
            artifact, linked = self._link(plan, objects)
            diagnostics += linked
            stage = "link" if artifact is None else "done"
        compiled = sum(not o.reused for o in objects)
        return BuildResult(
            ok=artifact is not None,
            stage=stage,
            artifact=artifact,
            module_name=plan.module_name,
            library_namespaces=dict(plan.staging.library_namespaces),
            diagnostics=tuple(diagnostics),
            resources=tuple(resources),
            seconds=time.monotonic() - started,
            compiled=compiled,
            reused=len(objects) - compiled,
            key=plan.link_key,
        )

    def _compile_all(self, plan: BuildPlan) -> list[CompiledObject]:
        if len(plan.objects) == 1:
            return [self._compile(plan.staging.directory, plan.objects[0])]
        with ThreadPoolExecutor(max_workers=len(plan.objects)) as pool:
            return list(pool.map(lambda o: self._compile(plan.staging.directory, o), plan.objects))

    def _object_findings(
        self, plan: BuildPlan, objects: Sequence[CompiledObject]
    ) -> tuple[list[Diagnostic], list[KernelResources]]:
        diagnostics: list[Diagnostic] = []
        resources: list[KernelResources] = []
        for item in objects:
            diagnostics += self._compile_diagnostics(plan.staging, item)
            resources += parse_ptxas_resources(item.log)
        resources = list(dict.fromkeys(resources))
        return [*diagnostics, *resource_diagnostics(resources)], resources

    def _compile_diagnostics(self, staging: Staging, item: CompiledObject) -> list[Diagnostic]:
        found = [
            self._to_repository(d, staging)
            for d in parse_compiler_output(item.log, root=str(staging.directory))
        ]
        if item.ok or any(d.severity == "error" for d in found):
            return found
        origin, _ = staging.files[item.plan.source].locate(None)
        if item.returncode is None:
            message = f"compiling {origin} took longer than {COMPILE_TIMEOUT_S:.0f} s"
            return [*found, Diagnostic("build", "compile_timeout", message, "error", origin)]
        last = next((line for line in reversed(item.log.splitlines()) if line.strip()), "")
        message = f"compiling {origin} failed (exit {item.returncode}): {last.strip()}"
        return [*found, Diagnostic("build", "compile_error", message.rstrip(": "), "error", origin)]

    def _to_repository(self, diagnostic: Diagnostic, staging: Staging) -> Diagnostic:
        """Staged paths (of this or any other stage folder) back to repository paths."""
        if diagnostic.file is None:
            return diagnostic
        path = _normal(diagnostic.file)
        stage_root = str(self.cache_dir / "stage") + "/"
        if path.startswith(stage_root):
            path = path[len(stage_root) :].partition("/")[2]
        staged = staging.files.get(path)
        if staged is None:
            return replace(diagnostic, file=path)
        file, line = staged.locate(diagnostic.line)
        return replace(diagnostic, file=file, line=line)

    # compiling and linking

    @contextmanager
    def _exclusive(self, key: str) -> Iterator[None]:
        """One thread per cache entry: the second waits, then finds it built."""
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            yield

    def _run(
        self, command: Sequence[str], cwd: Path, timeout: float, stdin: str | None = None
    ) -> _Run:
        with self._slots:
            started = time.monotonic()
            try:
                done = subprocess.run(
                    list(command),
                    cwd=cwd,
                    env=untrusted_env(),  # a candidate can #include what it sees
                    input=stdin,
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    errors="replace",
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired as expired:
                output = expired.output
                text = output.decode(errors="replace") if isinstance(output, bytes) else ""
                return _Run(None, text or "", time.monotonic() - started)
            except OSError as exc:
                return _Run(127, f"{command[0]}: {exc}")
        return _Run(done.returncode, done.stdout or "", time.monotonic() - started)

    def compile_object(self, plan: BuildPlan, obj: ObjectPlan) -> CompiledObject:
        """Compile (or find in the cache) one object of `plan`, outside a whole build."""
        return self._compile(plan.staging.directory, obj)

    def _compile(
        self, directory: Path, plan: ObjectPlan, stdin: str | None = None
    ) -> CompiledObject:
        target = self.cache_dir / "objects" / f"{plan.key}.o"
        log = target.with_suffix(".log")
        with self._exclusive(plan.key):
            if target.exists():
                text = log.read_text(errors="replace") if log.exists() else ""
                return CompiledObject(plan, target, True, True, text)
            scratch = target.with_name(f".{plan.key}.{uuid.uuid4().hex}.o")
            run = self._run(
                _with_output(plan.command, str(scratch)), directory, COMPILE_TIMEOUT_S, stdin
            )
            ok = run.returncode == 0 and scratch.exists()
            if ok:
                _write_atomic(log, run.output.encode("utf-8"))
                os.replace(scratch, target)
            else:
                scratch.unlink(missing_ok=True)
            return CompiledObject(plan, target, ok, False, run.output, run.returncode, run.seconds)

    def _link(
        self, plan: BuildPlan, objects: Sequence[CompiledObject]
    ) -> tuple[Path | None, list[Diagnostic]]:
        folder = self.cache_dir / "artifacts" / plan.link_key
        target = folder / f"{plan.module_name}.so"
        with self._exclusive(plan.link_key):
            if target.exists():
                return target, []
            inputs = [str(o.path) for o in objects]
            if plan.shim is not None:
                shim = self._compile(
                    folder.parent, plan.shim, _shim_text(plan.module_name, plan.internal_name)
                )
                if not shim.ok:
                    return None, self._link_diagnostics(shim.log) or [
                        _link_failure(_Run(shim.returncode, shim.log))
                    ]
                inputs.append(str(shim.path))
            folder.mkdir(parents=True, exist_ok=True)
            if plan.dlink:
                device = self._device_link(plan, folder, [o for o in objects if o.plan.cuda])
                if isinstance(device, list):
                    return None, device
                inputs.append(str(device))
            return self._link_run(plan, folder, target, inputs)

    def _device_link(
        self, plan: BuildPlan, folder: Path, objects: Sequence[CompiledObject]
    ) -> Path | list[Diagnostic]:
        target = folder / "dlink.o"
        head, flags = plan.dlink[:1], plan.dlink[1:]
        run = self._run(
            [*head, *(str(o.path) for o in objects), "-o", str(target), *flags],
            folder,
            LINK_TIMEOUT_S,
        )
        return target if run.returncode == 0 else self._link_diagnostics(run.output)

    def _link_run(
        self, plan: BuildPlan, folder: Path, target: Path, inputs: Sequence[str]
    ) -> tuple[Path | None, list[Diagnostic]]:
        scratch = folder / f".{plan.module_name}.{uuid.uuid4().hex}.so"
        command = [*plan.cxx, *inputs, *plan.ldflags, "-o", str(scratch)]
        run = self._run(command, folder, LINK_TIMEOUT_S)
        found = self._link_diagnostics(run.output)
        if run.returncode != 0 or not scratch.exists():
            scratch.unlink(missing_ok=True)
            return None, found or [_link_failure(run)]
        os.replace(scratch, target)
        return target, found

    def _link_diagnostics(self, output: str) -> list[Diagnostic]:
        return [_explain_link(d) for d in parse_compiler_output(output)]


def _link_failure(run: _Run) -> Diagnostic:
    last = next((line for line in reversed(run.output.splitlines()) if line.strip()), "")
    why = "timed out" if run.returncode is None else f"exit {run.returncode}"
    return Diagnostic("build", "link_error", f"linking failed ({why}): {last.strip()}".rstrip(": "))


def _explain_link(diagnostic: Diagnostic) -> Diagnostic:
    """Say what a missing library means: usually a CPU-only torch or a partial toolkit."""
    match = _MISSING_LIB.search(diagnostic.message)
    if match is None:
        return diagnostic
    library = match["lib"]
    if library in ("torch_cuda", "c10_cuda") and not torch_build.has_cuda_libraries():
        why = (
            "this torch has no CUDA libraries (a CPU-only build); install a CUDA build of "
            "PyTorch to link CUDA extensions"
        )
    elif library == "cudart":
        why = "the CUDA runtime library is missing from the toolkit's lib64 folder"
    else:
        return diagnostic
    return replace(
        diagnostic,
        message=f"cannot find -l{library}: {why}",
        details=(*diagnostic.details, ("library", library)),
    )
