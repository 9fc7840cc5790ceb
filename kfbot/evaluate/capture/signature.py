"""How an op is really called: argument records, call signatures and op references.

A `CallSignature` says what one op was called with in a repository's own tests: for
each argument a `TensorSpec` (shape, dtype, layout, device and the range of its
values), a `ScalarSpec` (a number, flag, string, dtype or device) or a `SequenceSpec`
(a list or tuple of those). Signatures are recorded by the capture plugin
(`kfbot.evaluate.capture.recorder`), stored as JSON and turned back into fresh inputs by
`kfbot.evaluate.inputs.fresh`.

Two calls have the same signature when their arguments agree on everything that
changes what a kernel does: shapes, dtypes, strides, devices and scalar values. Value
ranges and counts do not split signatures; merging sums the counts and widens the
ranges (`merge_signatures`).

This module never imports torch: kfbot's own process reads and writes these records.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias, cast

from kfbot.errors import KfbotError
from kfbot.evaluate.capture.fields import (
    as_object,
    bool_field,
    float_field,
    int_field,
    ints_field,
    str_field,
)
from kfbot.evaluate.capture.via import Via

OpKind = Literal["module", "torch_op", "callable"]
ScalarType = Literal["int", "float", "bool", "str", "none", "dtype", "device", "other"]
ScalarValue: TypeAlias = int | float | bool | str | None
SequenceType = Literal["list", "tuple"]
JsonObject: TypeAlias = dict[str, object]

SCALAR_TYPES: tuple[ScalarType, ...] = (
    "int",
    "float",
    "bool",
    "str",
    "none",
    "dtype",
    "device",
    "other",
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


# What a capture records, as a number: bumped when that changes (2: the spread of
# values; 3: the wrapper a call came through), so captures cached under the old format
# are taken again.
SIGNATURE_FORMAT = 3


@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument: its layout and, where measured, the range of its values.

    `min`/`max`/`mean`/`std` cover the finite values only (None when not measured or
    when there are none); `has_nan`/`has_inf` say whether any others were present.
    """

    shape: tuple[int, ...]
    dtype: str  # torch's name without the prefix: "float32", "int64", "bool"
    strides: tuple[int, ...]
    contiguous: bool
    device: str  # the device type: "cuda", "cpu"
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    has_nan: bool = False
    has_inf: bool = False
    requires_grad: bool = False
    storage_offset: int = 0  # in elements; it decides the data pointer's alignment
    std: float | None = None  # the population standard deviation

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> JsonObject:
        return {
            "kind": "tensor",
            "shape": list(self.shape),
            "dtype": self.dtype,
            "strides": list(self.strides),
            "storage_offset": self.storage_offset,
            "contiguous": self.contiguous,
            "device": self.device,
            "requires_grad": self.requires_grad,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "std": self.std,
            "has_nan": self.has_nan,
            "has_inf": self.has_inf,
        }

    @staticmethod
    def from_json(data: object) -> TensorSpec:
        obj = as_object(data, "tensor")
        return TensorSpec(
            shape=ints_field(obj, "shape"),
            dtype=str_field(obj, "dtype"),
            strides=ints_field(obj, "strides"),
            contiguous=bool_field(obj, "contiguous"),
            device=str_field(obj, "device"),
            min=float_field(obj, "min"),
            max=float_field(obj, "max"),
            mean=float_field(obj, "mean"),
            has_nan=bool_field(obj, "has_nan", False),
            has_inf=bool_field(obj, "has_inf", False),
            requires_grad=bool_field(obj, "requires_grad", False),
            storage_offset=int_field(obj, "storage_offset", 0),
            std=float_field(obj, "std"),
        )


@dataclass(frozen=True)
class ScalarSpec:
    """One non-tensor argument, kept by value.

    "dtype" and "device" values are their names ("float16", "cuda:0"); "other" stands
    for an object that cannot be written down, and its value is the type's name.
    """

    type: ScalarType
    value: ScalarValue = None

    def to_json(self) -> JsonObject:
        return {"kind": "scalar", "type": self.type, "value": self.value}

    @staticmethod
    def from_json(data: object) -> ScalarSpec:
        obj = as_object(data, "scalar")
        kind = str_field(obj, "type")
        if kind not in SCALAR_TYPES:
            raise KfbotError(f"signature: unknown scalar type {kind!r}")
        value = obj.get("value")
        if value is not None and not isinstance(value, (int, float, str)):
            raise KfbotError(f"signature: scalar value {value!r} is not a number or string")
        return ScalarSpec(type=kind, value=value)


@dataclass(frozen=True)
class SequenceSpec:
    """A list or tuple argument, item by item (a list of tensors, a shape...)."""

    type: SequenceType
    items: tuple[ArgSpec, ...]

    def to_json(self) -> JsonObject:
        return {"kind": "sequence", "type": self.type, "items": [a.to_json() for a in self.items]}

    @staticmethod
    def from_json(data: object) -> SequenceSpec:
        obj = as_object(data, "sequence")
        kind = str_field(obj, "type")
        if kind not in ("list", "tuple"):
            raise KfbotError(f"signature: unknown sequence type {kind!r}")
        items = obj.get("items")
        if not isinstance(items, list):
            raise KfbotError("signature: a sequence needs a list of items")
        return SequenceSpec(type=cast(SequenceType, kind), items=tuple(map(arg_from_json, items)))


ArgSpec: TypeAlias = TensorSpec | ScalarSpec | SequenceSpec


def arg_from_json(data: object) -> ArgSpec:
    """Any argument record, told apart by its "kind" field."""
    kind = as_object(data, "argument").get("kind")
    if kind == "tensor":
        return TensorSpec.from_json(data)
    if kind == "scalar":
        return ScalarSpec.from_json(data)
    if kind == "sequence":
        return SequenceSpec.from_json(data)
    raise KfbotError(f"signature: unknown argument kind {kind!r}")


@dataclass(frozen=True)
class CallSignature:
    """One distinct way an op was called, how often, and by which tests."""

    op: str  # the op's reference text, as `OpRef.text` writes it
    args: tuple[ArgSpec, ...]
    kwargs: tuple[tuple[str, ArgSpec], ...] = ()  # sorted by name
    count: int = 1
    tests: tuple[str, ...] = ()  # pytest node ids, in the order they first made this call
    via: Via | None = None  # the wrapper the test called, when the call came through one

    def tensors(self) -> list[TensorSpec]:
        """Every tensor argument, nested ones included, in argument order."""
        found: list[TensorSpec] = []
        for spec in (*self.args, *(value for _, value in self.kwargs)):
            found.extend(_tensors_in(spec))
        return found

    def to_json(self) -> JsonObject:
        return {
            "op": self.op,
            "args": [a.to_json() for a in self.args],
            "kwargs": {name: spec.to_json() for name, spec in self.kwargs},
            "count": self.count,
            "tests": list(self.tests),
            **({"via": self.via.to_json()} if self.via is not None else {}),
        }

    @staticmethod
    def from_json(data: object) -> CallSignature:
        obj = as_object(data, "signature")
        args = obj.get("args", [])
        kwargs = obj.get("kwargs", {})
        tests = obj.get("tests", [])
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise KfbotError("signature: args must be a list and kwargs an object")
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise KfbotError("signature: tests must be a list of node ids")
        return CallSignature(
            op=str_field(obj, "op"),
            args=tuple(map(arg_from_json, args)),
            kwargs=tuple((str(k), arg_from_json(kwargs[k])) for k in sorted(kwargs)),
            count=int_field(obj, "count", 1),
            tests=tuple(cast(list[str], tests)),
            via=_via(obj.get("via")),
        )


def _via(data: object) -> Via | None:
    if data is None:
        return None
    try:
        return Via.from_json(as_object(data, "via"))
    except (KeyError, TypeError, ValueError) as exc:
        raise KfbotError(f"signature: unreadable via {data!r:.80}: {exc}") from exc


def _tensors_in(spec: ArgSpec) -> list[TensorSpec]:
    if isinstance(spec, TensorSpec):
        return [spec]
    if isinstance(spec, SequenceSpec):
        return [t for item in spec.items for t in _tensors_in(item)]
    return []


@dataclass(frozen=True)
class OpRef:
    """Where an op lives, written one of three ways (`parse`, `text`):

    - "module.attr": an attribute of a module, such as a compiled extension returned
      by `torch.utils.cpp_extension.load(name="module")` or imported as `module`;
    - "torch.ops.ns.op": an op registered with TORCH_LIBRARY or `torch.library`;
    - "pkg.mod:func": a plain Python callable.
    """

    kind: OpKind
    module: str  # the module name, or the namespace for a torch op
    name: str

    @property
    def text(self) -> str:
        if self.kind == "torch_op":
            return f"torch.ops.{self.module}.{self.name}"
        if self.kind == "callable":
            return f"{self.module}:{self.name}"
        return f"{self.module}.{self.name}"

    def __str__(self) -> str:
        return self.text

    @staticmethod
    def parse(text: str) -> OpRef:
        text = text.strip()
        if ":" in text:
            module, _, name = text.partition(":")
            return _checked(OpRef("callable", module, name), text)
        if text.startswith("torch.ops."):
            parts = text.split(".")
            if len(parts) != 4:
                raise KfbotError(f"op {text!r}: write a torch op as torch.ops.<namespace>.<op>")
            return _checked(OpRef("torch_op", parts[2], parts[3]), text)
        module, _, name = text.rpartition(".")
        return _checked(OpRef("module", module, name), text)

    def to_json(self) -> JsonObject:
        return {"kind": self.kind, "module": self.module, "name": self.name}

    @staticmethod
    def from_json(data: object) -> OpRef:
        obj = as_object(data, "op reference")
        kind = str_field(obj, "kind")
        if kind not in ("module", "torch_op", "callable"):
            raise KfbotError(f"op reference: unknown kind {kind!r}")
        ref = OpRef(cast(OpKind, kind), str_field(obj, "module"), str_field(obj, "name"))
        return _checked(ref, ref.text)


def _checked(ref: OpRef, text: str) -> OpRef:
    # The name is one attribute: wrapping reaches it with a single getattr/setattr.
    module_ok = _IDENTIFIER if ref.kind == "torch_op" else _DOTTED
    if module_ok.fullmatch(ref.module) and _IDENTIFIER.fullmatch(ref.name):
        return ref
    raise KfbotError(
        f"op {text!r}: expected module.attr, torch.ops.<namespace>.<op> or pkg.mod:func"
    )


# --- dedupe and merge ---------------------------------------------------------------

ArgKey: TypeAlias = tuple[object, ...]


def arg_key(spec: ArgSpec) -> ArgKey:
    """What must agree for two arguments to count as the same (never the values)."""
    if isinstance(spec, TensorSpec):
        return (
            "tensor",
            spec.shape,
            spec.dtype,
            spec.strides,
            spec.storage_offset,
            spec.device,
            spec.requires_grad,
        )
    if isinstance(spec, SequenceSpec):
        return ("sequence", spec.type, tuple(arg_key(item) for item in spec.items))
    # repr keeps NaN equal to itself and 1.0 apart from True.
    return ("scalar", spec.type, repr(spec.value))


def signature_key(sig: CallSignature) -> tuple[object, ...]:
    """Calls with equal keys are one signature: same op, layouts and scalar values."""
    return (
        sig.op,
        tuple(arg_key(a) for a in sig.args),
        tuple((name, arg_key(spec)) for name, spec in sig.kwargs),
        sig.via.key() if sig.via is not None else None,
    )


def merge_signatures(sigs: Iterable[CallSignature]) -> tuple[CallSignature, ...]:
    """One signature per key, in first-seen order: counts summed, ranges widened."""
    merged: dict[tuple[object, ...], CallSignature] = {}
    for sig in sigs:
        key = signature_key(sig)
        seen = merged.get(key)
        merged[key] = sig if seen is None else merge_pair(seen, sig)
    return tuple(merged.values())


def merge_pair(a: CallSignature, b: CallSignature) -> CallSignature:
    """`a` and `b` (same key) as one signature."""
    if signature_key(a) != signature_key(b):
        raise ValueError(f"cannot merge different signatures of {a.op}")
    weights = (a.count, b.count)
    return replace(
        a,
        args=tuple(_merge_arg(x, y, weights) for x, y in zip(a.args, b.args, strict=True)),
        kwargs=tuple(
            (name, _merge_arg(x, y, weights))
            for (name, x), (_, y) in zip(a.kwargs, b.kwargs, strict=True)
        ),
        count=a.count + b.count,
        tests=tuple(dict.fromkeys((*a.tests, *b.tests))),
    )


def _merge_arg(a: ArgSpec, b: ArgSpec, weights: tuple[int, int]) -> ArgSpec:
    if isinstance(a, TensorSpec) and isinstance(b, TensorSpec):
        return _merge_tensor(a, b, weights)
    if isinstance(a, SequenceSpec) and isinstance(b, SequenceSpec):
        items = tuple(_merge_arg(x, y, weights) for x, y in zip(a.items, b.items, strict=True))
        return replace(a, items=items)
    return a


def _merge_tensor(a: TensorSpec, b: TensorSpec, weights: tuple[int, int]) -> TensorSpec:
    return replace(
        a,
        min=_combine(a.min, b.min, min),
        max=_combine(a.max, b.max, max),
        mean=_weighted_mean(a.mean, b.mean, weights),
        std=_pooled_std(a, b, weights),
        has_nan=a.has_nan or b.has_nan,
        has_inf=a.has_inf or b.has_inf,
    )


def _combine(
    a: float | None, b: float | None, pick: Callable[[float, float], float]
) -> float | None:
    # A side that was not measured (too large, no finite values) does not void the other.
    if a is None or b is None:
        return a if b is None else b
    return float(pick(a, b))


def _weighted_mean(a: float | None, b: float | None, weights: tuple[int, int]) -> float | None:
    if a is None or b is None:
        return a if b is None else b
    wa, wb = (max(w, 1) for w in weights)
    return (a * wa + b * wb) / (wa + wb)


def _pooled_std(a: TensorSpec, b: TensorSpec, weights: tuple[int, int]) -> float | None:
    """The standard deviation of both samples together, each weighted by its calls:
    the mean of the second moments less the square of the pooled mean."""
    if a.std is None or a.mean is None or b.std is None or b.mean is None:
        return a.std if b.std is None or b.mean is None else b.std
    mean = _weighted_mean(a.mean, b.mean, weights)
    second = _weighted_mean(a.std**2 + a.mean**2, b.std**2 + b.mean**2, weights)
    assert mean is not None and second is not None  # both sides were measured
    return math.sqrt(max(0.0, second - mean**2))


# --- strides ------------------------------------------------------------------------


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of `shape`, as torch gives a fresh tensor."""
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """torch's rule: row-major, where dimensions of size 1 may have any stride."""
    if math.prod(shape) == 0:
        return True
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True
