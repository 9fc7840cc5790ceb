"""Fields of the capture's JSON records, read strictly: a wrong type is a KfbotError
that names the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from kfbot.errors import KfbotError


def as_object(data: object, what: str) -> Mapping[str, object]:
    if not isinstance(data, dict):
        raise KfbotError(f"signature: a {what} must be a JSON object, got {type(data).__name__}")
    return cast(Mapping[str, object], data)


def str_field(obj: Mapping[str, object], field: str) -> str:
    value = obj.get(field)
    if not isinstance(value, str):
        raise KfbotError(f"signature: field {field!r} must be a string")
    return value


def bool_field(obj: Mapping[str, object], field: str, default: bool | None = None) -> bool:
    value = obj.get(field, default)
    if not isinstance(value, bool):
        raise KfbotError(f"signature: field {field!r} must be true or false")
    return value


def int_field(obj: Mapping[str, object], field: str, default: int | None = None) -> int:
    value = obj.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise KfbotError(f"signature: field {field!r} must be an integer")
    return value


def float_field(obj: Mapping[str, object], field: str) -> float | None:
    value = obj.get(field)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise KfbotError(f"signature: field {field!r} must be a number or null")
    return float(value)


def ints_field(obj: Mapping[str, object], field: str) -> tuple[int, ...]:
    value = obj.get(field)
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise KfbotError(f"signature: field {field!r} must be a list of integers")
    return tuple(cast(list[int], value))
