"""The YAML data files kfbot ships in `rules/`: where they are, and reading one.

Every file is a list of entries, each read strictly into a frozen dataclass by the
same loader as the repository's config (`kfbot.records`): an unknown key, a missing
one or a bad value stops kfbot with the file, the line, the entry's id and the
problem. Ids are kebab-case and unique within a file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar

import yaml

from kfbot.errors import KfbotError
from kfbot.records import Check, Loader, compose, line_of, read_text

_PROBE = "anticheat.yaml"  # a file every rules folder holds
_KEBAB = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")



class _HasId(Protocol):
    @property
    def id(self) -> str: ...


T = TypeVar("T", bound=_HasId)


def _id_problem(value: str) -> str | None:
    if _KEBAB.match(value):
        return None
    return f"{value!r} is not kebab-case (lower-case words and digits joined by '-')"


def _one_line_problem(value: str) -> str | None:
    return None if value.strip() and "\n" not in value.strip() else "must be one line of text"


def _text_problem(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


Id = Annotated[str, Check(_id_problem)]
OneLine = Annotated[str, Check(_one_line_problem)]  # a sentence shown in reports
Text = Annotated[str, Check(_text_problem)]  # prose or code, several lines allowed


def rules_dir() -> Path:
    """The rules folder: the installed `kfbot.rules` data, else the checkout's rules/."""
    try:
        installed: Path | None = Path(str(resources.files("kfbot.rules") / _PROBE))
    except (ImportError, TypeError, ValueError):
        installed = None  # a source checkout where kfbot.rules is not importable as data
    if installed is not None and installed.is_file():
        return installed.parent
    return Path(__file__).resolve().parents[1] / "rules"


def load_entries(path: Path, cls: type[T], noun: str) -> tuple[T, ...]:
    """The entries of one data file as `cls` records (each with an `id`); `noun` (rewrite,
    persona...) names them in errors."""
    shown = str(path)
    node = compose(read_text(path, shown), shown)
    if not isinstance(node, yaml.SequenceNode):
        got = "nothing" if node is None else type(node).__name__.removesuffix("Node").lower()
        raise KfbotError(f"{shown}: expected a list of {noun}s, got {got}")
    loader = Loader(shown)
    out: list[T] = []
    first: dict[str, int] = {}
    for index, item in enumerate(node.value):
        entry = loader.load_as(item, cls, _label(item, noun, index))
        entry_id = entry.id
        if entry_id in first:
            raise KfbotError(f"{shown}:{line_of(item)}: {noun} {entry_id}: the id is used "
                             f"twice (first at line {first[entry_id]})")
        first[entry_id] = line_of(item)
        out.append(entry)
    return tuple(out)


def _label(item: yaml.Node, noun: str, index: int) -> str:
    """`rewrite vectorize-float4`, or `rewrite #3` for an entry without a usable id."""
    if isinstance(item, yaml.MappingNode):
        for key, value in item.value:
            if getattr(key, "value", None) == "id" and isinstance(value, yaml.ScalarNode) \
                    and str(value.value).strip():
                return f"{noun} {value.value}"
    return f"{noun} #{index + 1}"


# The anti-cheating rules still validate their entries by hand (kfbot.anticheat.rules).
def read_entries(path: Path, noun: str) -> list[Any]:
    """The list of entries in one data file; `noun` (rule, rewrite...) names them in errors."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise KfbotError(f"{path}: cannot read the {noun} file: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise KfbotError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, list):
        raise KfbotError(f"{path}: expected a list of {noun}s, got {type(data).__name__}")
    return data


def check_unique_ids(path: Path, noun: str, ids: Iterable[str]) -> None:
    seen: set[str] = set()
    for entry_id in ids:
        if entry_id in seen:
            raise KfbotError(f"{path}: {noun} {entry_id}: the id is used twice")
        seen.add(entry_id)
