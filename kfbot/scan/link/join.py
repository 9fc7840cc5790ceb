"""Join per-file facts into kernels: launches, builds, bindings, tunables, references.

Names are resolved the way a C++ reader would: a launch of `k` inside namespace
`a::b` looks for `a::b::k`, then `a::k`, then `k` (plus `using namespace`s); when
several files define the same qualified name, the one the launching file can see
(the same file, or a header it includes) wins. Python ops are matched to bindings
by name and, when the test says which module it loaded, by module.
"""

from __future__ import annotations

import posixpath
import re
from collections import defaultdict
from dataclasses import dataclass, field, replace

from kfbot.scan.cuda.facts import extract_cuda_facts
from kfbot.scan.cuda.macros import MacroExpander
from kfbot.scan.link.cpp_graph import CallGraph, lookup_names
from kfbot.scan.model import (
    Binding,
    BuildRecipe,
    CudaFileFacts,
    KernelDef,
    LaunchSite,
    Problem,
    PyFileFacts,
    ReferenceTest,
    evolve,
)


@dataclass
class Linker:
    cuda: list[CudaFileFacts]
    python: list[PyFileFacts]
    problems: list[Problem] = field(default_factory=list)
    inventory: tuple[str, ...] = ()  # every source file of the scan, for build globs
    unfollowed: list[str] = field(default_factory=list)  # see ScanReport.unfollowed
    # pyproject.toml and CMakeLists.txt files beside the scanned sources (their setup.py
    # files are in the inventory): the builds the repository runs itself.
    build_files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.kernels = [k for f in self.cuda for k in f.kernels]
        self.by_qname: dict[str, list[KernelDef]] = defaultdict(list)
        for k in self.kernels:
            self.by_qname[k.qualified_name].append(k)
        self.builds = [self._expanded(b) for f in self.python for b in f.builds]
        self.files = {f.file for f in self.cuda}
        self.includes = _include_graph(self.cuda, self.files)
        self.using = {f.file: f.using_namespaces for f in self.cuda}
        self._builds_by_file: dict[str, list[BuildRecipe]] = defaultdict(list)
        for build in self.builds:
            for f in self._unit(build):
                self._builds_by_file[f].append(build)
        expander = MacroExpander(self.cuda, self.closure, extract_cuda_facts)
        # Launches and calls found inside macro expansions, as facts of the files
        # that invoke the macros.
        self.expanded = expander.facts()
        self.problems += expander.problems
        self.graph = CallGraph([*self.cuda, *self.expanded])
        self.aliases: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for facts in self.cuda:
            for name, value in facts.aliases:
                self.aliases[name].append((facts.file, value))

    # --- files, includes and build units ------------------------------------------

    def _expanded(self, build: BuildRecipe) -> BuildRecipe:
        """The build with the globs among its sources (`csrc/*.cu`) matched against the
        repository's files; a glob that matches nothing is a warning."""
        if not any(_GLOB.search(s) for s in build.sources):
            return build
        sources: list[str] = []
        notes = list(build.cannot_tell)
        for source in build.sources:
            if _GLOB.match(source) is None:
                sources.append(source)
                continue
            pattern = _glob_pattern(source)
            first = min(i for i, c in enumerate(source) if c in "*?[")
            fixed = source[:first].rpartition("/")[0]  # the folder the glob is in
            head = f"{fixed}/" if fixed else ""
            matched = sorted(f for f in self.inventory if f.startswith(head) and pattern.match(f))
            sources += matched
            if not matched:
                message = f"the source glob `{source}` matches no file of the repository"
                self.problems.append(Problem(build.file, build.line, message))
                notes.append(f"{build.file}:{build.line}: {message}")
        return replace(build, sources=tuple(dict.fromkeys(sources)), cannot_tell=tuple(notes))

    def closure(self, file: str) -> set[str]:
        """The file and every header it includes, transitively."""
        seen, stack = {file}, [file]
        while stack:
            for inc in self.includes.get(stack.pop(), ()):
                if inc not in seen:
                    seen.add(inc)
                    stack.append(inc)
        return seen

    def _unit(self, build: BuildRecipe) -> set[str]:
        unit = {build.file} if build.inline else set()
        for src in build.sources:
            unit |= self.closure(src)
        return unit

    def builds_of(self, file: str) -> list[BuildRecipe]:
        return self._builds_by_file.get(file, [])

    def own_build(self, file: str) -> BuildRecipe | None:
        """The build the repository runs itself for a file no read build compiles: the
        setup.py (else pyproject.toml) of the nearest folder above it that has one,
        unless the scan read every extension that setup.py makes (then none holds it)."""
        known = set(self.inventory) | set(self.build_files)
        folder = posixpath.dirname(file)
        while True:
            for name in ("setup.py", "pyproject.toml"):
                path = posixpath.join(folder, name) if folder else name
                if path not in known or not _builds_native(path, known):
                    continue
                return None if self._all_read(path) else _own_recipe(path, file, known)
            if not folder:
                return None
            folder = posixpath.dirname(folder)

    def _all_read(self, setup: str) -> bool:
        """Whether `setup` makes extensions and the scan read each one's name and sources
        (a name or a source computed at run time is kept as written, and is no file)."""
        made = [b for b in self.builds if b.file == setup and b.kind == "setup_py"]
        files = set(self.inventory)
        return bool(made) and all(
            b.name.replace(".", "_").isidentifier() and all(s in files for s in b.sources)
            for b in made)

    def related(self, a: str, b: str) -> bool:
        if a == b or b in self.closure(a) or a in self.closure(b):
            return True
        if _interface_of(b, self.closure(a)) or _interface_of(a, self.closure(b)):
            return True
        units_a, units_b = self.builds_of(a), self.builds_of(b)
        if units_a or units_b:
            return any(u in units_b for u in units_a)
        return posixpath.dirname(a) == posixpath.dirname(b)

    # --- launches -> kernels ----------------------------------------------------------

    def resolve_launch(self, site: LaunchSite) -> list[KernelDef]:
        for group in lookup_names(site.kernel, site.scope, self.using.get(site.file, ())):
            found = [k for qname in group for k in self.by_qname.get(qname, ())]
            if found:
                return self._visible(site, found)
        return []

    def _visible(self, site: LaunchSite, found: list[KernelDef]) -> list[KernelDef]:
        if len(found) == 1:
            return found
        for keep in (
            lambda k: k.file == site.file,
            lambda k: k.file in self.closure(site.file),
            lambda k: self.related(site.file, k.file),
        ):
            chosen = [k for k in found if keep(k)]
            if chosen:
                return chosen
        self.problems.append(Problem(site.file, site.line, f"launch of {site.kernel} matches "
                                     f"{len(found)} kernels in unrelated files; not linked",
                                     "info"))
        return []

    # --- bindings -----------------------------------------------------------------------

    def bound_functions(self, binding: Binding) -> list[str]:
        """The host functions a binding names, resolved: its function and the ones it
        hands to it as template arguments."""
        names = [binding.cpp_function] if binding.cpp_function else []
        return [fn for name in [*names, *binding.reaches]
                for fn in self.graph.resolve(name, "", binding.file)]

    def alias(self, name: str, file: str) -> str | None:
        """What `#define name value` makes `name` in `file` (a namespace macro)."""
        found = self.aliases.get(name, [])
        seen = self.closure(file)
        visible = [v for f, v in found if f in seen] or [v for _, v in found]
        return visible[0] if len(set(visible)) == 1 else None


def _interface_of(source: str, headers: set[str]) -> bool:
    """Whether `headers` hold `source`'s own header (`cuda/fps_cuda.h` of
    `cuda/fps_cuda.cu`): a file that includes it calls what `source` defines."""
    stem = posixpath.splitext(source)[0]
    return any(h != source and posixpath.splitext(h)[0] == stem for h in headers)


def _builds_native(path: str, known: set[str]) -> bool:
    """Whether the build file can compile CUDA: a setup.py can; a pyproject.toml alone
    builds a pure-Python package unless CMake stands beside it (scikit-build)."""
    if posixpath.basename(path) == "setup.py":
        return True
    folder = posixpath.dirname(path)
    return (posixpath.join(folder, "CMakeLists.txt") if folder else "CMakeLists.txt") in known


def _own_recipe(path: str, file: str, known: set[str]) -> BuildRecipe:
    folder = posixpath.dirname(path)
    cmake = posixpath.join(folder, "CMakeLists.txt") if folder else "CMakeLists.txt"
    how = f"{path} runs CMake ({cmake})" if cmake in known else f"{path} builds it"
    note = (f"{path}:1: no extension the scan could read compiles {file}; {how}, and "
            "which library holds the kernel is found after that build")
    return BuildRecipe(kind="repository", name="", file=path, line=1, cannot_tell=(note,))


# A glob among a build's sources; one kept as written (not a static path) is left alone.
_GLOB = re.compile(r"^[^()\s]*[*?\[][^()\s]*$")


def _glob_pattern(glob: str) -> re.Pattern[str]:
    """A glob as `glob.glob(..., recursive=True)` reads it: `*` stays in one folder,
    `**/` crosses any number of them."""
    out = []
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
            continue
        ch = glob[i]
        out.append("[^/]*" if ch == "*" else "[^/]" if ch == "?" else re.escape(ch))
        i += 1
    return re.compile("".join(out) + r"\Z")


def _include_graph(cuda: list[CudaFileFacts], files: set[str]) -> dict[str, list[str]]:
    by_suffix: dict[str, list[str]] = defaultdict(list)
    for f in files:
        parts = f.split("/")
        for i in range(len(parts)):
            by_suffix["/".join(parts[i:])].append(f)
    graph: dict[str, list[str]] = {}
    for facts in cuda:
        graph[facts.file] = [t for inc in facts.includes
                             if (t := _resolve_include(facts.file, inc, files, by_suffix))]
    return graph


def _resolve_include(src: str, inc: str, files: set[str],
                     by_suffix: dict[str, list[str]]) -> str | None:
    local = posixpath.normpath(posixpath.join(posixpath.dirname(src), inc))
    if local in files:
        return local
    candidates = by_suffix.get(posixpath.normpath(inc).lstrip("./"), [])
    return candidates[0] if len(candidates) == 1 else None


def torch_extension_module(binding: Binding, builds: list[BuildRecipe]) -> Binding:
    """pybind11 modules named TORCH_EXTENSION_NAME take the name of the build (several
    builds of the same sources under one name, e.g. by two scripts, are one)."""
    names = {b.name for b in builds}
    if binding.module != "TORCH_EXTENSION_NAME" or len(names) != 1:
        return binding
    return replace(binding, module=names.pop())


def inline_bindings(builds: list[BuildRecipe]) -> list[Binding]:
    """load_inline(functions=[...]) generates one pybind11 def per function."""
    return [Binding(kind="pybind11", name=fn, cpp_function=fn, module=b.name, file=b.file,
                    line=b.line) for b in builds if b.kind == "load_inline" for fn in b.functions]


def module_names(binding: Binding, builds: list[BuildRecipe]) -> set[str]:
    """Every name a Python test might use for the module holding `binding`."""
    names = {binding.module}
    for b in builds:
        names.add(b.name)
        if b.variable:
            names.add(b.variable)
        if b.file.endswith(".py"):  # tests often call the wrapper module that builds it
            names.add(python_module_name(b.file))
    return {n for n in names if n}


def python_module_name(path: str) -> str:
    """`pkg/ops.py` -> "ops"; `pkg/__init__.py` -> "pkg"."""
    stem = posixpath.splitext(path)[0]
    if stem.endswith("/__init__") or stem == "__init__":
        stem = posixpath.dirname(stem)
    return posixpath.basename(stem)


def match_reference(ref: ReferenceTest, candidates: list[tuple[Binding, set[str]]]
                    ) -> list[tuple[Binding, ReferenceTest]]:
    """Pair a reference test with the bindings it calls; by-name-only pairs lose confidence."""
    named = [(b, mods) for b, mods in candidates if b.name == ref.op_name]
    if ref.module_hint is not None:
        exact = [(b, mods) for b, mods in named if ref.module_hint in mods]
        if exact:
            return [(b, ref) for b, _ in exact]
    if not named:
        return []
    weaker = evolve(ref, confidence=round(ref.confidence * 0.7, 2),
                     why=f"{ref.why} (matched by op name only)")
    return [(b, weaker) for b, _ in named]
