"""The params mutator: new values for the tunables the scan found.

A `Knob` is one tunable with the values worth trying, within hardware limits (a
block of 32..1024 threads, a square tile of at most 32x32). A `#ifndef`-guarded
define or a `-D` build flag is set through the candidate's `-D` params; a
`constexpr`, `const`, plain `#define`, template argument or launch configuration is
changed in the source, on the line the scan reported, by replacing the literal.

Small spaces are swept exhaustively in a fixed order. Larger ones are searched from
the parent outwards: every single-knob step to a neighbouring value first (the
space is usually smooth around a good point), then a random jump, so the search
climbs instead of sampling blindly.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from kfbot.evaluate.candidate import Candidate
from kfbot.scan.model import Tunable

MAX_THREADS = 1024  # per block, every CUDA GPU since Fermi
WARP = 32
EXHAUSTIVE_LIMIT = 64  # spaces up to this size are swept point by point
_BLOCKISH = re.compile(r"^k?block(_?(size|dim))?$|block_?size|threads|^k?bs$|bdim",
                       re.IGNORECASE)
_TILEISH = re.compile(r"tile|^k?tm$|^k?tn$|^k?tk$", re.IGNORECASE)
_UNROLLISH = re.compile(r"unroll|items|per_thread|vec|ilp", re.IGNORECASE)
_VIA_DEFINE = ("ifndef_default", "build_flag")


@dataclass(frozen=True)
class Knob:
    name: str
    kind: str
    file: str
    line: int
    current: str
    choices: tuple[str, ...]
    # The knob's literal is this number of its line (0 first), not the one after its
    # name: a branch of `cols >= 1024 ? 1024 : 256` (see reach.py).
    occurrence: int = -1
    # Numbers of the same line that change with it, as (index, offset): a template
    # block size written again as the launch's block and grid, `(rows + 127) / 128`
    # (offset -1 for the 127). The first one holds the knob's value.
    tied: tuple[tuple[int, int], ...] = ()

    @property
    def via_define(self) -> bool:
        return self.kind in _VIA_DEFINE


def knobs(tunables: Sequence[Tunable], shared: Collection[str] = ()) -> list[Knob]:
    """One knob per tunable name (a `-D` build flag and its `#ifndef` default are one),
    leaving out those named in `shared`: constants that another kernel uses as well,
    which a new value would change unverified."""
    by_name: dict[str, Knob] = {}
    for t in tunables:
        choices = _choices(t.name, t.value)
        if not choices or (t.name in by_name and by_name[t.name].via_define) \
                or t.name.rsplit(":", 1)[-1] in shared:
            continue
        by_name[t.name] = Knob(t.name, t.kind, t.file, t.line, t.value, choices)
    return sorted(by_name.values(), key=lambda k: (k.file, k.line, k.name))


def _choices(name: str, value: str) -> tuple[str, ...]:
    if not value.isdigit() or int(value) <= 0:
        return ()
    current, bare = int(value), name.rsplit(":", 1)[-1]
    if _BLOCKISH.search(bare):
        values = [v for v in (32, 64, 128, 256, 512, 1024) if v <= MAX_THREADS]
    elif _TILEISH.search(bare):
        values = [8, 16, 32]  # a square tile of threads: 32 x 32 is the 1024 limit
    elif _UNROLLISH.search(bare):
        values = [1, 2, 4, 8]
    else:
        values = [v for v in (current // 4, current // 2, current * 2, current * 4) if v > 0]
    return tuple(str(v) for v in sorted({*values, current}))


def space_size(ks: Sequence[Knob]) -> int:
    size = 1
    for k in ks:
        size *= len(k.choices)
    return size


def point_of(ks: Sequence[Knob], parent: Candidate, files: Mapping[str, str]) -> dict[str, str]:
    """The parent's value for each knob: its `-D` params, else the literal in its source."""
    point = {}
    for k in ks:
        if k.via_define:
            point[k.name] = parent.params.get(k.name, k.current)
        else:
            text = parent.files.get(k.file, files.get(k.file, ""))
            point[k.name] = _literal(text, k) or k.current
    return point


def propose_points(ks: Sequence[Knob], parent: Candidate, files: Mapping[str, str],
                   rng: random.Random, seen: set[tuple[str, ...]], batch: int
                   ) -> list[dict[str, str]]:
    """Up to `batch` unseen points: a sweep for small spaces, else neighbours and a jump."""
    if not ks:
        return []
    if space_size(ks) <= EXHAUSTIVE_LIMIT:
        grid = itertools.product(*(k.choices for k in ks))
        points = [dict(zip((k.name for k in ks), p, strict=True)) for p in grid]
    else:
        here = point_of(ks, parent, files)
        points = _neighbours(ks, here)
        rng.shuffle(points)
        points.append({k.name: rng.choice(k.choices) for k in ks})
    fresh = []
    for p in points:
        key = tuple(p[k.name] for k in ks)
        if key not in seen:
            seen.add(key)
            fresh.append(p)
        if len(fresh) == batch:
            break
    return fresh


def _neighbours(ks: Sequence[Knob], here: Mapping[str, str]) -> list[dict[str, str]]:
    out = []
    for k in ks:
        i = k.choices.index(here[k.name]) if here[k.name] in k.choices else 0
        for j in (i - 1, i + 1):
            if 0 <= j < len(k.choices):
                out.append({**here, k.name: k.choices[j]})
    return out


def apply_point(ks: Sequence[Knob], point: Mapping[str, str], files: Mapping[str, str],
                parent: Candidate) -> Candidate | None:
    """The candidate for one point: `-D` params and literal edits on the scan's lines."""
    params = dict(parent.params)
    edited = dict(files)
    for k in ks:
        value = point[k.name]
        if k.via_define:
            params[k.name] = value
            continue
        text = edited.get(k.file)
        if text is None:
            return None
        changed = _replace_on_line(text, k, value)
        if changed is None:
            return None
        edited[k.file] = changed
    changes = {f: t for f, t in edited.items() if files.get(f) != t or f in parent.files}
    label = ", ".join(f"{k.name}={point[k.name]}" for k in ks)
    return Candidate(files={**parent.files, **changes}, params=params, origin="params",
                     parent=parent.hash, rationale=f"params: {label}")


NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")


def _locate(text: str, knob: Knob) -> tuple[list[str], re.Match[str]] | None:
    found = _spans(text, knob)
    return (found[0], found[1][0][0]) if found is not None else None


def _spans(text: str, knob: Knob) -> tuple[list[str], list[tuple[re.Match[str], int]]] | None:
    """The knob's literals on its line, each with its offset from the knob's value."""
    if knob.tied:
        lines = text.split("\n")
        if not 0 < knob.line <= len(lines):
            return None
        numbers = list(NUMBER.finditer(lines[knob.line - 1]))
        if any(i >= len(numbers) for i, _ in knob.tied):
            return None
        spans = [(numbers[i], offset) for i, offset in knob.tied]
        # A line that moved or was rewritten no longer holds one value in every place.
        values = {int(m.group()) - offset for m, offset in spans}
        return (lines, spans) if len(values) == 1 else None
    found = _first(text, knob)
    return (found[0], [(found[1], 0)]) if found is not None else None


def _first(text: str, knob: Knob) -> tuple[list[str], re.Match[str]] | None:
    """The first integer literal after the knob's name on the scan's line.

    The line holds one declaration (`constexpr int kBlock = 256;`) or one launch, so
    the literal after the name is the value; a launch's unnamed value is the first
    literal equal to the scanned one. A parent whose text moved (a structural rewrite
    adds lines and rewrites launches) no longer has the knob on that line: nothing."""
    lines = text.split("\n")
    if not 0 < knob.line <= len(lines):
        return None
    row = lines[knob.line - 1]
    name = knob.name.rsplit(":", 1)[-1]
    if knob.occurrence >= 0:
        numbers = list(NUMBER.finditer(row))
        match = numbers[knob.occurrence] if knob.occurrence < len(numbers) else None
    elif name in row:
        match = NUMBER.search(row, row.find(name) + len(name))
    elif knob.kind == "launch_config" and "<<<" in row:
        match = next((m for m in NUMBER.finditer(row) if m.group() == knob.current), None)
    else:
        match = None
    return (lines, match) if match is not None else None


def _literal(text: str, knob: Knob) -> str | None:
    found = _locate(text, knob)
    return found[1].group() if found else None


def _replace_on_line(text: str, knob: Knob, value: str) -> str | None:
    found = _spans(text, knob)
    if found is None:
        return None
    lines, spans = found
    row = lines[knob.line - 1]
    for match, offset in sorted(spans, key=lambda s: -s[0].start()):  # last first
        new = value if offset == 0 else str(int(value) + offset)
        row = row[: match.start()] + new + row[match.end():]
    lines[knob.line - 1] = row
    return "\n".join(lines)
