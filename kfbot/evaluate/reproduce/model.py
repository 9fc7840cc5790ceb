"""What a reproduction is asked, and what it found: the reported speedups beside the
re-measured ones.

`kfbot reproduce` applies a run's committed patch to a clean copy of its base commit,
builds both, and times them with a second timing path in a fresh worker. The figures
come back as a `Reproduction`, which the pull request body shows and the publisher
reads: a reproduced speedup more than `TOLERANCE` below the reported one blocks it.
Plain values only, so the comment bot can read them without the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.verdict.stats import geometric_mean

# A reproduction may fall this far below the reported speedup (a fraction of it).
TOLERANCE = 0.05


@dataclass(frozen=True)
class Shape:
    """One benchmark shape of the committed candidate, as the run reported it."""

    label: str
    signature: CallSignature
    reported: float  # original / candidate


@dataclass(frozen=True)
class Request:
    """What to reproduce: a patch on a commit, and the figures reported for it."""

    repository: Path  # any folder inside the repository the run was made in
    commit: str
    prefix: str  # the kernel's repository folder inside it, "" or "sub/dir/"
    patch: str
    kernel_id: str
    candidate: str  # the content hash the run reported
    shapes: tuple[Shape, ...]
    changed: tuple[str, ...] = ()  # files that differed from the commit when the run began


@dataclass(frozen=True)
class ShapeFigures:
    """One benchmark shape: the search's speedup and the second timer's."""

    shape: str  # the label the report used, e.g. "(4096, 1024) float32"
    reported: float  # original / candidate, as the run reported it
    reproduced: float  # original / candidate, re-measured
    original_us: float  # the second timer's medians
    candidate_us: float
    samples: int = 0  # timed calls of each

    def to_json(self) -> dict[str, Any]:
        return {"shape": self.shape, "reported": self.reported, "reproduced": self.reproduced,
                "original_us": self.original_us, "candidate_us": self.candidate_us,
                "samples": self.samples}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShapeFigures:
        return cls(str(data["shape"]), float(data["reported"]), float(data["reproduced"]),
                   float(data["original_us"]), float(data["candidate_us"]),
                   int(data.get("samples", 0)))


@dataclass(frozen=True)
class Reproduction:
    """The whole reproduction of one committed candidate."""

    candidate: str  # the content hash of the candidate the run committed
    shapes: tuple[ShapeFigures, ...]
    method: str  # how it was timed, in a line
    environment: Mapping[str, Any] = field(default_factory=dict)

    @property
    def reported(self) -> float:
        """The geometric mean over the shapes, as the report's headline has it."""
        return geometric_mean([s.reported for s in self.shapes]) if self.shapes else 0.0

    @property
    def reproduced(self) -> float:
        return geometric_mean([s.reproduced for s in self.shapes]) if self.shapes else 0.0

    @property
    def agrees(self) -> bool:
        """Not more than TOLERANCE below the reported speedup (a higher one never makes
        the report overstate anything)."""
        return bool(self.shapes) and self.reproduced >= self.reported * (1 - TOLERANCE)

    def summary(self) -> str:
        gap = self.reproduced / self.reported - 1 if self.reported > 0 else 0.0
        word = "agrees with" if self.agrees else "falls short of"
        return (f"reproduced {self.reproduced:.2f}x against the reported {self.reported:.2f}x "
                f"({gap:+.1%}): {word} the report (at most {TOLERANCE:.0%} below)")

    def to_json(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "method": self.method,
                "shapes": [s.to_json() for s in self.shapes],
                "speedup": {"reported": self.reported, "reproduced": self.reproduced},
                "agrees": self.agrees, "tolerance": TOLERANCE,
                "environment": dict(self.environment)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Reproduction:
        return cls(str(data["candidate"]),
                   tuple(ShapeFigures.from_json(s) for s in data.get("shapes", [])),
                   str(data.get("method", "")), dict(data.get("environment", {})))

