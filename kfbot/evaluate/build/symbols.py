"""Which built library holds a kernel, read from the library's symbols.

When the repository builds itself (its `setup.py`, its CMake), kfbot does not know in
advance which of the libraries it made holds a kernel. Every CUDA kernel leaves its
name in the host library that launches it: a host stub named like the kernel (in the
symbol table unless the library was stripped) and the device name the runtime
registers it under, a string in the library's read-only data that survives `strip`.
Both are C++-mangled; `c++filt` turns them into what a person reads,
`void ops::(anonymous namespace)::scale<float, 128>(float const*, float*, int)`, which
is matched with the scanned definition by qualified name (anonymous namespaces left
out, as the scan leaves them out). `cuobjdump -symbols`, where the toolkit has it,
lists the device code's own symbols as well.

Nothing here runs the library; it is read as bytes and by the binutils.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kfbot.scan.model import KernelDef

Source = Literal["symbol table", "registered name", "device code"]
_TOOL_TIMEOUT_S = 120.0
_MANGLED = re.compile(rb"_Z[A-Za-z0-9_$.]{2,4000}")
# Names the compiler derives from a kernel's that are not the kernel itself.
_DERIVED = ("__device_stub_", "__wrapper__device_stub_", "guard variable", "__nv_")


@dataclass(frozen=True)
class KernelSymbol:
    """One demangled name, split into the parts a definition is matched by."""

    text: str  # as demangled
    namespace: str  # "a::b", anonymous namespaces left out
    name: str
    template_args: tuple[str, ...]
    source: Source

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}::{self.name}" if self.namespace else self.name

    def matches(self, kernel: KernelDef) -> bool:
        return self.name == kernel.name and self.namespace == kernel.namespace


@dataclass(frozen=True)
class Holder:
    """A library that holds a kernel, and the names that say so."""

    library: Path
    symbols: tuple[KernelSymbol, ...]

    def evidence(self) -> str:
        first = self.symbols[0]
        return f"{self.library.name}: `{first.text}` ({first.source})"


def holders(kernel: KernelDef, libraries: Iterable[Path]) -> list[Holder]:
    """The libraries among `libraries` that hold `kernel`, surest evidence first: a
    name registered with the CUDA runtime or in device code is a kernel's; a host
    symbol of that name could also be a CPU twin's function."""
    found = []
    for library in libraries:
        matched = tuple(s for s in library_symbols(library) if s.matches(kernel))
        if not matched and kernel.extern_c and plain_names(library, [kernel.name]):
            matched = (KernelSymbol(kernel.name, "", kernel.name, (), "registered name"),)
        if matched:
            found.append(Holder(library, matched))
    rank = {"device code": 0, "registered name": 1, "symbol table": 2}
    return sorted(found, key=lambda h: (min(rank[s.source] for s in h.symbols),
                                        str(h.library)))


def library_symbols(library: Path) -> list[KernelSymbol]:
    """Every function name the library defines or registers, demangled and split."""
    named: dict[str, Source] = {}
    for raw in _nm(library):
        named.setdefault(raw, "symbol table")
    for raw in _cuobjdump(library):
        named.setdefault(raw, "device code")
    for raw in _registered(library):
        named.setdefault(raw, "registered name")
    raws = list(named)
    out = []
    for raw, text in zip(raws, demangle(raws), strict=True):
        symbol = parse_symbol(text, named[raw])
        if symbol is not None:
            out.append(symbol)
    return out


def _nm(library: Path) -> list[str]:
    """Defined function symbols, from the full table and the dynamic one (a stripped
    library keeps only the second)."""
    nm = shutil.which("nm")
    if nm is None:
        return []
    out: list[str] = []
    for extra in ((), ("-D",)):
        text = _run([nm, "--defined-only", *extra, str(library)])
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "tTwWiu":
                out.append(parts[2])
    return out


def _cuobjdump(library: Path) -> list[str]:
    """The device code's function symbols (`STT_FUNC`), when the toolkit has cuobjdump."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return []
    text = _run([tool, "-symbols", str(library)])
    return [line.split()[-1] for line in text.splitlines() if "STT_FUNC" in line and
            line.split()]


def _registered(library: Path) -> list[str]:
    """Mangled names in the library's bytes: the names its kernels are registered
    under with the CUDA runtime, kept when the symbol table is stripped."""
    try:
        data = library.read_bytes()
    except OSError:
        return []
    return list(dict.fromkeys(m.decode("ascii") for m in _MANGLED.findall(data)))


def has_device_code(library: Path) -> bool:
    """Whether the library holds CUDA device code (a fat binary section) at all."""
    try:
        return b".nv_fatbin" in library.read_bytes()
    except OSError:
        return False


def plain_names(library: Path, names: Sequence[str]) -> set[str]:
    """Which of `names` (extern "C" kernels: their symbol is the bare name) the
    library holds as a null-terminated string."""
    try:
        data = library.read_bytes()
    except OSError:
        return set()
    return {n for n in names if b"\0" + n.encode() + b"\0" in data}


def demangle(names: Sequence[str]) -> list[str]:
    """`c++filt` over every name at once; names it cannot read come back unchanged."""
    if not names:
        return []
    tool = shutil.which("c++filt")
    if tool is None:
        return list(names)
    try:
        done = subprocess.run([tool], input="\n".join(names) + "\n", text=True,
                              capture_output=True, timeout=_TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return list(names)
    lines = done.stdout.splitlines()
    return lines if len(lines) == len(names) else list(names)


def _run(command: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(command), capture_output=True, text=True,
                              errors="replace", timeout=_TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def parse_symbol(text: str, source: Source = "symbol table") -> KernelSymbol | None:
    """`void a::(anonymous namespace)::k<float, 128>(float const*)` -> a::k <float, 128>;
    None for what is not a function name (data, derived stubs, an unread mangling)."""
    if text.startswith(_DERIVED) or text.startswith("_Z"):
        return None
    head = before_params(text)
    if head is None and source == "symbol table":
        head = text  # a C name (extern "C"), which has no parameter list
    if head is None:
        return None
    parts = split_top(_drop_return_type(head), "::")
    if not parts or not parts[-1]:
        return None
    last, args = _template_split(parts[-1])
    if not re.fullmatch(r"[A-Za-z_]\w*", last) or last.startswith(_DERIVED):
        return None
    scopes = [p for p in parts[:-1] if p != "(anonymous namespace)"]
    return KernelSymbol(text, "::".join(scopes), last, args, source)


def before_params(text: str) -> str | None:
    """Everything before the parameter list's `(` at template depth 0 (the parenthesis of
    `(anonymous namespace)` and those inside template arguments are not it); None for a
    name without one."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            if text.startswith("(anonymous namespace)", i):
                continue
            return text[:i]
    return None


def _drop_return_type(head: str) -> str:
    """A template function's demangled name starts with its return type: the name is
    what follows the last space outside brackets."""
    depth = 0
    cut = 0
    for i, ch in enumerate(head):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == " " and depth == 0:
            cut = i + 1
    return head[cut:]


def split_top(text: str, sep: str) -> list[str]:
    """`text` split at `sep` where no <>, () or [] is open: the parts of a demangled
    C++ name (also read by `kfbot.evaluate.observe.names` for the profiler's names)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _template_split(part: str) -> tuple[str, tuple[str, ...]]:
    if not part.endswith(">") or "<" not in part:
        return part, ()
    name, _, inner = part.partition("<")
    args = split_top(inner[:-1], ",")
    return name, tuple(a.strip() for a in args if a.strip())
