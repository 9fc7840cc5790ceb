"""A candidate: the edited files plus parameter values, content-hashed.

The hash is the identity used everywhere: the build cache key, the search's
duplicate check and the name of the built module, so two candidates with the
same text and parameters are never built or evaluated twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

# A candidate's extra nvcc flags travel as this param (e.g. "--use_fast_math"); it is
# passed to device-code compiles as flags, never as a -D define.
NVCC_FLAGS_PARAM = "KFBOT_NVCC_FLAGS"


def nvcc_flags(params: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(params.get(NVCC_FLAGS_PARAM, "").split())


CandidateOrigin = Literal["original", "params", "rules", "llm", "migrant", "user"]


@dataclass(frozen=True)
class Candidate:
    files: Mapping[str, str] = field(default_factory=dict)  # rel path -> full new text
    params: Mapping[str, str] = field(default_factory=dict)  # tunable name -> value (-D)
    origin: CandidateOrigin = "original"
    parent: str | None = None  # hash of the parent candidate
    rationale: str = ""

    @property
    def hash(self) -> str:
        return content_hash(self.files, self.params)

    @property
    def short(self) -> str:
        return self.hash[:10]

    def to_json(self) -> dict[str, object]:
        return {"files": dict(self.files), "params": dict(self.params), "origin": self.origin,
                "parent": self.parent, "rationale": self.rationale, "hash": self.hash}


def content_hash(files: Mapping[str, str], params: Mapping[str, str]) -> str:
    """Stable over dict order; only the content counts, not the origin or rationale."""
    blob = json.dumps({"files": dict(sorted(files.items())),
                       "params": dict(sorted(params.items()))}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


ORIGINAL = Candidate()
