"""The evaluation engine's vocabulary: diagnostics and resource records.

A bad candidate is data, never an exception: every stage reports what it found as
`Diagnostic` records that the search feeds into its next mutations and the reports
show to people.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Stage = Literal["build", "static", "correctness", "anticheat", "benchmark", "runtime"]
Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Diagnostic:
    """One finding: the stage, a kind a program can switch on, and a one-line reason."""

    stage: Stage
    kind: str  # e.g. "compile_error", "resources", "mismatch", "timeout", "illegal_address"
    message: str  # one line a person (or an LLM) can act on
    severity: Severity = "error"
    file: str | None = None
    line: int | None = None
    details: tuple[tuple[str, str], ...] = ()  # extra key/value facts, as text


@dataclass(frozen=True)
class KernelResources:
    """ptxas resource usage of one compiled kernel (from `-Xptxas -v`)."""

    kernel: str  # demangled name where possible
    mangled: str
    arch: str  # e.g. "sm_90"
    registers: int
    shared_bytes: int = 0
    constant_bytes: int = 0
    stack_frame_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    barriers: int = 0
