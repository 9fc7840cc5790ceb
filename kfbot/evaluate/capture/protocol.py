"""The capture protocol: what kfbot asks of a process it runs under the recorder
(`CaptureRequest`, in the `KFBOT_CAPTURE` environment variable) and what the recorder
writes back (`CaptureFile`).

This module never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kfbot.errors import KfbotError
from kfbot.evaluate.capture.fields import as_object, int_field, str_field
from kfbot.evaluate.capture.signature import CallSignature, JsonObject, OpRef, merge_signatures

# The environment variable that switches the capture plugin on and carries its request.
CAPTURE_ENV = "KFBOT_CAPTURE"


DEFAULT_MAX_CALLS = 500


@dataclass(frozen=True)
class CaptureRequest:
    """What the capture plugin records (`ops`), where it writes (`out`), and how much."""

    ops: tuple[OpRef, ...]
    out: str
    max_calls: int = DEFAULT_MAX_CALLS  # recorded calls per op; later calls are only counted
    mutant: str | None = None  # replace each op's result with this trivial mutant of it
    # Wrappers the tests call (`pkg:fused_gelu`): the op's calls inside one record how
    # its arguments reached the op (`kfbot.evaluate.capture.via`).
    outer: tuple[OpRef, ...] = ()

    def to_json(self) -> JsonObject:
        return {
            "ops": [r.to_json() for r in self.ops],
            "out": self.out,
            "max_calls": self.max_calls,
            **({"mutant": self.mutant} if self.mutant else {}),
            **({"outer": [r.to_json() for r in self.outer]} if self.outer else {}),
        }

    @staticmethod
    def from_json(data: object) -> CaptureRequest:
        obj = as_object(data, "capture request")
        ops = obj.get("ops")
        if not isinstance(ops, list) or not ops:
            raise KfbotError("capture request: ops must be a non-empty list")
        return CaptureRequest(
            ops=tuple(map(OpRef.from_json, ops)),
            out=str_field(obj, "out"),
            max_calls=int_field(obj, "max_calls", DEFAULT_MAX_CALLS),
            mutant=_optional_mutant(obj.get("mutant")),
            outer=tuple(map(OpRef.from_json, _list(obj.get("outer", [])))),
        )


@dataclass(frozen=True)
class CaptureFile:
    """What the plugin writes: the signatures, call counts per op, and what went wrong.

    `op_calls` counts every call, recorded or not; `raised_calls` those that raised,
    which are counted but never become signatures (tests call ops with bad inputs on
    purpose, inside `pytest.raises`). `found` names the ops that were wrapped.
    """

    signatures: tuple[CallSignature, ...] = ()
    op_calls: tuple[tuple[str, int], ...] = ()
    raised_calls: tuple[tuple[str, int], ...] = ()
    errors: tuple[str, ...] = ()
    found: tuple[str, ...] = ()

    @property
    def calls(self) -> int:
        return sum(n for _, n in self.op_calls)

    def merged(self, other: CaptureFile) -> CaptureFile:
        """Both files as one (the parts written by separate pytest-xdist workers)."""
        return CaptureFile(
            signatures=merge_signatures((*self.signatures, *other.signatures)),
            op_calls=_sum_counts(self.op_calls, other.op_calls),
            raised_calls=_sum_counts(self.raised_calls, other.raised_calls),
            errors=tuple(dict.fromkeys((*self.errors, *other.errors))),
            found=tuple(dict.fromkeys((*self.found, *other.found))),
        )

    def to_json(self) -> JsonObject:
        return {
            "signatures": [s.to_json() for s in self.signatures],
            "calls": self.calls,
            "op_calls": dict(self.op_calls),
            "raised_calls": dict(self.raised_calls),
            "errors": list(self.errors),
            "found": list(self.found),
        }

    @staticmethod
    def from_json(data: object) -> CaptureFile:
        obj = as_object(data, "capture file")
        signatures = obj.get("signatures", [])
        errors = obj.get("errors", [])
        found = obj.get("found", [])
        if not isinstance(signatures, list):
            raise KfbotError("capture file: signatures must be a list")
        if not isinstance(errors, list) or not isinstance(found, list):
            raise KfbotError("capture file: errors and found must be lists")
        return CaptureFile(
            signatures=tuple(map(CallSignature.from_json, signatures)),
            op_calls=_counts(obj, "op_calls"),
            raised_calls=_counts(obj, "raised_calls"),
            errors=tuple(str(e) for e in errors),
            found=tuple(str(op) for op in found),
        )


def _counts(obj: Mapping[str, object], field: str) -> tuple[tuple[str, int], ...]:
    counts = as_object(obj.get(field, {}), field)
    return tuple((name, int_field(counts, name)) for name in counts)


def _sum_counts(
    a: Sequence[tuple[str, int]], b: Sequence[tuple[str, int]]
) -> tuple[tuple[str, int], ...]:
    total = dict(a)
    for name, n in b:
        total[name] = total.get(name, 0) + n
    return tuple(total.items())


def _list(data: object) -> list[object]:
    if not isinstance(data, list):
        raise KfbotError("capture request: outer must be a list")
    return data


def _optional_mutant(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise KfbotError("capture request: mutant must be a string")
