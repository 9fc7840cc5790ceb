"""The repository's `kfbot.yaml`: found once, parsed strictly, turned into frozen records.

Parsing goes through `yaml.compose` rather than `yaml.safe_load` so every value keeps
its line: a mistake is reported as `kfbot.yaml:7: tasks[0].tolerence: unknown key`,
not as a stack trace or a silently ignored key. A small loader driven by the dataclass
field types does the conversion, so a new section is just a new dataclass; values
that need more than a type (dtype names, `module:callable` references, relative
paths) are `Annotated` with a `Check`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from kfbot.errors import KfbotError
from kfbot.paths import refuse_link

# Looked for in this order; finding more than one is an error rather than a silent
# pick, because editing the file that is ignored is a confusing way to lose an hour.
CONFIG_NAMES = (
    "kfbot.yaml",
    "kfbot.yml",
    ".kfbot.yaml",
    ".github/kfbot.yaml",
    ".github/kfbot.yml",
)

DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8", "bool")

# Field metadata for values the loader fills in itself: they are not YAML keys.
_LOADER = "kfbot.loader"
SOURCE_LINE = {_LOADER: "line"}  # set to the 1-based line the field's mapping starts on
NOT_YAML = {_LOADER: "skip"}  # left at its default; set after loading (e.g. `Config.path`)

T = TypeVar("T")


@dataclass(frozen=True)
class Check:
    """`Annotated` metadata: `problem(value)` says why a converted value is invalid, or None."""

    problem: Callable[[Any], str | None]


# `Annotated` metadata: accept any string or number and keep the text as written, so a
# define like `VEC: 0x10` reaches the compiler as `-DVEC=0x10`, not `-DVEC=16`.
_AS_TEXT = "kfbot.as_text"


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (expected one of: {', '.join(choices)})"


def _dtype_problem(value: str) -> str | None:
    return None if value in DTYPES else f"unknown dtype {value!r}{_suggest(value, DTYPES)}"


_IDENT = r"[^\W\d]\w*"
_DOTTED = rf"{_IDENT}(?:\.{_IDENT})*"
_REF = re.compile(rf"{_DOTTED}:{_DOTTED}")


def _ref_problem(value: str) -> str | None:
    if _REF.fullmatch(value):
        return None
    return f"expected 'module.path:callable', got {value!r}"


def _relpath_problem(value: str) -> str | None:
    posix = PurePosixPath(value.replace("\\", "/"))
    if not value or posix.is_absolute() or PureWindowsPath(value).drive:
        return f"expected a path relative to the repository root, got {value!r}"
    if ".." in posix.parts:
        return f"path must not contain '..', got {value!r}"
    return None


def _non_empty_problem(value: str | tuple[object, ...]) -> str | None:
    return None if value else "must not be empty"


def _positive_problem(value: int) -> str | None:
    return None if value > 0 else f"expected a positive integer, got {value}"


def _tolerance_problem(value: float) -> str | None:
    ok = math.isfinite(value) and value >= 0
    return None if ok else f"expected a finite number >= 0, got {value}"


def _version_problem(value: int) -> str | None:
    return None if value == 1 else f"unsupported version {value} (only version 1 is supported)"


Text = Annotated[str, Check(_non_empty_problem)]
Dtype = Annotated[str, Check(_dtype_problem)]
CallableRef = Annotated[str, Check(_ref_problem)]
RelPath = Annotated[str, Check(_relpath_problem)]
Shape = Annotated[tuple[Annotated[int, Check(_positive_problem)], ...], Check(_non_empty_problem)]
ToleranceValue = Annotated[float, Check(_tolerance_problem)]


@dataclass(frozen=True)
class Tolerance:
    atol: ToleranceValue
    rtol: ToleranceValue


@dataclass(frozen=True)
class ScanConfig:
    """Which files the scan reads; patterns are relative to the root, see `path_included`."""

    include: tuple[Text, ...] = ()  # empty means everything
    exclude: tuple[Text, ...] = ()  # wins over include


@dataclass(frozen=True)
class BuildConfig:
    """How to build a declared task when discovery cannot tell."""

    kind: Literal["load", "load_inline", "setup_py"]
    name: Text
    sources: tuple[str, ...] = ()
    defines: dict[Text, Annotated[str, _AS_TEXT]] = field(default_factory=dict)
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    include_dirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskConfig:
    """A kernel the repository declares, with what is needed to test and time it."""

    name: Text
    kernel: str | None = None  # kernel name or "file::name"
    files: tuple[RelPath, ...] = ()  # files the optimiser may edit
    op: CallableRef | None = None  # runs the op
    reference: CallableRef | None = None  # pure-PyTorch reference
    inputs: CallableRef | None = None  # input generator
    shapes: tuple[Shape, ...] = ()
    dtypes: tuple[Dtype, ...] = ()
    tolerances: dict[Dtype, Tolerance] = field(default_factory=dict)
    build: BuildConfig | None = None
    in_place: bool = False
    # Floating-point operations of one call, as a Python expression over the op's
    # positional arguments `args`, e.g. "2 * args[0].shape[0] * args[0].shape[1] *
    # args[1].shape[1]" for a matmul; used to report FLOP/s against the device's peak.
    flops: Text | None = None
    # Where the task starts in the config, so a declared fact can point at its source.
    line: int = field(default=0, compare=False, metadata=SOURCE_LINE)


PERMISSIONS = ("read", "triage", "write", "maintain", "admin")


def _speedup_problem(value: float) -> str | None:
    ok = math.isfinite(value) and value >= 1.0
    return None if ok else f"expected a speedup of at least 1.0, got {value}"


@dataclass(frozen=True)
class GithubConfig:
    """How kfbot behaves on GitHub: pull requests it opens and comment commands it obeys."""

    labels: tuple[Text, ...] = ("kfbot",)  # put on every pull request kfbot opens
    draft: bool = False  # open pull requests as drafts
    max_open_prs: Annotated[int, Check(_positive_problem)] = 5  # kfbot PRs open at once
    base: str | None = None  # branch PRs target; default: the repository's default branch
    # The least repository permission a commenter needs for `/kfbot ...` commands,
    # read from the collaborator-permission endpoint, never from author_association.
    min_permission: Literal["read", "triage", "write", "maintain", "admin"] = "write"
    allow_forks: bool = False  # obey commands on PRs from forks (then only with sha=...)
    min_speedup: Annotated[float, Check(_speedup_problem)] = 1.05  # publish only above this
    # A physics-floor flag (over 10x, or above a measured peak): "draft" opens the pull
    # request as a draft labelled REVIEW_LABEL with the flag first; "block" does not open it.
    review_gate: Literal["draft", "block"] = "draft"


@dataclass(frozen=True)
class Config:
    """The whole file; `Config()` is what a repository without one gets."""

    version: Annotated[int, Check(_version_problem)] = 1
    scan: ScanConfig = field(default_factory=ScanConfig)
    tasks: tuple[TaskConfig, ...] = ()
    github: GithubConfig = field(default_factory=GithubConfig)
    # The file it was loaded from, relative to the root when inside it; None for defaults.
    path: str | None = field(default=None, compare=False, metadata=NOT_YAML)


# ---- discovery and loading -------------------------------------------------------------


def find_config(root: Path) -> Path | None:
    """The repository's config file, or None; more than one present is an error."""
    found = [name for name in CONFIG_NAMES if (root / name).is_file()]
    if len(found) > 1:
        names = " and ".join(found)
        raise KfbotError(f"found more than one kfbot config: {names}; keep one")
    return root / found[0] if found else None


def load_config(path: Path | None, root: Path) -> Config:
    """Load `path`, or the discovered config when None; defaults when there is none."""
    if path is None:
        path = find_config(root)
        if path is None:
            return Config()
    shown = _shown_path(path, root)
    # A link could point at a credentials file, whose text a parse error would quote.
    refuse_link(path, "config file", shown)
    node = _compose(_read(path, shown), shown)
    if node is None or node.tag == _NULL:
        return Config(path=shown)
    config = _Loader(shown).load(node, Config)
    _check_task_names(config, shown)
    return dataclasses.replace(config, path=shown)


def _shown_path(path: Path, root: Path) -> str:
    # abspath rather than resolve: a symlinked config should still show where it sits.
    absolute, base = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    try:
        return absolute.relative_to(base).as_posix()
    except ValueError:
        return str(path)


def _read(path: Path, shown: str) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise KfbotError(f"{shown}: not valid UTF-8") from None
    except OSError as err:
        raise KfbotError(f"{shown}: cannot read: {err.strerror or err}") from None


def _compose(text: str, shown: str) -> yaml.Node | None:
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


def _check_task_names(config: Config, shown: str) -> None:
    first_line: dict[str, int] = {}
    for index, task in enumerate(config.tasks):
        if task.name in first_line:
            problem = f"duplicate task name {task.name!r} (first at line {first_line[task.name]})"
            raise KfbotError(f"{shown}:{task.line}: tasks[{index}].name: {problem}")
        first_line[task.name] = task.line


# ---- the generic loader ----------------------------------------------------------------

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
    required: tuple[str, ...]
    line_fields: tuple[str, ...]


@functools.cache
def _schema(cls: type) -> _Schema:
    hints = get_type_hints(cls, include_extras=True)
    field_types: dict[str, Any] = {}
    required: list[str] = []
    lines: list[str] = []
    for f in dataclasses.fields(cls):
        role = f.metadata.get(_LOADER)
        if role == "line":
            lines.append(f.name)
        elif role is None:
            field_types[f.name] = hints[f.name]
            no_default = f.default is dataclasses.MISSING
            if no_default and f.default_factory is dataclasses.MISSING:
                required.append(f.name)
    return _Schema(field_types, tuple(required), tuple(lines))


def _line(node: yaml.Node) -> int:
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


class _Loader:
    """Converts composed YAML nodes into the type a dataclass field declares."""

    def __init__(self, shown: str) -> None:
        self._shown = shown
        # Aliases make one node appear many times; converting each (node, type) once
        # keeps a file full of aliases-of-aliases from taking exponential time.
        self._done: dict[tuple[int, Any], object] = {}

    def load(self, node: yaml.Node, cls: type[T]) -> T:
        value = self.convert(node, cls, "")
        assert isinstance(value, cls)
        return value

    def error(self, node: yaml.Node, path: str, problem: str) -> KfbotError:
        where = f"{self._shown}:{_line(node)}"
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
        if _AS_TEXT in extras:
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
        hint = _suggest(str(node.value) if node.tag == _STR else "", words)
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
            seen[key] = _line(key_node)
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
                hint = _suggest(key, list(schema.types))
                raise self.error(key_node, _join(path, key), f"unknown key{hint}")
            values[key] = self.convert(value_node, schema.types[key], _join(path, key))
        missing = [name for name in schema.required if name not in values]
        if missing:
            raise self.error(node, path, f"missing required key {missing[0]!r}")
        values.update({name: _line(node) for name in schema.line_fields})
        return cls(**values)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ---- include / exclude -----------------------------------------------------------------


def path_included(config: ScanConfig, rel_path: str) -> bool:
    """Whether the scan should read `rel_path` (relative to the root, `/`-separated).

    A pattern matches a path or any directory above it, so `third_party/**` and
    `third_party` both cover `third_party/sub/y.cu`. `*` stays inside one path segment;
    `**` as a whole segment matches any number of them. Exclude wins over include.
    """
    parts = _segments(rel_path)
    if any(_covers(pattern, parts) for pattern in config.exclude):
        return False
    return not config.include or any(_covers(pattern, parts) for pattern in config.include)


def _segments(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.replace("\\", "/").split("/") if part not in ("", "."))


def _covers(pattern: str, parts: tuple[str, ...]) -> bool:
    pattern_parts = _segments(pattern)
    return any(_glob(pattern_parts, parts[:n]) for n in range(1, len(parts) + 1))


@functools.lru_cache(maxsize=4096)
def _glob(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_glob(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _glob(rest, parts[1:])
