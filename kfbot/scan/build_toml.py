"""The Hugging Face kernel-builder recipe: `build.toml`, read into a `BuildRecipe`.

A kernel-builder repository has no setup.py: `build.toml` names the package
(`[general] name`), the torch binding sources (`[torch] src`) and, per `[kernel.<name>]`
section, a backend, its sources, flags, capabilities and dependencies. The builder
writes `registration.h` and the package's `_ops.py` (whose `ops` is
`torch.ops._<name>_<id>`) itself; neither is in the repository. The CUDA sections of
one file make one recipe (the builder links them into one extension); where their
flags differ, `cannot_tell` says so. Other backends (metal, rocm, xpu, cpu) are not
read. A key the format does not have is a warning with its line: the builder would
reject the file.
"""

from __future__ import annotations

import posixpath
import re
import sys
from typing import Any

from kfbot.scan.model import BuildRecipe, Problem, PyFileFacts

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# The keys of the build.toml formats (kernel-builder's config v1, v2 and v3).
_GENERAL = frozenset({"name", "backends", "universal", "cuda-maxver", "cuda-minver", "hub",
                      "python-depends", "cuda", "xpu", "version", "edition", "license"})
_TORCH = frozenset({"include", "minver", "maxver", "pyext", "src", "universal", "stable-abi"})
_KERNEL = frozenset({"backend", "language", "cuda-capabilities", "cuda-flags", "cuda-minver",
                     "cxx-flags", "depends", "include", "src", "rocm-archs", "hip-flags",
                     "sycl-flags"})
_TOP = frozenset({"general", "torch", "kernel"})
_COMPILED = (".cu", ".cpp", ".cc", ".cxx", ".c")


def read_build_toml(rel_path: str, source: bytes) -> PyFileFacts:
    """The CUDA build a `build.toml` describes, and the problems found in it."""
    lines = source.decode("utf-8", errors="replace").splitlines()
    try:
        data = tomllib.loads(source.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        at = re.search(r"line (\d+)", str(exc))
        return PyFileFacts(file=rel_path, problems=(Problem(
            rel_path, int(at.group(1)) if at else None, f"build.toml cannot be read: {exc}"),))
    reader = _Reader(rel_path, lines)
    build = reader.recipe(data)
    return PyFileFacts(file=rel_path, builds=(build,) if build else (),
                       problems=tuple(reader.problems))


class _Reader:
    def __init__(self, rel_path: str, lines: list[str]) -> None:
        self.rel_path = rel_path
        self.folder = posixpath.dirname(rel_path)
        self.lines = lines
        self.problems: list[Problem] = []

    def recipe(self, data: dict[str, Any]) -> BuildRecipe | None:
        self._unknown(data, _TOP, "")
        general = _table(data.get("general"))
        torch = _table(data.get("torch"))
        kernels = _table(data.get("kernel"))
        self._unknown(general, _GENERAL, "general")
        self._unknown(torch, _TORCH, "torch")
        cuda = {}
        for section, value in kernels.items():
            table = _table(value)
            self._unknown(table, _KERNEL, f"kernel.{section}")
            if _is_cuda(table):
                cuda[section] = table
        name = general.get("name")
        if not isinstance(name, str):
            self.problems.append(Problem(self.rel_path, self._line("[general]"),
                                         "build.toml: [general] has no name"))
            return None
        return self._build(name, torch, cuda) if cuda else None

    def _build(self, name: str, torch: dict[str, Any],
               cuda: dict[str, dict[str, Any]]) -> BuildRecipe:
        package = name.replace("-", "_")
        sources = self._paths(torch.get("src")) + [p for t in cuda.values()
                                                   for p in self._paths(t.get("src"))]
        includes = self._paths(torch.get("include")) + [
            p for t in cuda.values() for p in self._paths(t.get("include"))]
        cuda_flags = _union(_strings(t.get("cuda-flags")) for t in cuda.values())
        cxx_flags = _union(_strings(t.get("cxx-flags")) for t in cuda.values())
        notes = [f"{self.rel_path}:{self._line(f'[kernel.{k}]')}: the [kernel.*] sections' "
                 f"{key} differ; their union is kept ({k} has {_strings(t.get(key))})"
                 for key in ("cuda-flags", "cxx-flags")
                 for k, t in cuda.items()
                 if len({tuple(_strings(u.get(key))) for u in cuda.values()}) > 1]
        first = next(iter(cuda))
        return BuildRecipe(
            kind="kernel_builder", name=package, file=self.rel_path,
            line=self._line(f"[kernel.{first}]"),
            sources=tuple(dict.fromkeys(s for s in sources if s.endswith(_COMPILED))),
            defines=tuple(_defines(cuda_flags)), extra_cflags=tuple(cxx_flags),
            extra_cuda_cflags=tuple(cuda_flags),
            include_dirs=tuple(dict.fromkeys([*includes, *_folders(sources)])),
            cannot_tell=tuple(notes),
            capabilities=tuple(_union(_strings(t.get("cuda-capabilities"))
                                      for t in cuda.values())),
            depends=tuple(_union(_strings(t.get("depends")) for t in cuda.values())),
            package_dir=posixpath.join(self.folder, "torch-ext", package))

    def _paths(self, value: Any) -> list[str]:
        return [posixpath.normpath(posixpath.join(self.folder, p)) for p in _strings(value)]

    def _unknown(self, table: dict[str, Any], known: frozenset[str], section: str) -> None:
        for key in table:
            if key not in known:
                where = f"[{section}] " if section else ""
                self.problems.append(Problem(
                    self.rel_path, self._key_line(key, section),
                    f"build.toml: unknown key {where}`{key}` (the kernel builder would "
                    "reject it); ignored"))

    def _line(self, header: str) -> int:
        return next((i for i, line in enumerate(self.lines, 1)
                     if line.strip().replace(" ", "") == header.replace(" ", "")), 1)

    def _key_line(self, key: str, section: str) -> int:
        start = self._line(f"[{section}]") if section else 1
        pattern = re.compile(rf"^\s*\"?{re.escape(key)}\"?\s*[=.\]]|^\s*\[{re.escape(key)}")
        for i, line in enumerate(self.lines[start - 1:], start):
            if pattern.search(line):
                return i
        return start


def _is_cuda(table: dict[str, Any]) -> bool:
    backend = table.get("backend", table.get("language"))
    if backend is None:
        return "cuda-capabilities" in table or "cuda-flags" in table
    return backend in ("cuda", "cuda-hipify")


def _table(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _union(groups: Any) -> list[str]:
    return list(dict.fromkeys(v for group in groups for v in group))


def _folders(paths: list[str]) -> list[str]:
    return [posixpath.dirname(p) or "." for p in paths]


def _defines(flags: list[str]) -> list[tuple[str, str]]:
    out = []
    for flag in flags:
        if flag.startswith("-D") and len(flag) > 2:
            name, _, value = flag[2:].partition("=")
            out.append((name, value))
    return out
