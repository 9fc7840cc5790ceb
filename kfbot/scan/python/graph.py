"""Following a test's call through the repository's Python modules to the ops it reaches.

A test calls `fusedact.fused_gelu`; `fusedact/__init__.py` imports it from
`.functional`; there `fused_gelu` calls `._autograd.GeluFunction.apply`, whose
`forward` calls `fusedact._C.gelu_fwd`, and `fusedact._C` is the extension `setup.py`
builds: the op is `gelu_fwd` of module `fusedact._C`. Each step is a `PySymbol` that a
file offers (`modules`); a path ends at an op when it names `torch.ops.<ns>.<op>`,
an attribute of a module the repository builds (a setup.py or load() extension, a
pybind11 module, a kernel-builder package's generated `_ops`), or of a variable holding
such a module.

Modules are found as Python would find them: beside the importing file (a script's
folder, a test folder pytest puts first on the path), from the repository root, or
from the top of a package tree (`src/pkg`, `torch-ext/pkg`). A chain that loops is
reported once and not followed round again; where no op is reached, the first link
that could not be followed is kept, for `scan --explain`.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from kfbot.scan.model import BuildRecipe, Problem, PyFileFacts, PySymbol, Step
from kfbot.scan.python.benchmarks import KERNEL_PACKAGE
from kfbot.scan.python.ops import WELL_KNOWN

MAX_DEPTH = 12  # symbols followed from a test's call


@dataclass(frozen=True)
class Endpoint:
    """An op a path reaches, and the Python steps on the way."""

    module: str  # the build, pybind11 module or torch.ops namespace
    name: str
    steps: tuple[Step, ...]


@dataclass
class Resolution:
    endpoints: list[Endpoint] = field(default_factory=list)
    dead_end: str | None = None  # "file:line: why", the first link not followed
    entered: bool = False  # the path led into the repository's own Python code


def module_index(files: set[str]) -> dict[str, str]:
    """Dotted module name -> file, for every name a file can be imported by: from the
    repository root, and from the top of the package tree holding it."""
    found: dict[str, str] = {}
    for f in sorted(files, key=lambda p: (p.count("/"), p)):
        parts = posixpath.splitext(f)[0].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not parts:
            continue
        top = len(parts) - 1  # the first part of the package tree holding the file
        while top > 0 and "/".join([*parts[:top], "__init__.py"]) in files:
            top -= 1
        for start in (top, 0):
            name = ".".join(parts[start:])
            if name:
                found.setdefault(name, f)
    return found


class PyGraph:
    """The repository's Python modules, and the ops their names reach."""

    def __init__(self, python: list[PyFileFacts], builds: list[BuildRecipe],
                 extensions: set[str], inventory: tuple[str, ...] = ()) -> None:
        # Every Python file, empty ones (a package's bare __init__.py) included.
        self.files = {f.file for f in python} | {f for f in inventory if f.endswith(".py")}
        self.symbols: dict[str, dict[str, PySymbol]] = {
            f.file: {s.name: s for s in f.symbols} for f in python if f.symbols}
        self.modules = module_index(self.files)
        self.names = {file: name for name, file in sorted(self.modules.items(),
                                                          key=lambda kv: -len(kv[0]))}
        self.extensions = extensions
        self.kernel_builder = {b.package_dir: b.name for b in builds
                               if b.kind == "kernel_builder" and b.package_dir}
        self.problems: list[Problem] = []
        self._looped: set[tuple[str, str]] = set()
        self._resolved: dict[tuple[str, str, bool], Resolution] = {}

    def resolve(self, file: str, path: str, line: int, backward: bool = False) -> Resolution:
        """The ops `path`, called in `file` at `line`, reaches (not to be changed).

        Where a path leads depends only on the folder it is called from, and many tests
        of one folder call the same ops: the answer is kept per folder (a dead end at the
        call itself names no place, the caller's place being the call's).
        """
        folder = posixpath.dirname(file)
        if not path.startswith(".") and self._submodule(folder, path.split(".", 1)[0]) is None:
            folder = ""  # nothing beside the file shadows the name: it means the same anywhere
        key = (folder, path, backward)
        found = self._resolved.get(key)
        if found is not None:
            return found
        out = Resolution()
        self._follow(file, path, line, backward, (), out)
        self._resolved[key] = out
        return out

    def _follow(self, file: str, path: str, line: int, backward: bool,
                trail: tuple[tuple[str, str], ...], out: Resolution) -> None:
        if (file, path) in trail:
            self._loop(file, path, line, trail)
            return
        if len(trail) >= MAX_DEPTH:
            return
        trail = (*trail, (file, path))
        parts = path.lstrip(".").split(".") if path.lstrip(".") else []
        if path.startswith("torch.ops.") and len(parts) >= 4:
            out.endpoints.append(Endpoint(parts[2], parts[3], ()))
            return
        where = self._locate(file, path)
        if isinstance(where, str):
            self._dead_end(file, line if len(trail) > 1 else 0, path, where, out)
            return
        if where[0] == "extension":
            module, rest = where[1], where[2]
            if rest:
                out.endpoints.append(Endpoint(module, rest[0], ()))
            return
        self._symbol(where[1], where[2], line, backward, trail, out)

    def _symbol(self, file: str, rest: list[str], line: int, backward: bool,
                trail: tuple[tuple[str, str], ...], out: Resolution) -> None:
        table = self.symbols.get(file, {})
        symbol = table.get(rest[0]) if rest else None
        if symbol is None:
            what = f"`{'.'.join(rest)}`" if rest else "the module itself"
            self._dead_end(file, line, ".".join(rest), f"{what} is not defined in {file}", out)
            return
        out.entered = True
        more = rest[1:]
        if symbol.kind == "class":
            self._method(file, symbol, more, line, backward, trail, out)
        elif symbol.extension is not None:  # an extension, or a factory returning one
            if more:
                out.endpoints.append(Endpoint(symbol.extension, more[0], ()))
        elif symbol.kind in ("import", "variable"):
            for target, at in symbol.targets:
                self._follow(file, ".".join([target, *more]), at or line, backward, trail, out)
        else:
            self._calls(file, symbol, line, backward, trail, out)

    def _method(self, file: str, cls: PySymbol, rest: list[str], line: int, backward: bool,
                trail: tuple[tuple[str, str], ...], out: Resolution) -> None:
        """`C.apply` runs forward (backward, for a gradient check); calling an instance
        runs `__call__`, else `forward` (a torch module)."""
        table = self.symbols.get(file, {})
        method = rest[0] if rest else "__init__"
        if method == "apply":
            names = ["backward"] if backward else ["forward"]
        elif method == "__call__":
            names = ["__call__"] if f"{cls.name}.__call__" in table else ["forward"]
        else:
            names = [method]
        for name in names:
            found = table.get(f"{cls.name}.{name}")
            if found is not None:
                self._calls(file, found, line, backward, trail, out)

    def _calls(self, file: str, fn: PySymbol, line: int, backward: bool,
               trail: tuple[tuple[str, str], ...], out: Resolution) -> None:
        step = Step("python", f"{self._module_name(file)}.{fn.name}", file, fn.line)
        before = len(out.endpoints)
        for target, at in fn.targets:
            self._follow(file, target, at, backward, trail, out)
        out.endpoints[before:] = [Endpoint(e.module, e.name, (step, *e.steps))
                                  for e in out.endpoints[before:]]

    # --- where a path leads ------------------------------------------------------------

    def _locate(self, file: str, path: str) -> tuple[str, str, list[str]] | str:
        """("module", file, rest) or ("extension", module, rest), or why neither."""
        if path.startswith(KERNEL_PACKAGE + "."):
            return self._kernel_package(file, path)
        level = len(path) - len(path.lstrip("."))
        parts = [p for p in path.lstrip(".").split(".") if p]
        if level:
            base = posixpath.dirname(file)
            for _ in range(level - 1):
                base = posixpath.dirname(base)
            return self._relative(base, parts, path)
        if not parts:
            return f"`{path}` names nothing"
        start = self._submodule(posixpath.dirname(file), parts[0]) or \
            self.modules.get(parts[0])  # beside the file, else from the root or a package top
        if start is None:
            return self._extension(parts, path)
        return self._walk(start, parts[1:], path)

    def _kernel_package(self, file: str, path: str) -> tuple[str, str, list[str]] | str:
        """`<kernel>.op`: the package of the kernel-builder recipe above `file`."""
        rest = path[len(KERNEL_PACKAGE) + 1:].split(".")
        above = [d for d in self.kernel_builder
                 if file.startswith(posixpath.dirname(posixpath.dirname(d)) + "/")
                 or posixpath.dirname(posixpath.dirname(d)) == ""]
        for package in above or list(self.kernel_builder):
            init = posixpath.join(package, "__init__.py")
            if init in self.files:
                return self._walk(init, rest, path)
        return f"`{path}`: no kernel-builder package (build.toml) holds the kernel's ops"

    def _relative(self, base: str, parts: list[str], path: str
                  ) -> tuple[str, str, list[str]] | str:
        kb = self.kernel_builder.get(base)
        if kb is not None and parts[:2] == ["_ops", "ops"]:
            return "extension", kb, parts[2:]  # the builder's generated `_ops.ops`
        init = posixpath.join(base, "__init__.py") if base else "__init__.py"
        if init in self.files:
            return self._walk(init, parts, path)
        start = self._submodule(base, parts[0]) if parts else None
        if start is not None:
            return self._walk(start, parts[1:], path)
        return f"`{path}` names no module beside {base or 'the root'}"

    def _walk(self, file: str, parts: list[str], path: str
              ) -> tuple[str, str, list[str]] | str:
        """Attribute access from module `file`, as Python does it: a name its
        `__init__.py` binds first (it hides a submodule of that name), then a submodule;
        in a module, a name it defines. An extension the repository builds whose name
        continues the module's is the last resort."""
        i = 0
        while i < len(parts) and file.endswith("__init__.py") \
                and not self._hides(file, parts[i]):
            sub = self._submodule(posixpath.dirname(file), parts[i])
            if sub is None:
                break
            file, i = sub, i + 1
        rest = parts[i:]
        if rest and not self._hides(file, rest[0]):  # no name of the module's own
            extension = self._extension([*self._module_name(file).split("."), *rest], path)
            if not isinstance(extension, str) or rest[0] in self.symbols.get(file, {}):
                return extension  # `from pkg import _C` in pkg: only the extension
        return "module", file, rest

    def _hides(self, init: str, name: str) -> bool:
        """Whether `name` in package `init` is something other than its submodule
        (`from .scatter import scatter` binds a function; `from . import ops` binds the
        submodule `ops` itself)."""
        symbol = self.symbols.get(init, {}).get(name)
        if symbol is None:
            return False
        own = (f"{self._module_name(init)}.{name}", f".{name}")
        return not (symbol.kind == "import" and any(t in own for t, _ in symbol.targets))

    def _submodule(self, folder: str, name: str) -> str | None:
        stem = posixpath.join(folder, name) if folder else name
        for candidate in (f"{stem}.py", f"{stem}/__init__.py"):
            if candidate in self.files:
                return candidate
        return None

    def _extension(self, parts: list[str], path: str) -> tuple[str, str, list[str]] | str:
        for i in range(len(parts), 0, -1):
            name = ".".join(parts[:i])
            if name in self.extensions:
                return "extension", name, parts[i:]
        return f"`{path}`: module `{parts[0] if parts else path}` is neither a Python file " \
               "of the repository nor an extension it builds"

    def _module_name(self, file: str) -> str:
        return self.names.get(file) or posixpath.splitext(file)[0].replace("/", ".")

    # --- what could not be followed -------------------------------------------------------

    def _dead_end(self, file: str, line: int, path: str, why: str, out: Resolution) -> None:
        head = path.lstrip(".").split(".")[0]
        if out.dead_end is None and (path.startswith(".") or head not in WELL_KNOWN):
            out.dead_end = f"{file}:{line}: {why}" if line else why

    def _loop(self, file: str, path: str, line: int,
              trail: tuple[tuple[str, str], ...]) -> None:
        key = (file, path)
        if key in self._looped:
            return
        self._looped.add(key)
        shown = " -> ".join(p for _, p in trail[-6:])
        self.problems.append(Problem(file, line or None, f"Python calls loop ({shown} -> "
                                     f"{path}); not followed round again"))
