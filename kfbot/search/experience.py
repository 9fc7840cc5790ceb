"""The experience file: a committed Markdown record of what each tried change taught.

Every lesson is one `### Lesson:` heading followed by the same ten `- key: value` lines in
the same order, then its provenance, in a fixed order where known: the run that learnt
it, the GPU's architecture, the CUDA and torch versions it was measured with, and
`retired` once a person retired it (its run was reverted). kfbot owns those blocks, and
nothing else: the text before the first lesson (the header) and any notes between
lessons are kept verbatim. A note written after a lesson belongs to that lesson and
moves with it. The lessons are kept sorted by (kernel, gpu, change, outcome), so
appending what the file already holds changes no byte. Lessons written before
provenance was recorded read back with none.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, cast

from kfbot.errors import KfbotError

Outcome = Literal["faster", "slower", "noise", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("faster", "slower", "noise", "failed")
ORIGINS = ("params", "rules", "llm")
STAGES = ("build", "correctness", "anticheat", "runtime", "static")
# The field lines of a lesson, in the one order they are written and read.
KEYS = ("kernel", "gpu", "change", "origin", "outcome", "speedup", "stage", "reason", "date",
        "tags")
# Provenance lines after them, each where known, in this order.
PROVENANCE = ("run", "arch", "cuda", "torch", "retired")

DEFAULT_PATH = Path(".kfbot") / "experience.md"
HEADING = "### Lesson: "
EMPTY = "-"  # the value written for no speedup, no stage, no reason or no tags

HEADER = """\
# kfbot experience

What kfbot learnt trying to make this repository's CUDA kernels faster: each `### Lesson:`
block records one change tried on one kernel on one GPU, and what came of it, a measured
speedup or the stage where the change failed. Later runs read it to choose what to try
first. kfbot adds and sorts the lesson blocks and rewrites nothing else: notes written
here or between lessons stay as they are (a note after a lesson moves with that lesson).
Commit this file.
"""

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_SPACE = re.compile(r"\s+")
_OUTCOME_RANK = {"faster": 0, "noise": 1, "slower": 2, "failed": 3}


def _one_line(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


@dataclass(frozen=True)
class Lesson:
    """One tried change and its outcome. Text fields are made one line on construction,
    the speedup is rounded to 3 decimals, and tags are sorted without repeats, so a lesson
    reads back from the file equal to the one written."""

    kernel: str
    gpu: str
    change: str
    origin: str
    outcome: Outcome
    speedup: float | None
    stage: str | None
    reason: str
    date: str
    tags: tuple[str, ...] = ()
    run: str = ""  # the run folder's id (`.kfbot/runs/<run>`)
    arch: str = ""  # the GPU's compute capability, "sm_90"
    cuda: str = ""
    torch: str = ""
    retired: str = ""  # why and when it was retired; "" while it stands

    def __post_init__(self) -> None:
        for name in ("kernel", "gpu", "change", "origin", "reason", "date", *PROVENANCE):
            object.__setattr__(self, name, _one_line(str(getattr(self, name))))
        if self.reason == EMPTY:
            object.__setattr__(self, "reason", "")
        tags = {_one_line(t).replace(" ", "-") for tag in self.tags for t in tag.split(",")}
        object.__setattr__(self, "tags", tuple(sorted(tags - {"", EMPTY})))
        if self.speedup is not None:
            object.__setattr__(self, "speedup", round(float(self.speedup), 3))
        problem = _problem(self)
        if problem:
            raise LessonError(*problem)

    @property
    def failed(self) -> bool:
        return self.outcome == "failed"

    def key(self) -> tuple[str, str, str, str]:
        """What makes two lessons the same lesson: one of them is kept."""
        return (self.kernel, self.gpu, self.change, self.outcome)

    def summary(self) -> str:
        """The outcome in a few words: `1.840x faster`, `failed at build`."""
        if self.outcome == "failed":
            return f"failed at {self.stage}"
        return f"{self.speedup:.3f}x {self.outcome}"

    def toolchain(self) -> str:
        """`sm_90, CUDA 13.0, torch 2.11.0`: where it was measured; "" when unknown."""
        parts = [self.arch, f"CUDA {self.cuda}" if self.cuda else "",
                 f"torch {self.torch}" if self.torch else ""]
        return ", ".join(p for p in parts if p)

    def foreign_to(self, here: Where) -> str | None:
        """Why this lesson was not measured where `here` is (another GPU, architecture
        or toolchain, or no provenance at all); None when it was."""
        if not (self.arch and self.cuda and self.torch):
            return "no record of where it was measured"
        theirs = (self.gpu, self.arch, _minor(self.cuda), _minor(self.torch))
        ours = (here.gpu, here.arch, _minor(here.cuda), _minor(here.torch))
        if theirs == ours:
            return None
        return f"measured on {self.gpu} ({self.toolchain()}), not on this {here.gpu} " \
               f"({here.arch}, CUDA {here.cuda}, torch {here.torch})"


@dataclass(frozen=True)
class Where:
    """The GPU and toolchain a run measures on."""

    gpu: str
    arch: str
    cuda: str
    torch: str

    @staticmethod
    def of(environment: Mapping[str, Any]) -> Where:
        """From an evaluation's environment (the worker's `describe`)."""
        capability = str(environment.get("capability") or "")
        arch = f"sm_{capability.replace('.', '')}" if capability else ""
        return Where(str(environment.get("gpu") or ""), arch,
                     str(environment.get("cuda") or ""), str(environment.get("torch") or ""))


def _minor(version: str) -> str:
    """`2.11.0+cu130` -> `2.11`: patch releases keep a lesson's worth."""
    return ".".join(version.split("+")[0].split(".")[:2])


class LessonError(ValueError):
    """A lesson whose fields do not make sense; `field` names the one at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _problem(lesson: Lesson) -> tuple[str, str] | None:
    for name in ("kernel", "gpu", "change"):
        if not getattr(lesson, name) or getattr(lesson, name) == EMPTY:
            return name, f"{name} is empty"
    if lesson.origin not in ORIGINS:
        return "origin", f"origin {lesson.origin!r} is not one of {', '.join(ORIGINS)}"
    if lesson.outcome not in OUTCOMES:
        return "outcome", f"outcome {lesson.outcome!r} is not one of {', '.join(OUTCOMES)}"
    if lesson.outcome == "failed":
        if lesson.speedup is not None:
            return "speedup", "a failed lesson has no speedup"
        if lesson.stage not in STAGES:
            return "stage", f"a failed lesson needs a stage, one of {', '.join(STAGES)}"
    else:
        if lesson.speedup is None or not math.isfinite(lesson.speedup) or lesson.speedup <= 0:
            return "speedup", f"a {lesson.outcome} lesson needs a positive speedup"
        if lesson.stage is not None:
            return "stage", f"a {lesson.outcome} lesson has no stage"
    if not _DATE.fullmatch(lesson.date):
        return "date", f"date {lesson.date!r} is not YYYY-MM-DD"
    try:
        datetime.date.fromisoformat(lesson.date)
    except ValueError:
        return "date", f"date {lesson.date!r} is not a calendar date"
    return None


def _values(lesson: Lesson) -> dict[str, str]:
    return {
        "kernel": lesson.kernel,
        "gpu": lesson.gpu,
        "change": lesson.change,
        "origin": lesson.origin,
        "outcome": lesson.outcome,
        "speedup": EMPTY if lesson.speedup is None else f"{lesson.speedup:.3f}",
        "stage": lesson.stage or EMPTY,
        "reason": lesson.reason or EMPTY,
        "date": lesson.date,
        "tags": ", ".join(lesson.tags) or EMPTY,
    }


def render_lesson(lesson: Lesson) -> str:
    """The lesson's Markdown block: its heading, its ten field lines and its provenance
    lines, ending in a newline."""
    retired = " (retired)" if lesson.retired else ""
    heading = f"{HEADING}{lesson.kernel} on {lesson.gpu}, {lesson.summary()}{retired}"
    lines = [heading, *(f"- {key}: {value}" for key, value in _values(lesson).items())]
    lines += [f"- {key}: {getattr(lesson, key)}" for key in PROVENANCE if getattr(lesson, key)]
    return "\n".join(lines) + "\n"


# --- reading -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Unit:
    """A lesson and the note written after it, up to the next lesson (blank lines trimmed)."""

    lesson: Lesson
    note: tuple[str, ...]


@dataclass(frozen=True)
class _Parsed:
    header: tuple[str, ...]
    units: tuple[_Unit, ...]


def _optional_float(text: str) -> float | None:
    if text == EMPTY:
        return None
    value = float(text)  # ValueError names the text
    if not math.isfinite(value):
        raise ValueError(f"speedup {text!r} is not a finite number")
    return value


def _trim(lines: list[str]) -> tuple[str, ...]:
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return tuple(lines[start:end])


def _parse(path: Path, text: str) -> _Parsed:
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(HEADING)]
    units = []
    for n, start in enumerate(starts):
        values: dict[str, str] = {}
        for offset, key in enumerate(KEYS, 1):
            at = start + offset
            line = lines[at] if at < len(lines) and at not in starts else None
            prefix = f"- {key}:"
            if line is None or not line.startswith(prefix):
                found = "the end of the lesson" if line is None else repr(line)
                raise KfbotError(f"{path}:{at + 1}: lesson at line {start + 1}: expected "
                                 f"'- {key}: ...', found {found}")
            values[key] = line[len(prefix):].strip()
        speedup_line = start + 1 + KEYS.index("speedup")
        try:
            speedup = _optional_float(values["speedup"])
        except ValueError as exc:
            raise KfbotError(f"{path}:{speedup_line + 1}: bad speedup: {exc}") from None
        tags = values["tags"]
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        after = start + 1 + len(KEYS)
        extra, after = _provenance(lines, after, end)
        try:
            lesson = Lesson(
                kernel=values["kernel"], gpu=values["gpu"], change=values["change"],
                origin=values["origin"], outcome=cast(Outcome, values["outcome"]),
                speedup=speedup, stage=None if values["stage"] == EMPTY else values["stage"],
                reason=values["reason"], date=values["date"],
                tags=() if tags == EMPTY else tuple(tags.split(",")), **extra)
        except LessonError as exc:
            at = start + 1 + KEYS.index(exc.field) if exc.field in KEYS else start
            raise KfbotError(f"{path}:{at + 1}: bad {exc.field}: {exc}") from None
        units.append(_Unit(lesson, _trim(lines[after:end])))
    header = _trim(lines[:starts[0]] if starts else lines)
    return _Parsed(header, tuple(units))


def _provenance(lines: Sequence[str], at: int, end: int) -> tuple[dict[str, str], int]:
    """The provenance lines from `at` (each optional, in `PROVENANCE` order), and where
    the lesson's note starts."""
    found: dict[str, str] = {}
    for key in PROVENANCE:
        prefix = f"- {key}:"
        if at < end and lines[at].startswith(prefix):
            found[key] = lines[at][len(prefix):].strip()
            at += 1
    return found, at


def _read(path: Path) -> _Parsed | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise KfbotError(f"{path}: cannot read the experience file: {exc}") from None
    return _parse(path, text)


def read_lessons(path: Path) -> list[Lesson]:
    """The file's lessons in file order; [] if there is no file. A malformed lesson block
    is a KfbotError naming `file:line` and what is wrong."""
    parsed = _read(path)
    return [] if parsed is None else [unit.lesson for unit in parsed.units]


# --- writing -------------------------------------------------------------------------------

def _sort_key(unit: _Unit) -> tuple[str, str, str, int, str]:
    lesson = unit.lesson
    return (*lesson.key()[:3], OUTCOMES.index(lesson.outcome), lesson.date)


def _render(parsed: _Parsed) -> str:
    header = "\n".join(parsed.header) + "\n" if parsed.header else HEADER
    blocks = []
    for unit in sorted(parsed.units, key=_sort_key):
        block = render_lesson(unit.lesson)
        if unit.note:
            block += "\n" + "\n".join(unit.note) + "\n"
        blocks.append(block)
    return "\n".join([header, *blocks])


def append_lessons(path: Path, lessons: Sequence[Lesson]) -> int:
    """Add lessons to the file, creating it (and its folders) with a header if need be, and
    return how many were new. A lesson with the key (kernel, gpu, change, outcome) of one
    already there replaces it only if dated later, keeping the note after it; otherwise it
    is dropped. Text outside lesson blocks is never changed; an unchanged file is not
    written at all."""
    before = path.read_text(encoding="utf-8") if path.is_file() else None
    parsed = _read(path) or _Parsed((), ())
    units = list(parsed.units)
    where = {unit.lesson.key(): i for i, unit in enumerate(units)}
    added = 0
    for lesson in lessons:
        i = where.get(lesson.key())
        if i is None:
            where[lesson.key()] = len(units)
            units.append(_Unit(lesson, ()))
            added += 1
        elif lesson.date > units[i].lesson.date and not units[i].lesson.retired:
            units[i] = _Unit(lesson, units[i].note)
    text = _render(_Parsed(parsed.header, tuple(units)))
    if text != before:
        _write_atomic(path, text)
    return added


def _write_atomic(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise KfbotError(f"{path}: cannot write the experience file: {exc}") from None


# --- choosing ------------------------------------------------------------------------------

def relevant(lessons: Sequence[Lesson], kernel: str, gpu: str, tags: Sequence[str] = (),
             limit: int = 12) -> list[Lesson]:
    """The `limit` lessons most worth showing for `kernel` on `gpu`, best first.

    Tiers: the same kernel; then another kernel on the same GPU sharing a tag; then one on
    the same GPU or sharing a tag; then the rest. Within a tier: faster, noise, slower,
    failed; then the same GPU, more shared tags, the larger speedup, the later date, and
    finally the lesson's own fields, so the order never depends on the input order."""
    wanted = {_one_line(t).replace(" ", "-") for tag in tags for t in tag.split(",")} - {""}

    def rank(lesson: Lesson) -> tuple[int, int, int, int, float, int, tuple[str, ...]]:
        shared = len(wanted.intersection(lesson.tags))
        same_gpu = lesson.gpu == gpu
        if lesson.kernel == kernel:
            tier = 0
        elif same_gpu and shared:
            tier = 1
        elif same_gpu or shared:
            tier = 2
        else:
            tier = 3
        when = datetime.date.fromisoformat(lesson.date).toordinal()
        return (tier, _OUTCOME_RANK[lesson.outcome], not same_gpu, -shared,
                -(lesson.speedup or 0.0), -when, tuple(_values(lesson).values()))

    return sorted(lessons, key=rank)[:max(limit, 0)]


# --- retiring ------------------------------------------------------------------------------

def retire_lessons(path: Path, wanted: Callable[[Lesson], bool], why: str, date: str
                   ) -> list[Lesson]:
    """Mark the lessons `wanted` picks (and not retired yet) retired, with `date: why`;
    the lessons retired. They stay in the file, read by people, and are never shown to
    a search again."""
    parsed = _read(path)
    if parsed is None:
        return []
    done: list[Lesson] = []
    units = []
    for unit in parsed.units:
        lesson = unit.lesson
        if wanted(lesson) and not lesson.retired:
            lesson = replace(lesson, retired=f"{date}: {why}")
            done.append(lesson)
        units.append(_Unit(lesson, unit.note))
    if done:
        _write_atomic(path, _render(_Parsed(parsed.header, tuple(units))))
    return done


def candidate_tag(digest: str) -> str:
    """The tag naming the candidate a lesson came from (its hash's first 10 digits)."""
    return f"candidate-{digest[:10]}"
