"""The repository's modules as kfbot built them, importable under their real names.

A repository's tests import its extension the way its users do (`import fused_ops`,
`from pkg import _C`), but nothing installed it, and kfbot never installs into the
user's environment or writes into their checkout. So the processes that run the
repository's code get a `sys.meta_path` finder that answers for those names:

- `extension`: a built `.so`, loaded under the real name. `init` names the
  `PyInit_<init>` entry point it exports, when that differs from the name's last part
  (a build tagged for one candidate);
- `source`: a module whose text kfbot wrote (kernel-builder's generated `_ops.py`);
- `package`: a folder of the repository imported as a package of that name (a
  kernel-builder `torch-ext/<name>/`, which is not on any import path).

The parent process describes them (`encode`); the child installs the finder
(`install_from_environment`) before any of the repository's code runs. The finder
comes first on `sys.meta_path`, ahead of a stale build lying in the checkout.

The capture's recorder hooks the same imports from the other side: `PostImportFinder`
lets the other finders (this one included) find the modules it watches, and hears
each one once it has run, so that its ops are wrapped before a test calls them. Every
`sys.meta_path` hook kfbot puts into the repository's processes is in this module.

This module imports neither torch nor pytest.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal, cast

STAGED_ENV = "KFBOT_STAGED"

Kind = Literal["extension", "source", "package"]


@dataclass(frozen=True)
class StagedModule:
    name: str  # the dotted name the repository imports
    kind: Kind
    path: str = ""  # the .so (extension), the folder (package), the origin (source)
    init: str = ""  # extension: PyInit_<init>, when not the name's last part
    source: str = ""  # source: the module's text

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "kind": self.kind, "path": self.path, "init": self.init,
                "source": self.source}

    @staticmethod
    def from_json(data: Mapping[str, str]) -> StagedModule:
        kind = data["kind"]
        if kind not in ("extension", "source", "package"):
            raise ValueError(f"unknown staged module kind {kind!r}")
        return StagedModule(data["name"], cast(Kind, kind), data.get("path", ""),
                            data.get("init", ""), data.get("source", ""))


def encode(modules: Sequence[StagedModule]) -> str:
    return json.dumps([m.to_json() for m in modules])


_CURRENT: list[StagedFinder] = []  # the finder this process installed, if any


def current_finder() -> StagedFinder | None:
    return _CURRENT[0] if _CURRENT else None


def install_from_environment(
    on_load: Callable[[ModuleType | None], None] | None = None,
) -> StagedFinder | None:
    """The finder for what the parent staged in `KFBOT_STAGED`, first on the meta path."""
    text = os.environ.get(STAGED_ENV)
    if not text:
        return None
    finder = StagedFinder([StagedModule.from_json(m) for m in json.loads(text)], on_load)
    sys.meta_path.insert(0, finder)
    _CURRENT[:] = [finder]
    return finder


class StagedFinder(importlib.abc.MetaPathFinder):
    def __init__(
        self,
        modules: Sequence[StagedModule],
        on_load: Callable[[ModuleType | None], None] | None = None,
    ) -> None:
        self._modules = {m.name: m for m in modules}
        self.on_load = on_load  # e.g. capture: an extension may have registered ops

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._modules)

    def load(self, name: str, python_module: bool = True) -> ModuleType | None:
        """What `torch.utils.cpp_extension.load(name=...)` returns for a staged build:
        the module, or None after loading a library that only registers ops."""
        if python_module:
            return importlib.import_module(name)
        import torch  # the repository's code is calling torch's loader: torch is here

        torch.ops.load_library(self._modules[name].path)  # type: ignore[no-untyped-call]
        self._loaded(None)
        return None

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        staged = self._modules.get(fullname)
        if staged is None:
            return None
        if staged.kind == "package":
            folder = Path(staged.path)
            return importlib.util.spec_from_file_location(
                fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
            )
        if staged.kind == "source":
            loader = _SourceLoader(staged.source, staged.path or f"<kfbot: {fullname}>")
            return importlib.util.spec_from_loader(fullname, loader, origin=staged.path or None)
        init = staged.init or fullname.rpartition(".")[2]
        extension = _ExtensionLoader(init, staged.path, self._loaded)
        return importlib.util.spec_from_file_location(fullname, staged.path, loader=extension)

    def _loaded(self, module: ModuleType | None) -> None:
        if self.on_load is not None:
            self.on_load(module)


class _SourceLoader(importlib.abc.Loader):
    def __init__(self, source: str, origin: str) -> None:
        self._source = source
        self._origin = origin

    def exec_module(self, module: ModuleType) -> None:
        code = compile(self._source, self._origin, "exec")
        exec(code, vars(module))  # text kfbot generated, in place of a builder's file


class _ExtensionLoader(importlib.abc.Loader):
    """A built extension whose entry point is `PyInit_<init>`, under any module name."""

    def __init__(
        self, init: str, path: str, loaded: Callable[[ModuleType | None], None]
    ) -> None:
        self._init = init
        self._path = path
        self._loaded = loaded
        self._inner = importlib.machinery.ExtensionFileLoader(init, path)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        # Loaded already under its own name (the worker's original): the same module,
        # since a second initialisation of one library can fail (pybind11 types).
        known = sys.modules.get(self._init)
        if known is not None and getattr(known, "__file__", None) == self._path:
            return known
        inner = importlib.util.spec_from_file_location(self._init, self._path, loader=self._inner)
        assert inner is not None  # a file location always makes a spec
        return self._inner.create_module(inner)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._loaded(module)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Lets the other finders find the watched modules, and hears when each is loaded."""

    def __init__(self, names: frozenset[str], on_import: Callable[[ModuleType], None]) -> None:
        self._names = names
        self._on_import = on_import

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._names:
            return None
        spec = _find_with_others(self, fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _NotifyingLoader(spec.loader, self._on_import)
        return spec


def _find_with_others(
    me: object, fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> importlib.machinery.ModuleSpec | None:
    for finder in list(sys.meta_path):
        find = getattr(finder, "find_spec", None)
        if finder is me or find is None:
            continue
        spec: object = find(fullname, path, target)
        if isinstance(spec, importlib.machinery.ModuleSpec):
            return spec
    return None


class _NotifyingLoader(importlib.abc.Loader):
    """The real loader, plus a call to `on_import` once the module has run."""

    def __init__(
        self, inner: importlib.abc.Loader, on_import: Callable[[ModuleType], None]
    ) -> None:
        self._inner = inner
        self._on_import = on_import

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        # Put the real loader back where reload() and resource readers look for it.
        _set_quietly(module, "__loader__", self._inner)
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._on_import(module)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def _set_quietly(owner: object, attr: str, value: object) -> None:
    with contextlib.suppress(AttributeError, TypeError):
        setattr(owner, attr, value)
