"""`json.dumps(value, indent=n)`, byte for byte, at the speed of the C encoder.

The standard library encodes with an indent in pure Python, one generator step per
value: for a scan of thousands of kernels that is most of the time it takes to write
the report. Its C encoder writes no indent, but takes any item separator, so a
container whose items all sit at one depth can be written by one C call whose
separator carries the line break and the indent of that depth. Nested containers are
written first, bottom up, and passed to the C call as `JsonText`: the C encoder hands
every string to the encoder function it was built with, and ours returns a `JsonText`
as it is.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from functools import cache
from json.encoder import encode_basestring_ascii
from typing import Any, TypeAlias

Container: TypeAlias = dict[Any, Any] | list[Any] | tuple[Any, ...]
Encode: TypeAlias = Callable[[Any, int], list[str]]

# The C encoder's constructor: a private name of the json package, None (or missing)
# where the _json accelerator is not built; then json.dumps does the work.
c_make_encoder: Callable[..., Encode] | None = getattr(json.encoder, "c_make_encoder", None)
ACCELERATED = c_make_encoder is not None  # else JsonText values are not supported
_CONTAINERS = (dict, list, tuple)


class JsonText(str):
    """JSON text already written by `dumps_indented` for the depth it is placed at,
    which copies it into the output unchanged (only where ACCELERATED)."""

    __slots__ = ()


def dumps_indented(value: Any, indent: int = 1, depth: int = 0) -> str:
    """The text `json.dumps(value, indent=indent)` gives, for acyclic data; with `depth`,
    as it is written `depth` levels down in a larger document.

    Only the defaults of `json.dumps` are supported (ASCII output, keys in insertion
    order, NaN allowed).
    """
    if c_make_encoder is None:
        # Line breaks in the output are all between items: strings hold none.
        return json.dumps(value, indent=indent).replace("\n", "\n" + " " * (indent * depth))
    writer = _writer(indent)
    if value and isinstance(value, _CONTAINERS):
        return writer.render(value, depth)
    (text,) = writer.plain(depth)(value, 0)
    return text


@cache
def _writer(indent: int) -> _Writer:
    return _Writer(indent)


class _Writer:
    """C encoders by depth, each writing the separators of the items at its depth."""

    def __init__(self, indent: int) -> None:
        self.indent = indent
        self._plain: list[Encode] = []  # strings encoded by the C encoder itself
        self._raw: list[Encode] = []  # strings through `_encode_string`: slower
        self._breaks: list[str] = []  # "\n" and the indent of each depth

    def render(self, value: Container, depth: int) -> str:
        """A non-empty container whose opening bracket sits `depth` levels down."""
        for item in value.values() if isinstance(value, dict) else value:
            # Empty containers are written alike with or without an indent.
            if (item and isinstance(item, _CONTAINERS)) or type(item) is JsonText:
                (text,) = self.raw(depth + 1)(self._with_raw_items(value, depth), 0)
                break
        else:  # most containers: records, lists of strings
            (text,) = self.plain(depth + 1)(value, 0)
        return text[0] + self._breaks[depth + 1] + text[1:-1] + self._breaks[depth] + text[-1]

    def _with_raw_items(self, value: Container, depth: int) -> dict[Any, Any] | list[Any]:
        """A shallow copy of `value` whose non-empty containers are written as JsonText."""
        if isinstance(value, dict):
            return {key: JsonText(self.render(item, depth + 1))
                    if item and isinstance(item, _CONTAINERS) else item
                    for key, item in value.items()}
        return [JsonText(self.render(item, depth + 1))
                if item and isinstance(item, _CONTAINERS) else item for item in value]

    def plain(self, depth: int) -> Encode:
        self._grow(depth)
        return self._plain[depth]

    def raw(self, depth: int) -> Encode:
        self._grow(depth)
        return self._raw[depth]

    def _grow(self, depth: int) -> None:
        assert c_make_encoder is not None
        while len(self._breaks) <= depth:
            level = len(self._breaks)
            self._breaks.append("\n" + " " * (self.indent * level))
            for encoders, strings in ((self._plain, encode_basestring_ascii),
                                      (self._raw, _encode_string)):
                encoders.append(c_make_encoder(
                    None,  # markers: no circular-reference check
                    json.JSONEncoder().default,  # raises TypeError for what JSON cannot hold
                    strings,
                    None,  # indent: none, the item separator carries it
                    ": ", "," + self._breaks[level],
                    False, False, True))  # sort_keys, skipkeys, allow_nan: as json.dumps


def _encode_string(s: str) -> str:
    return s if type(s) is JsonText else encode_basestring_ascii(s)
