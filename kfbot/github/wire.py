"""Frozen dataclasses as JSON and back, strictly: what one job hands another.

    data = dump(evaluation)                        # plain JSON values
    evaluation = load(Evaluation, data, "evaluation")

The publish job reads what the GPU job wrote, and code the GPU job ran could have
written it, so reading is driven by the dataclass field types and checks every value:
a missing field, an unknown key or a value of the wrong type is a `WireError` naming
where (`evaluation.timings[0].speedup.ratio: expected a number, got 'fast'`), never an
object half built.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from kfbot.errors import EXIT_USAGE, KfbotError

T = TypeVar("T")


class WireError(KfbotError):
    """A value read from another job does not have the shape kfbot wrote."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


def dump(value: Any) -> Any:
    """`value` as JSON values: dataclasses as objects of their init fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.init}
    if isinstance(value, Mapping):
        return {str(k): dump(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [dump(v) for v in value]
    return value


def load(cls: type[T], data: Any, where: str) -> T:
    """`data` (as `dump` wrote it) as a `cls`; a WireError naming the first bad value."""
    return _load(cls, data, where)  # type: ignore[no-any-return]


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _load(tp: Any, data: Any, where: str) -> Any:
    if tp is Any:
        return data
    origin = get_origin(tp)
    if origin is Literal:
        if data not in get_args(tp):
            choices = ", ".join(repr(a) for a in get_args(tp))
            raise WireError(f"{where}: expected one of {choices}, got {_shown(data)}")
        return data
    if origin in (Union, types.UnionType):
        return _union(tp, data, where)
    if origin is tuple:
        return _tuple(tp, data, where)
    if origin is list:
        items = enumerate(_list(data, where))
        return [_load(get_args(tp)[0], item, f"{where}[{i}]") for i, item in items]
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return _mapping(tp, data, where)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass(tp, data, where)
    return _scalar(tp, data, where)


def _scalar(tp: Any, data: Any, where: str) -> Any:
    if tp is type(None) and data is None:
        return None
    if tp is bool and isinstance(data, bool):
        return data
    if tp is int and isinstance(data, int) and not isinstance(data, bool):
        return data
    if tp is float and isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    if tp is str and isinstance(data, str):
        return data
    names = {type(None): "null", bool: "true or false", int: "a whole number",
             float: "a number", str: "a string"}
    if tp not in names:
        raise TypeError(f"{where}: the wire format has no reader for {tp!r}")
    raise WireError(f"{where}: expected {names[tp]}, got {_shown(data)}")


def _union(tp: Any, data: Any, where: str) -> Any:
    options = get_args(tp)
    if data is None and type(None) in options:
        return None
    errors = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _load(option, data, where)
        except WireError as exc:
            errors.append(str(exc))
    raise WireError(errors[0] if len(errors) == 1 else
                    f"{where}: matches none of its types: {'; '.join(errors)}")


def _list(data: Any, where: str) -> list[Any]:
    if not isinstance(data, list):
        raise WireError(f"{where}: expected a list, got {_shown(data)}")
    return data


def _tuple(tp: Any, data: Any, where: str) -> tuple[Any, ...]:
    data = _list(data, where)
    args = get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_load(args[0], item, f"{where}[{i}]") for i, item in enumerate(data))
    if len(data) != len(args):
        raise WireError(f"{where}: expected {len(args)} items, got {len(data)}")
    pairs = enumerate(zip(args, data, strict=True))
    return tuple(_load(a, item, f"{where}[{i}]") for i, (a, item) in pairs)


def _mapping(tp: Any, data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise WireError(f"{where}: expected an object, got {_shown(data)}")
    args = get_args(tp)
    value_type = args[1] if len(args) == 2 else Any
    return {str(k): _load(value_type, v, f"{where}.{k}") for k, v in data.items()}


def _dataclass(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise WireError(f"{where}: expected an object, got {_shown(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise WireError(f"{where}: unknown field {unknown[0]!r}")
    hints = _hints(cls)
    values = {}
    for name, f in fields.items():
        if name in data:
            values[name] = _load(hints[name], data[name], f"{where}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise WireError(f"{where}.{name}: missing")
    return cls(**values)


def _shown(data: Any) -> str:
    if isinstance(data, float) and not math.isfinite(data):
        return str(data)
    text = repr(data)
    return text if len(text) <= 60 else text[:59] + "…"
