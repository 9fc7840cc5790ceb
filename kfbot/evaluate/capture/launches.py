"""What a test process under observation writes, and how kfbot asks for it.

The request travels in the `KFBOT_OBSERVE` environment variable as JSON:

    {"out": "/tmp/kfbot-capture-x/observed.3.jsonl", "profile": true, "poison": false}

`profile`: record the CUDA kernels each test launches (torch's profiler, inside the
test process); `poison`: fill the allocator's free memory with NaN before each test and
each recorded op call, so that an output a kernel did not write holds NaN (the mutant
runs). The process appends one JSON line per test as the test ends, so a process that
crashes or is killed keeps every line written before.

This module imports neither torch nor pytest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

OBSERVE_ENV = "KFBOT_OBSERVE"
Outcome = Literal["passed", "failed", "error", "skipped", "crashed"]
OUTCOMES: tuple[Outcome, ...] = ("passed", "failed", "error", "skipped", "crashed")


@dataclass(frozen=True)
class ObserveRequest:
    out: str
    profile: bool = True
    poison: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"out": self.out, "profile": self.profile, "poison": self.poison}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> ObserveRequest:
        return ObserveRequest(str(data["out"]), bool(data.get("profile", True)),
                              bool(data.get("poison", False)))


def request_from_environment() -> ObserveRequest | None:
    text = os.environ.get(OBSERVE_ENV)
    return ObserveRequest.from_json(json.loads(text)) if text else None


@dataclass(frozen=True)
class Launch:
    """A kernel one test launched: its name as the profiler gives it, the recorded op
    it was launched inside (None: outside every recorded op call), and how often."""

    name: str
    op: str | None = None
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "op": self.op, "count": self.count}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Launch:
        op = data.get("op")
        return Launch(str(data["name"]), str(op) if op is not None else None,
                      int(data.get("count", 1)))


@dataclass(frozen=True)
class RunRecord:
    """One test (a pytest node, or a whole script) as it ran under observation."""

    test: str  # the node id, or the script's repository path
    outcome: Outcome
    launches: tuple[Launch, ...] = ()
    # The extension modules loaded while it ran, by name, and where their file is.
    libraries: tuple[tuple[str, str], ...] = ()
    profiled: bool = False  # the profiler ran (CUDA was there and it started)
    note: str = ""  # why the profiler did not run, or what went wrong around it

    def to_json(self) -> dict[str, Any]:
        return {"test": self.test, "outcome": self.outcome,
                "launches": [k.to_json() for k in self.launches],
                "libraries": [list(x) for x in self.libraries], "profiled": self.profiled,
                "note": self.note}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> RunRecord:
        said = str(data.get("outcome", "error"))
        outcome: Outcome = next((o for o in OUTCOMES if o == said), "error")
        return RunRecord(
            test=str(data["test"]),
            outcome=outcome,
            launches=tuple(Launch.from_json(k) for k in data.get("launches", [])),
            libraries=tuple((str(a), str(b)) for a, b in data.get("libraries", [])),
            profiled=bool(data.get("profiled", False)),
            note=str(data.get("note", "")),
        )


def append(path: Path, record: RunRecord) -> None:
    """One line, written whole: a process killed mid-test leaves the lines before."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record.to_json()) + "\n")


def read(paths: Sequence[Path]) -> list[RunRecord]:
    """Every complete line of the files; a last line cut short by a crash is dropped."""
    out = []
    for path in paths:
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                out.append(RunRecord.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue
    return out
