"""What a run folder holds for `kfbot reproduce`, and reading it back.

A run writes `report.json` and `best.patch` into `.kfbot/runs/<run id>/`. Besides the
report, `report.json` records what a reproduction needs: the commit the run started
from and the folder of the kernel's repository inside it, which of the files the
build reads differed from that commit (a patch made from them would not reproduce
what was measured), the committed candidate's hash and patch, and for each benchmark
shape its call signature and the reported speedup. Everything else about the run
(the history, the chart) is for people.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfbot import git
from kfbot.errors import EXIT_USAGE, KfbotError
from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.reproduce.model import Reproduction, Request, Shape

SCHEMA = 2
REPORT = "report.json"
PATCH = "best.patch"
# A stopped run's fastest verified candidate, before it was timed again: never committed.
UNCONFIRMED_PATCH = "unconfirmed.patch"
REPRODUCTION = "reproduction.json"


@dataclass(frozen=True)
class Base:
    """The commit a run started from, as seen from the kernel's repository folder."""

    commit: str | None  # None: the folder is in no git repository with a commit
    prefix: str  # the task root inside the repository, "" or "sub/dir/"
    changed: tuple[str, ...] = ()  # files the build reads that differed from the commit

    def to_json(self) -> dict[str, Any]:
        return {"commit": self.commit, "root": self.prefix, "changed": list(self.changed)}


def base_of(root: Path, paths: Iterable[str]) -> Base:
    """HEAD of the repository holding `root`, and which of `paths` (relative to `root`)
    differ from it in the working tree."""
    try:
        place = git.locate(root)
    except git.GitError:
        return Base(None, "")
    commit = git.commit_of(place.top, "HEAD")
    if commit is None:
        return Base(None, place.prefix)
    wanted = sorted({place.prefix + p for p in paths})
    if not wanted:
        return Base(commit, place.prefix)
    edited = git.text(place.top, "diff", "--name-only", "-z", "HEAD", "--", *wanted)
    added = git.text(place.top, "ls-files", "-z", "--others", "--exclude-standard", "--",
                     *wanted)
    changed = sorted({p.removeprefix(place.prefix)
                      for p in f"{edited}\0{added}".split("\0") if p})
    return Base(commit, place.prefix, tuple(changed))


@dataclass(frozen=True)
class RunRecord:
    """What `kfbot reproduce` reads from a run folder."""

    folder: Path
    kernel_name: str
    request: Request  # the patch on its base commit, and the reported figures
    environment: Mapping[str, Any]  # where the run measured


def read_record(folder: Path) -> RunRecord:
    """The run folder's record; a `KfbotError` saying what is missing and where."""
    path = folder / REPORT
    if not path.is_file():
        raise KfbotError(f"{folder}: no {REPORT}: not a kfbot run folder "
                         "(.kfbot/runs/<run id>/)", EXIT_USAGE)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise KfbotError(f"{path}: not valid JSON: {exc}", EXIT_USAGE) from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else None
        raise KfbotError(f"{path}: written by another kfbot version (schema {found}, this "
                         f"kfbot reads {SCHEMA}): run the search again", EXIT_USAGE)
    best, candidate = data.get("best"), data.get("candidate")
    if not best or not candidate:
        raise KfbotError(f"{path}: the run committed no candidate, so there is nothing to "
                         "reproduce", EXIT_USAGE)
    base = _base(data.get("base"), path)
    request = Request(folder, base.commit or "", base.prefix, _patch(folder, data),
                      str(data["kernel"]), str(candidate), _shapes(best, path), base.changed)
    return RunRecord(folder, str(data.get("kernel_name") or data["kernel"]), request,
                     dict(best.get("environment") or {}))


def _patch(folder: Path, data: Mapping[str, Any]) -> str:
    patch = folder / str(data.get("patch") or PATCH)
    if not patch.is_file():
        raise KfbotError(f"{patch}: missing: the run folder must hold the committed patch",
                         EXIT_USAGE)
    return patch.read_text(encoding="utf-8")


def _base(data: Any, path: Path) -> Base:
    if not isinstance(data, dict) or not data.get("commit"):
        raise KfbotError(f"{path}: no base commit recorded: the repository had no git commit "
                         "when the run began, so there is nothing to apply the patch to",
                         EXIT_USAGE)
    return Base(str(data["commit"]), str(data.get("root") or ""),
                tuple(str(c) for c in data.get("changed") or ()))


def _shapes(best: Mapping[str, Any], path: Path) -> tuple[Shape, ...]:
    shapes = []
    for timing in best.get("timings") or []:
        if not timing.get("signature"):
            raise KfbotError(f"{path}: shape {timing.get('input')!r} has no call signature "
                             "recorded", EXIT_USAGE)
        shapes.append(Shape(str(timing["input"]), CallSignature.from_json(timing["signature"]),
                            float(timing["speedup"])))
    if not shapes:
        raise KfbotError(f"{path}: the committed candidate has no benchmark shapes",
                         EXIT_USAGE)
    return tuple(shapes)


def reproduce_run(folder: Path, cache: Path, gpu: int | None = None) -> Reproduction:
    """Reproduce the run in `folder` and keep the figures there (`reproduction.json`)."""
    from kfbot.evaluate.reproduce.remeasure import reproduce  # the engine only when reproducing

    found = reproduce(read_record(folder).request, cache, gpu)
    (folder / REPRODUCTION).write_text(json.dumps(found.to_json(), indent=1) + "\n",
                                       encoding="utf-8")
    return found
