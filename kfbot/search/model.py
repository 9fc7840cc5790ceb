"""The values the search passes around: behaviour cells and evaluated individuals."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

Memory = Literal["global", "shared-tiling", "vectorized", "tensor-core"]
Sync = Literal["none", "barriers", "warp-shuffle", "atomics"]
Decomposition = Literal["thread-per-element", "warp-per-row", "block-per-row", "block-per-tile",
                        "grid-stride", "other"]


@dataclass(frozen=True, order=True)
class Cell:
    """Where a candidate sits in the MAP-Elites archive: how it does its work."""

    memory: str
    sync: str
    decomposition: str
    block: str  # a bucket of threads per block: "<=64", "128", "256", "512", "1024", "?"

    def label(self) -> str:
        return f"{self.memory}/{self.sync}/{self.decomposition}/{self.block}"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cell:
        return cls(str(data["memory"]), str(data["sync"]), str(data["decomposition"]),
                   str(data["block"]))

    def to_json(self) -> dict[str, str]:
        return asdict(self)
