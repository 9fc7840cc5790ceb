"""Staging: the files a build reads, with the candidate's edits and the renames applied.

Everything a build compiles is written into a folder named by its content and
compiled from inside it with relative paths, so objects and compiler messages do not
depend on where the copy lives, and diagnostics can name repository files.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kfbot.evaluate.build.layouts.kernel_builder import generated_headers
from kfbot.evaluate.build.model import (
    BuildRequest,
    LineSpan,
    StagedFile,
    StageError,
    Staging,
    clean,
    digest,
    internal_name,
)
from kfbot.evaluate.build.registrations import (
    aliases,
    owned_namespaces,
    parse,
    registers_module,
    rename_registrations,
)
from kfbot.paths import inside
from kfbot.scan import treesitter as tsx
from kfbot.scan.model import BuildRecipe

HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".cuh", ".inc")

INCLUDE_Q = "(preproc_include path: [(string_literal) (system_lib_string)] @path)"


# --- the candidate's view of the repository -------------------------------------------


def normal(path: str) -> str:
    return posixpath.normpath(path.replace(os.sep, "/"))


@dataclass(frozen=True)
class _Tree:
    """The repository with the candidate's files laid over it.

    Paths are repository-relative ('/'-separated), or absolute for files outside it.
    """

    root: Path
    files: Mapping[str, str]

    def canonical(self, path: str) -> str:
        plain = normal(path)
        if not os.path.isabs(path) and plain != ".." and not plain.startswith("../"):
            return plain
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
    """The repository, the candidate's files over it, and what a build tool would have
    written into it (kernel-builder's registration.h)."""
    root = request.root.resolve()
    files = {normal(k): v for k, v in request.files.items()}
    view = _Tree(root, files)
    generated = generated_headers(request.recipe, view.exists)
    return _Tree(root, {**generated, **files}) if generated else view


# --- includes -------------------------------------------------------------------------


def includes(text: str) -> list[tuple[str, bool]]:
    """Every `#include` as (path as written, quoted?), in order."""
    found: list[tuple[str, bool]] = []
    tree = parse(text)
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
            raise StageError(
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
        raise StageError(
            f"load_inline build {request.recipe.name} has no inline sources to build",
            request.recipe.file,
        )
    staged = [inline_main_cpp(request.recipe, cpp)]
    return [*staged, inline_cuda_cu(request.recipe, cuda)] if cuda else staged


# --- staging --------------------------------------------------------------------------


def _include_dirs(tree: _Tree, recipe: BuildRecipe) -> tuple[str, ...]:
    return tuple(dict.fromkeys(tree.canonical(folder) for folder in recipe.include_dirs))


def _repository_sources(request: BuildRequest, tree: _Tree) -> list[StagedFile]:
    staged: list[StagedFile] = []
    for source in request.recipe.sources:
        if source.endswith(HEADER_SUFFIXES):
            continue  # listed with the sources (build.toml does), included, not compiled
        path = tree.canonical(source)
        text = tree.read(path) if tree.inside(path) else None
        if text is None:
            raise StageError(
                f"source {source} of {request.recipe.name} is missing or outside the repository",
                source,
            )
        staged.append(StagedFile(path, text, path))
    if not staged:
        raise StageError(f"build {request.recipe.name} lists no sources", request.recipe.file)
    return staged


def write_stage(directory: Path, files: Mapping[str, StagedFile]) -> None:
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


def _renames(owned: list[str], request: BuildRequest) -> dict[str, str]:
    """Each owned namespace renamed for this build; none for a real-names build."""
    if request.real_names:
        return {}
    suffix = f"_kf{clean(request.tag)}"
    return {ns: ns + suffix for ns in owned}


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
    alias = aliases(local.values(), {**dict(recipe.defines),
                                     "TORCH_EXTENSION_NAME": internal_name(recipe.name)})
    owned = sorted(owned_namespaces(local.values(), alias))
    renames = _renames(owned, request)
    files = {
        path: StagedFile(path, rename_registrations(text, renames, alias), path)
        for path, text in local.items()
    }
    files.update(
        {s.path: replace(s, text=rename_registrations(s.text, renames, alias))
         for s in generated}
    )
    key = digest("stage", sorted((p, s.text) for p, s in files.items()))
    directory = stage_root / key
    write_stage(directory, files)
    python_module = any(registers_module(staged.text) for staged in files.values())
    # The scan may name a namespace by its macro (KFOPS_NAMESPACE, TORCH_EXTENSION_NAME):
    # the worker finds the build's namespace under either name.
    final = {ns: renames.get(ns, ns) for ns in owned}
    named = {**final, **{m: final[ns] for m, ns in alias.items() if ns in final}}
    return Staging(
        directory,
        key,
        tuple(sources),
        files,
        {p: t for p, t in texts.items() if not tree.inside(p)},
        closure,
        folders,
        named,
        python_module,
    )

