"""A kernel's translation unit split in two: the kernel's own unit, free of torch, and
the host part, which keeps everything else and is the same for every candidate.

A unit that includes the torch headers takes a minute to compile (75 s on an H100
machine), while the kernel in it takes about a second. So where a candidate changes
only the kernel and what only the kernel uses, the unit is compiled as two:

- the **host part**: the original unit with the kernel's body taken out (its
  definition becomes a declaration) and with what only the kernel used left out. It
  depends on the original alone, so it is compiled once and cached;
- the **kernel's unit**: the same files with everything blanked but the kernel, the
  device functions, types, constants and macros it needs, and the includes that are
  not torch's; compiled with the unit's own command, so the kernel's code is the same.

A launch in the host part calls the kernel's host stub, which the kernel's unit
defines (a kernel may be launched from another unit without relocatable device code).
A launcher that needs no torch moves with the kernel, so a candidate that changes
how the kernel is launched stays on the fast path too. Both units are made by
blanking whole items, so every line stays where it was and compiler messages name
the repository's lines.

What cannot be split is said as a reason, and the unit is then compiled whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kfbot.evaluate.build.fast.units import Item, items
from kfbot.evaluate.build.symbols import before_params

# Headers of torch and Python: a unit that includes one is slow to compile, and the
# kernel's unit must not include any.
_HOST_HEADER_DIRS = ("torch/", "ATen/", "c10/", "caffe2/", "pybind11/", "THC/")
_HOST_HEADERS = frozenset({"Python.h", "pybind11.h"})
# Names that only torch's headers define: code that uses one cannot leave them behind.
_TORCH_WORDS = frozenset({"torch", "at", "c10", "caffe2", "pybind11", "py", "Tensor",
                          "ScalarType", "THCState"})
_TORCH_PREFIXES = ("TORCH_", "AT_", "C10_", "PYBIND11_", "THC")
_REGISTRATIONS = frozenset({"PYBIND11_MODULE", "TORCH_LIBRARY", "TORCH_LIBRARY_IMPL",
                            "TORCH_LIBRARY_FRAGMENT", "TORCH_LIBRARY_EXPAND",
                            "TORCH_LIBRARY_IMPL_EXPAND"})


@dataclass(frozen=True)
class Moved:
    """A function defined in the kernel's unit and only declared in the host part."""

    name: str
    kernel: bool
    template: bool  # its instantiations must be named in the kernel's unit


@dataclass(frozen=True)
class Split:
    unit: str  # the translation unit, as staged
    host: Mapping[str, str]  # the host part's files (the unit and its local headers)
    device: Mapping[str, str]  # the kernel's unit's files
    moved: tuple[Moved, ...]


@dataclass(frozen=True)
class Refused:
    reason: str


def host_header(path: str) -> bool:
    spec = path.strip("<>\"")
    return spec in _HOST_HEADERS or spec.startswith(_HOST_HEADER_DIRS)


def includes_host_headers(files: Mapping[str, str]) -> bool:
    return any(item.kind == "include" and item.include and host_header(item.include)
               for path, text in files.items() for item in items(path, text))


def torch_words(names: Iterable[str]) -> list[str]:
    return sorted({n for n in names if n in _TORCH_WORDS or n.startswith(_TORCH_PREFIXES)})


# --- what the kernel needs ------------------------------------------------------------


class _Index:
    def __init__(self, found: Sequence[Item]) -> None:
        self.items = list(found)
        self.by_name: dict[str, list[Item]] = {}
        for item in found:
            for name in item.names:
                self.by_name.setdefault(name, []).append(item)

    def needs(self, start: Iterable[Item]) -> list[Item]:
        """`start` and every item it needs, transitively. Device code cannot call host
        functions, so from device code only device-capable functions are followed."""
        kept = {id(item): item for item in start}
        pending = list(kept.values())
        while pending:
            item = pending.pop()
            on_device = item.side in ("kernel", "device") or item.kind != "function"
            for name in item.mentions - item.names:
                for found in self.by_name.get(name, ()):
                    if id(found) in kept or found.shared:
                        continue
                    if on_device and found.kind in ("function", "prototype") and \
                            found.side == "host":
                        continue
                    kept[id(found)] = found
                    pending.append(found)
        return list(kept.values())


def _targets(index: _Index, kernel: str) -> list[Item] | Refused:
    found = [i for i in index.items if i.kind == "function" and i.side == "kernel"
             and kernel in i.names]
    if not found:
        return Refused(f"kernel {kernel} is not defined in the unit's own files")
    if any(i.anonymous for i in found):
        return Refused(f"kernel {kernel} is in an anonymous namespace: no other unit can "
                       "launch it")
    return found


def _movable_launchers(index: _Index, kernel: str) -> list[Item]:
    """Host functions that launch the kernel and need no torch: they move with it, so
    a change to a launch stays out of the host part."""
    out = []
    for item in index.items:
        if item.kind != "function" or item.side not in ("host", "both") or \
                kernel not in item.mentions or item.anonymous or item.names & _REGISTRATIONS:
            continue
        needed = index.needs([item])
        words = torch_words(m for i in needed for m in i.mentions)
        mutable = [i for i in needed if i.kind == "variable" and i.variable == "mutable"]
        if not words and not mutable:
            out.append(item)
    return out


def _refusal(needed: Sequence[Item], kernel: str) -> Refused | None:
    words = torch_words(m for i in needed for m in i.mentions)
    if words:
        return Refused(f"kernel {kernel}'s code uses {', '.join(words)} from the torch "
                       "headers")
    mutable = sorted({n for i in needed if i.variable == "mutable" for n in i.names})
    if mutable:
        return Refused(f"kernel {kernel}'s code uses host variable {', '.join(mutable)}")
    return None


def _exclusive(index: _Index, needed: Sequence[Item], moved: Sequence[Item]) -> list[Item]:
    """The needed items nothing else uses: the host part leaves them out, so that a
    candidate may change or add them and still share the host part."""
    moved_ids = {id(i) for i in moved}
    candidates = {id(i): i for i in needed if id(i) not in moved_ids and not i.shared}
    host = [i for i in index.items if id(i) not in candidates and id(i) not in moved_ids]
    mentions = {m for i in host for m in i.mentions} | {m for i in moved for m in i.signature}
    while True:
        used = [k for k, i in candidates.items() if i.names & mentions]
        if not used:
            return list(candidates.values())
        for key in used:
            mentions |= candidates.pop(key).mentions


# --- the two units --------------------------------------------------------------------


def _blank(data: bytes, start: int, end: int) -> bytes:
    """The bytes with [start, end) replaced by its line breaks: lines stay in place."""
    return data[:start] + b"\n" * data.count(b"\n", start, end) + data[end:]


def _apply(text: str, edits: list[tuple[int, int, bytes]]) -> str:
    data = text.encode("utf-8")
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        data = _blank(data, start, end) if new == b"" else data[:start] + new + data[end:]
    return data.decode("utf-8")


def _linkage_edits(item: Item) -> list[tuple[int, int, bytes]]:
    # `static` and `inline` go: the two units link to one definition.
    return [(start, end, b" ") for start, end in item.linkage]


def _host_files(files: Mapping[str, str], moved: Sequence[Item],
                exclusive: Sequence[Item]) -> dict[str, str]:
    edits: dict[str, list[tuple[int, int, bytes]]] = {path: [] for path in files}
    for item in exclusive:
        edits[item.file].append((item.start, item.end, b""))
    for item in moved:
        assert item.body is not None
        body_start, body_end = item.body
        edits[item.file] += _linkage_edits(item)
        edits[item.file].append((body_start, body_end, b";"))
        if item.launch_bounds is not None:
            edits[item.file].append((*item.launch_bounds, b" "))
        edits[item.file] += [(start, end, b" ") for start, end in item.restricts]
    return {path: _apply(text, _keep_lines(text, edits[path])) for path, text in files.items()}


def _keep_lines(text: str, edits: list[tuple[int, int, bytes]]) -> list[tuple[int, int, bytes]]:
    """Replacements keep the line breaks of what they replace."""
    data = text.encode("utf-8")
    return [(s, e, new + b"\n" * data.count(b"\n", s, e)) if new else (s, e, new)
            for s, e, new in edits]


def _device_files(files: Mapping[str, str], index: _Index, needed: Sequence[Item],
                  moved: Sequence[Item], private: Sequence[Item]) -> dict[str, str]:
    keep = {id(i) for i in needed}
    names = {n for i in needed for n in i.names}
    defined = set(index.by_name)
    edits: dict[str, list[tuple[int, int, bytes]]] = {path: [] for path in files}
    for item in index.items:
        if not _in_device(item, id(item) in keep, names, defined):
            edits[item.file].append((item.start, item.end, b""))
    for item in moved:
        edits[item.file] += _linkage_edits(item)
    for item in private:  # the host part defines it too: this unit's copy is its own
        edits[item.file].append((item.start, item.start, b"static "))
    return {path: _apply(text, edits[path]) for path, text in files.items()}


def _in_device(item: Item, needed: bool, names: set[str], defined: set[str]) -> bool:
    """Whether the kernel's unit keeps `item`: what the kernel needs, every macro (cheap,
    and used in ways names do not show), includes other than torch's, and checks such
    as a static_assert on the kernel's own constants."""
    if item.kind == "include":
        return not (item.include and host_header(item.include))
    if item.shared:  # `using namespace torch;` has nothing to name without torch
        return item.condition or not torch_words(item.mentions)
    if needed or item.kind == "macro":
        return True
    if item.kind == "other" and not item.names:
        local = item.mentions & defined
        return bool(local) and local <= names and not torch_words(item.mentions)
    return False


def split_unit(unit: str, files: Mapping[str, str], kernel: str) -> Split | Refused:
    """The unit `unit` (with its local headers, `files`) split around `kernel`."""
    index = _Index([item for path, text in files.items() for item in items(path, text)])
    targets = _targets(index, kernel)
    if isinstance(targets, Refused):
        return targets
    moved = [*targets, *_movable_launchers(index, kernel)]
    needed = index.needs(moved)
    refused = _refusal(index.needs(targets), kernel)
    if refused is not None:
        return refused
    exclusive = _exclusive(index, needed, moved)
    both = _in_both(needed, moved, exclusive)
    if isinstance(both, Refused):
        return both
    return Split(unit, _host_files(files, moved, exclusive),
                 _device_files(files, index, needed, moved, both),
                 tuple(sorted({Moved(name, i.side == "kernel", i.template)
                               for i in moved for name in i.names},
                              key=lambda m: m.name)))


def _in_both(needed: Sequence[Item], moved: Sequence[Item], exclusive: Sequence[Item]
             ) -> list[Item] | Refused:
    """What both parts define: the functions among them that would clash when linked
    (the kernel's unit makes its copies static), or why they cannot be kept apart."""
    apart = {id(i) for i in [*moved, *exclusive]}
    both = [i for i in needed if id(i) not in apart]
    shared_vars = sorted({n for i in both if i.variable == "device" for n in i.names})
    if shared_vars:
        return Refused(f"the kernel uses device variable {', '.join(shared_vars)}, which the "
                       "host part names too: each part would have its own copy")
    functions = [i for i in both if i.kind == "function"]
    templates = sorted({n for i in functions if i.side == "kernel" and i.template
                        for n in i.names})
    if templates:
        return Refused(f"template kernel {', '.join(templates)} is used by both the kernel's "
                       "code and the host part")
    return [i for i in functions if not i.repeatable]


def host_difference(original: Split, candidate: Split) -> str | None:
    """Where the candidate's host part differs from the original's, or None: the host
    part compiled from the original then serves the candidate."""
    if original.moved != candidate.moved:
        return "the candidate changes which functions launch the kernel"
    for path in sorted(set(original.host) | set(candidate.host)):
        before = original.host.get(path, "").splitlines()
        after = candidate.host.get(path, "").splitlines()
        old = [line.split() for line in before if line.strip()]
        new = [(n, line.split()) for n, line in enumerate(after, 1) if line.strip()]
        for index, (number, words) in enumerate(new):
            if index >= len(old) or old[index] != words:
                shown = " ".join(words)[:80]
                return f"the candidate changes code the host part keeps ({path}:{number}: " \
                       f"`{shown}`)"
        if len(old) != len(new):
            return f"the candidate removes code the host part keeps ({path})"
    return None


def instantiations(split: Split, undefined: Iterable[str]) -> list[str] | Refused:
    """Explicit instantiations, for the kernel's unit, of the moved templates the host
    part uses: `undefined` are the host object's undefined symbols, demangled."""
    templates = [m for m in split.moved if m.template]
    out: list[str] = []
    for symbol in undefined:
        moved = next((m for m in templates if _instance_of(symbol, m.name)), None)
        if moved is None:
            continue
        if "(anonymous namespace)" in symbol or "{lambda" in symbol:
            return Refused(f"{moved.name} is instantiated with a type no other unit can "
                           f"name: {symbol}")
        out.append(f"template {'__global__ ' if moved.kernel else ''}{symbol};")
    return sorted(set(out))


def _instance_of(symbol: str, name: str) -> bool:
    head = before_params(symbol) or ""
    at = head.find(f"{name}<")
    return at >= 0 and (at == 0 or head[at - 1] in " :") and symbol.endswith(")")
