"""Turn raw compiler output (nvcc, EDG front end, g++, ptxas, nvlink) into records.

A failed build is feedback, not a crash: the search needs to know which file and
line broke and why, in a form it can switch on, and the reports need one readable
line per problem. Everything here is pure text processing except the optional
demangler call, so it can be tested on captured output without a toolkit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from kfbot.evaluate.model import Diagnostic, KernelResources, Severity

# cu++filt understands every CUDA mangling; binutils' c++filt handles the Itanium
# names ptxas prints and is present wherever g++ is, while some toolkit installs
# ship without cu++filt. The first one found on PATH is used.
DEMANGLERS: tuple[str, ...] = ("cu++filt", "c++filt")

# EDG front end (cudafe++): `path(12): error #20-D: message`.
_EDG = re.compile(
    r"^(?P<file>.+?)\((?P<line>\d+)\): "
    r"(?P<sev>catastrophic error|error|warning|remark|note)"
    r"(?: #(?P<code>\d+(?:-D)?))?: (?P<msg>.*)$"
)
# EDG instantiation chains: "detected during instantiation of ..." on one line, or
# "detected during:" followed by one indented line per level.
_DETECTED = re.compile(r"^\s+detected during(?::|\s+(?P<what>.+))$")
# gcc/g++ (also what nvcc prints when the host preprocessor fails).
_GCC = re.compile(
    r"^(?P<file>(?:[A-Za-z]:)?[^:]+):(?P<line>\d+):(?:(?P<col>\d+):)? "
    r"(?P<sev>fatal error|error|warning|note): (?P<msg>.*)$"
)
# gcc prints where it was ("In function", "required from") *before* the diagnostic.
_GCC_CONTEXT = re.compile(
    r"^(?:In file included from |\s+from |\S.*?: (?:In |At global scope)|.+?:\d+:\d+:\s{2,}\S)"
)
_TOOL = re.compile(
    r"^(?P<tool>nvcc|ptxas|nvlink|fatbinary|cicc|cudafe\+\+)\s+"
    r"(?P<sev>fatal|error|warning|info)\s*:\s*(?P<msg>.*)$"
)
_DRIVER = re.compile(
    r"^(?:cc1plus|cc1|g\+\+|gcc|c\+\+|clang\+\+|clang)(?:-[\d.]+)?: "
    r"(?P<sev>fatal error|error|warning): (?P<msg>.*)$"
)
_LD = re.compile(r"^(?:\S*/)?ld(?:\.\w+)?: (?P<msg>.*[^:])$")
_LD_REFERENCE = re.compile(r"^\S+:\([^)]*\): (?P<msg>undefined reference to .*)$")
_FUNCTION_NAME = re.compile(r"[Ff]unction '(?P<name>[^']+)'")
# Totals and hints that repeat what the individual diagnostics already say.
_SUMMARY = re.compile(
    r"^(?:\d+ errors? detected in the compilation of |compilation terminated\."
    r"|Remark: The warnings can be suppressed|collect2: error: ld returned )"
)
# A caret line marks the line before it as an echo of the source, not a message.
_CARET = re.compile(r"^\s*[~^]*\^[~^]*\s*$")


def parse_compiler_output(text: str, root: str | None = None) -> list[Diagnostic]:
    """Every error and warning in `text`, in order, without duplicates.

    Paths under `root` become relative to it so that records from different build
    directories compare equal; `line` is 1-based as the compilers print it.
    """
    parser = _OutputParser(root)
    lines = text.splitlines()
    echoes = _source_echo_lines(lines)
    for index, raw in enumerate(lines):
        if index not in echoes:
            parser.feed(raw.rstrip())
    return list(dict.fromkeys(parser.found))


def _source_echo_lines(lines: Sequence[str]) -> set[int]:
    """Indexes of caret lines and of the source lines they point into."""
    echoes: set[int] = set()
    for index, line in enumerate(lines):
        if _CARET.match(line):
            echoes.update((index, index - 1))
    return echoes


def _relative(path: str, root: str | None) -> str:
    normal = os.path.normpath(path)
    if root is None or not os.path.isabs(normal):
        return normal
    base = os.path.normpath(os.path.abspath(root))
    try:
        inside = os.path.commonpath([normal, base]) == base
    except ValueError:  # different drives on Windows
        return normal
    return os.path.relpath(normal, base) if inside else normal


def _severity(word: str) -> Severity:
    return "warning" if word == "warning" else "error"


def _kind(tool: str, level: Severity) -> str:
    family = {"ptxas": "ptxas", "nvlink": "link"}.get(tool, "compile")
    return f"{family}_{level}"


class _OutputParser:
    """Line-at-a-time state: some lines only make sense next to their neighbours."""

    def __init__(self, root: str | None) -> None:
        self.root = root
        self.found: list[Diagnostic] = []
        self.pending_context: list[str] = []  # gcc context waiting for its diagnostic
        self.folding = False  # indented lines after an EDG diagnostic belong to it
        self.chain = False  # inside an EDG "detected during:" block

    def feed(self, line: str) -> None:
        if not line.strip() or _SUMMARY.match(line):
            self.folding = self.chain = False
            return
        if not line[0].isspace():
            self.chain = False
        for handler in (self._tool, self._edg, self._gcc, self._gcc_context, self._driver,
                        self._linker, self._indented):
            if handler(line):
                return
        self.folding = False

    def _add(self, kind: str, message: str, severity: Severity, file: str | None = None,
             line: int | None = None, details: tuple[tuple[str, str], ...] = ()) -> None:
        context = tuple(("context", text) for text in self.pending_context)
        self.pending_context = []
        path = None if file is None else _relative(file, self.root)
        self.found.append(Diagnostic("build", kind, message, severity, path, line,
                                     context + details))

    def _attach(self, key: str, value: str) -> None:
        if self.found:
            last = self.found[-1]
            self.found[-1] = replace(last, details=(*last.details, (key, value)))

    def _tool(self, line: str) -> bool:
        match = _TOOL.match(line)
        if match is None:
            return False
        self.folding = False
        if match["sev"] != "info":  # ptxas -v chatter is parse_ptxas_resources' job
            level = _severity(match["sev"])
            name = _FUNCTION_NAME.search(match["msg"])
            details = (("function", name["name"]),) if name else ()
            self._add(_kind(match["tool"], level), match["msg"], level, details=details)
        return True

    def _edg(self, line: str) -> bool:
        match = _EDG.match(line)
        if match is None:
            return False
        self.folding = True
        severity, message = match["sev"], match["msg"]
        if severity == "note":
            self._attach("note", message)
        elif severity != "remark":
            level = _severity(severity)
            code = (("code", match["code"]),) if match["code"] else ()
            self._add(_kind("cudafe++", level), message, level, match["file"],
                      int(match["line"]), code)
        return True

    def _gcc(self, line: str) -> bool:
        match = _GCC.match(line)
        if match is None:
            return False
        self.folding = False
        if match["sev"] == "note":
            self._attach("note", match["msg"])
            return True
        level = _severity(match["sev"])
        column = (("column", match["col"]),) if match["col"] else ()
        self._add(_kind("g++", level), match["msg"], level, match["file"], int(match["line"]),
                  column)
        return True

    def _gcc_context(self, line: str) -> bool:
        if not _GCC_CONTEXT.match(line) or (self.folding and line[0].isspace()):
            return False
        self.pending_context.append(line.strip().rstrip(":,"))
        return True

    def _driver(self, line: str) -> bool:
        match = _DRIVER.match(line)
        if match is None:
            return False
        level = _severity(match["sev"])
        self._add(_kind("g++", level), match["msg"], level)
        return True

    def _linker(self, line: str) -> bool:
        match = _LD.match(line) or _LD_REFERENCE.match(line)
        if match is None:
            return False
        self._add("link_error", match["msg"], "error")
        return True

    def _indented(self, line: str) -> bool:
        if not (self.folding and line[0].isspace()):
            return False
        detected = _DETECTED.match(line)
        if detected is None:
            self._attach("context" if self.chain else "detail", line.strip())
        elif detected["what"]:
            self._attach("context", detected["what"])
        else:
            self.chain = True
        return True


# ptxas -v lines; each piece is matched on its own because CUDA versions add,
# drop and reorder them (barriers since 12.x, cmem only for some targets).
_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PROPERTIES = re.compile(r"Function properties for (?P<name>\S+?):?\s*$")
_STACK = re.compile(r"(?P<n>\d+) bytes stack frame")
_SPILL_STORES = re.compile(r"(?P<n>\d+) bytes spill stores")
_SPILL_LOADS = re.compile(r"(?P<n>\d+) bytes spill loads")
_USED = re.compile(r"Used (?P<n>\d+) registers")
_BARRIERS = re.compile(r"used (?P<n>\d+) barriers")
_SMEM = re.compile(r"(?P<n>\d+) bytes smem")
_CMEM = re.compile(r"(?P<n>\d+) bytes cmem\[\d+\]")


@dataclass(frozen=True)
class _Frame:
    """The "N bytes stack frame, ..." numbers of one function."""

    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


def _number(pattern: re.Pattern[str], line: str) -> int:
    match = pattern.search(line)
    return int(match["n"]) if match else 0


def _frame(line: str) -> _Frame | None:
    if _STACK.search(line) is None:
        return None
    return _Frame(_number(_STACK, line), _number(_SPILL_STORES, line),
                  _number(_SPILL_LOADS, line))


def _with_usage(entry: KernelResources, line: str) -> KernelResources:
    constant = sum(int(m["n"]) for m in _CMEM.finditer(line))  # all banks
    return replace(entry, registers=_number(_USED, line), barriers=_number(_BARRIERS, line),
                   shared_bytes=_number(_SMEM, line), constant_bytes=constant)


def _with_frame(entry: KernelResources, frame: _Frame) -> KernelResources:
    return replace(entry, stack_frame_bytes=frame.stack, spill_store_bytes=frame.spill_stores,
                   spill_load_bytes=frame.spill_loads)


def parse_ptxas_resources(text: str,
                          demanglers: Sequence[str] = DEMANGLERS) -> list[KernelResources]:
    """One record per (kernel, arch) from `-Xptxas -v` output, in output order.

    Device functions that are not entries (their "Function properties" appear
    under -rdc) are ignored: only kernels have launchable resource limits.
    """
    entries: list[KernelResources] = []
    frames: dict[str, _Frame] = {}  # properties seen before their entry line
    target: str | None = None  # whose properties the next frame line describes
    for line in text.splitlines():
        if entry := _ENTRY.search(line):
            name = entry["name"]
            entries.append(_with_frame(KernelResources(name, name, entry["arch"], 0),
                                       frames.pop(name, _Frame())))
        elif properties := _PROPERTIES.search(line):
            target = properties["name"]
        elif (frame := _frame(line)) is not None and target is not None:
            if entries and entries[-1].mangled == target:
                entries[-1] = _with_frame(entries[-1], frame)
            else:
                frames[target] = frame
            target = None
        elif _USED.search(line) and entries:
            entries[-1] = _with_usage(entries[-1], line)
    names = demangle((entry.mangled for entry in entries), demanglers)
    unique = dict.fromkeys(replace(e, kernel=names.get(e.mangled, e.mangled)) for e in entries)
    return list(unique)


def demangle(names: Iterable[str], demanglers: Sequence[str] = DEMANGLERS) -> dict[str, str]:
    """Readable names for the mangled ones in `names`, in a single subprocess call.

    Names that are not mangled (`extern "C"` kernels) are left out, and so is
    everything when no demangler is on PATH or it fails: a mangled name is still
    a correct name, so demangling must never break a build report.
    """
    mangled = list(dict.fromkeys(name for name in names if name.startswith("_Z")))
    tool = next((found for t in demanglers if (found := shutil.which(t))), None)
    if not mangled or tool is None:
        return {}
    try:
        result = subprocess.run([tool, *mangled], capture_output=True, text=True,
                                timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return {}
    readable = result.stdout.splitlines()
    if len(readable) != len(mangled):  # cannot pair them up safely
        return {}
    return {m: r.strip() for m, r in zip(mangled, readable, strict=True) if r.strip()}


def resource_diagnostics(resources: Iterable[KernelResources]) -> list[Diagnostic]:
    """An info record per kernel, plus a warning for each kernel that spills."""
    found: list[Diagnostic] = []
    for kernel in resources:
        found.append(Diagnostic("build", "resources", _resource_line(kernel), "info",
                                details=_resource_details(kernel)))
        if kernel.spill_store_bytes or kernel.spill_load_bytes:
            message = (f"{kernel.kernel}: registers spilled to local memory "
                       f"({kernel.spill_store_bytes} B stores, {kernel.spill_load_bytes} B loads"
                       f" at {kernel.registers} registers, {kernel.arch})")
            found.append(Diagnostic("build", "register_spill", message, "warning",
                                    details=_resource_details(kernel)))
    return found


def _resource_line(kernel: KernelResources) -> str:
    return (f"{kernel.kernel}: {kernel.registers} registers, {kernel.spill_store_bytes} B spills,"
            f" {kernel.shared_bytes} B shared memory ({kernel.arch})")


def _resource_details(kernel: KernelResources) -> tuple[tuple[str, str], ...]:
    return (("kernel", kernel.kernel), ("mangled", kernel.mangled), ("arch", kernel.arch),
            ("registers", str(kernel.registers)), ("shared_bytes", str(kernel.shared_bytes)),
            ("constant_bytes", str(kernel.constant_bytes)),
            ("stack_frame_bytes", str(kernel.stack_frame_bytes)),
            ("spill_store_bytes", str(kernel.spill_store_bytes)),
            ("spill_load_bytes", str(kernel.spill_load_bytes)),
            ("barriers", str(kernel.barriers)))
