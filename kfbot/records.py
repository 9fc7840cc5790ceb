"""YAML files read strictly into frozen dataclasses, every mistake named with its line.

Parsing goes through `yaml.compose` rather than `yaml.safe_load` so every value keeps
its line: a mistake is reported as `kfbot.yaml:7: tasks[0].tolerence: unknown key`,
not as a stack trace or a silently ignored key. The loader is driven by the dataclass
field types, so a new section or a new kind of data file is just a new dataclass;
values that need more than a type are `Annotated` with a `Check`. The repository's
config (`kfbot.config`) and the data files kfbot ships (`kfbot.datafiles`) both go
through it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from kfbot.errors import KfbotError

_LOADER = "kfbot.loader"
_KEY = "kfbot.key"
SOURCE_LINE = {_LOADER: "line"}  # set to the 1-based line the field's mapping starts on
NOT_YAML = {_LOADER: "skip"}  # left at its default; set after loading (e.g. `Config.path`)

T = TypeVar("T")


@dataclass(frozen=True)
class Check:
    """`Annotated` metadata: `problem(value)` says why a converted value is invalid, or None."""

    problem: Callable[[Any], str | None]


# `Annotated` metadata: accept any string or number and keep the text as written, so a
# define like `VEC: 0x10` reaches the compiler as `-DVEC=0x10`, not `-DVEC=16`.
AS_TEXT = "kfbot.as_text"


def suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (expected one of: {', '.join(choices)})"


def yaml_key(name: str) -> dict[str, str]:
    """Field metadata: the field is written `name` in YAML (e.g. `applies-when`)."""
    return {_KEY: name}


def read_text(path: Path, shown: str) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise KfbotError(f"{shown}: not valid UTF-8") from None
    except OSError as err:
        raise KfbotError(f"{shown}: cannot read: {err.strerror or err}") from None


def compose(text: str, shown: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{shown}:{mark.line + 1}" if mark else shown
        # PyYAML splits e.g. "while scanning a simple key" / "could not find expected ':'".
        problem = ", ".join(part for part in (err.context, err.problem) if part) or str(err)
        raise KfbotError(f"{where}: invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as err:
        # Raised for characters YAML forbids; it carries an offset rather than a mark.
        line = text.count("\n", 0, err.position) + 1
        problem = f"{err.reason} (character U+{int(err.character):04X})"
        raise KfbotError(f"{shown}:{line}: invalid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise KfbotError(f"{shown}: invalid YAML: {err}") from None


# ---- the loader ----------------------------------------------------------------------

_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_STR = "tag:yaml.org,2002:str"

_SCALAR_TAGS: dict[type, tuple[str, ...]] = {
    str: (_STR,),
    int: (_INT,),
    float: (_INT, _FLOAT),
    bool: (_BOOL,),
}
_EXPECTED = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}

# YAML 1.1 reads `1e-6` (no dot) as a string; a tolerance written that way is still
# plainly a number, so an unquoted scalar of this shape is accepted where a float is due.
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_CONSTRUCTOR = yaml.constructor.SafeConstructor()


@dataclass(frozen=True)
class _Schema:
    types: dict[str, Any]  # YAML key -> field type
    names: dict[str, str]  # YAML key -> field name
    required: tuple[str, ...]  # YAML keys
    line_fields: tuple[str, ...]


@functools.cache
def _schema(cls: type) -> _Schema:
    hints = get_type_hints(cls, include_extras=True)
    field_types: dict[str, Any] = {}
    names: dict[str, str] = {}
    required: list[str] = []
    lines: list[str] = []
    for f in dataclasses.fields(cls):
        role = f.metadata.get(_LOADER)
        if role == "line":
            lines.append(f.name)
        elif role is None:
            key = f.metadata.get(_KEY, f.name)
            field_types[key] = hints[f.name]
            names[key] = f.name
            no_default = f.default is dataclasses.MISSING
            if no_default and f.default_factory is dataclasses.MISSING:
                required.append(key)
    return _Schema(field_types, names, tuple(required), tuple(lines))


def line_of(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag == _NULL:
        return "null"
    text = str(node.value)
    shown = text if len(text) <= 40 else text[:37] + "..."
    return repr(shown) if node.tag == _STR else shown


def _core_value(node: yaml.ScalarNode) -> object:
    # The constructor's per-tag methods, not `construct_object`, which caches every node.
    if node.tag == _INT:
        return _CONSTRUCTOR.construct_yaml_int(node)
    if node.tag == _FLOAT:
        return _CONSTRUCTOR.construct_yaml_float(node)
    if node.tag == _BOOL:
        return _CONSTRUCTOR.construct_yaml_bool(node)
    return str(node.value)


def _is_optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


class Loader:
    """Converts composed YAML nodes into the type a dataclass field declares."""

    def __init__(self, shown: str) -> None:
        self._shown = shown
        # Aliases make one node appear many times; converting each (node, type) once
        # keeps a file full of aliases-of-aliases from taking exponential time.
        self._done: dict[tuple[int, Any], object] = {}

    def load(self, node: yaml.Node, cls: type[T]) -> T:
        return self.load_as(node, cls, "")

    def load_as(self, node: yaml.Node, cls: type[T], label: str) -> T:
        """`node` as a `cls`; `label` (e.g. `rewrite my-id`) starts every error's path."""
        value = self.convert(node, cls, label)
        assert isinstance(value, cls)
        return value

    def error(self, node: yaml.Node, path: str, problem: str) -> KfbotError:
        where = f"{self._shown}:{line_of(node)}"
        return KfbotError(f"{where}: {path}: {problem}" if path else f"{where}: {problem}")

    def wrong_type(self, node: yaml.Node, path: str, expected: str) -> KfbotError:
        return self.error(node, path, f"expected {expected}, got {_describe(node)}")

    def convert(self, node: yaml.Node, tp: Any, path: str) -> object:
        key = (id(node), tp)
        if key not in self._done:
            self._done[key] = self._convert(node, tp, path)
        return self._done[key]

    def _convert(self, node: yaml.Node, tp: Any, path: str) -> object:
        origin = get_origin(tp)
        if origin is Annotated:
            return self._annotated(node, tp, path)
        if _is_optional(tp):
            return self._optional(node, tp, path)
        if origin is Literal:
            return self._literal(node, get_args(tp), path)
        if origin is tuple:
            return self._tuple(node, tp, path)
        if origin is dict:
            return self._dict(node, tp, path)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self._dataclass(node, tp, path)
        if tp in _SCALAR_TAGS:
            return self._scalar(node, tp, path)
        raise TypeError(f"config loader cannot handle {tp!r}")

    def _annotated(self, node: yaml.Node, tp: Any, path: str) -> object:
        inner, *extras = get_args(tp)
        if AS_TEXT in extras:
            value: object = self._text(node, path)
        else:
            value = self.convert(node, inner, path)
        for check in extras:
            problem = check.problem(value) if isinstance(check, Check) else None
            if problem:
                raise self.error(node, path, problem)
        return value

    def _optional(self, node: yaml.Node, tp: Any, path: str) -> object:
        if node.tag == _NULL:
            return None
        arms = [arm for arm in get_args(tp) if arm is not type(None)]
        if len(arms) != 1:
            raise TypeError(f"config loader handles only `X | None`, not {tp!r}")
        return self.convert(node, arms[0], path)

    def _scalar(self, node: yaml.Node, tp: type, path: str) -> object:
        if isinstance(node, yaml.ScalarNode):
            if node.tag in _SCALAR_TAGS[tp]:
                return tp(_core_value(node))
            if tp is float and node.style is None and _NUMBER.fullmatch(node.value):
                return float(node.value)
            if tp is str and node.tag != _NULL:
                hint = " (quote it to make it a string)"
                raise self.error(node, path, f"expected a string, got {_describe(node)}{hint}")
        raise self.wrong_type(node, path, _EXPECTED[tp])

    def _text(self, node: yaml.Node, path: str) -> str:
        if isinstance(node, yaml.ScalarNode) and node.tag in (_STR, _INT, _FLOAT):
            return str(node.value)
        raise self.wrong_type(node, path, "a string or a number")

    def _literal(self, node: yaml.Node, choices: tuple[Any, ...], path: str) -> object:
        if isinstance(node, yaml.ScalarNode) and node.tag == _STR and node.value in choices:
            return node.value
        words = [str(choice) for choice in choices]
        hint = suggest(str(node.value) if node.tag == _STR else "", words)
        raise self.error(node, path, f"unknown value {_describe(node)}{hint}")

    def _tuple(self, node: yaml.Node, tp: Any, path: str) -> tuple[object, ...]:
        args = get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"config loader handles only `tuple[T, ...]`, not {tp!r}")
        if not isinstance(node, yaml.SequenceNode):
            raise self.wrong_type(node, path, "a list")
        items = enumerate(node.value)
        return tuple(self.convert(item, args[0], f"{path}[{i}]") for i, item in items)

    def _pairs(self, node: yaml.Node, path: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        """The mapping's entries in file order; keys must be unique strings."""
        if not isinstance(node, yaml.MappingNode):
            raise self.wrong_type(node, path, "a mapping")
        seen: dict[str, int] = {}
        pairs: list[tuple[str, yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR:
                raise self.wrong_type(key_node, path, "a string key")
            key = str(key_node.value)
            if key in seen:
                problem = f"duplicate key (first at line {seen[key]})"
                raise self.error(key_node, _join(path, key), problem)
            seen[key] = line_of(key_node)
            pairs.append((key, key_node, value_node))
        return pairs

    def _dict(self, node: yaml.Node, tp: Any, path: str) -> dict[object, object]:
        key_type, value_type = get_args(tp)
        result: dict[object, object] = {}
        for key, key_node, value_node in self._pairs(node, path):
            here = _join(path, key)
            value = self.convert(value_node, value_type, here)
            result[self.convert(key_node, key_type, here)] = value
        return result

    def _dataclass(self, node: yaml.Node, cls: type, path: str) -> object:
        schema = _schema(cls)
        values: dict[str, object] = {}
        for key, key_node, value_node in self._pairs(node, path):
            if key not in schema.types:
                hint = suggest(key, list(schema.types))
                raise self.error(key_node, _join(path, key), f"unknown key{hint}")
            values[schema.names[key]] = self.convert(value_node, schema.types[key],
                                                     _join(path, key))
        missing = [key for key in schema.required if schema.names[key] not in values]
        if missing:
            raise self.error(node, path, f"missing required key {missing[0]!r}")
        values.update({name: line_of(node) for name in schema.line_fields})
        return cls(**values)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key



def is_null(node: yaml.Node) -> bool:
    """An empty document or an explicit `null`."""
    return bool(node.tag == _NULL)
