"""The rewrites kfbot ships as data: rules/rewrites.yaml and the expert library in
rules/experts/, read strictly (`kfbot.datafiles`).

rules/rewrites.yaml holds small rewrites that apply to any kernel. rules/experts/
holds the kernel classes (`classes.yaml`: what each is and how it is recognised) and,
in one file per class named after it, the structural rewrites for that class, each
with a worked example: a small kernel of the class and the name of its kernel, which
the rewrite turns into the example's "after" (the LLM mutator is shown both).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated

from kfbot.datafiles import Id, OneLine, Text, load_entries, rules_dir
from kfbot.errors import KfbotError
from kfbot.records import NOT_YAML, Check, yaml_key
from kfbot.search.rewrites.registry import IMPLEMENTATIONS

REWRITES_FILE = "rewrites.yaml"
EXPERTS_DIR = "experts"
CLASSES_FILE = "classes.yaml"


def _implementation_problem(value: str) -> str | None:
    if value in IMPLEMENTATIONS:
        return None
    return f"unknown rewrite {value!r}; known: {', '.join(sorted(IMPLEMENTATIONS))}"


Implementation = Annotated[str, Check(_implementation_problem)]


@dataclass(frozen=True)
class Rewrite:
    id: Id
    what: OneLine
    why: OneLine
    applies_when: OneLine = field(metadata=yaml_key("applies-when"))
    rewrite: Implementation


@dataclass(frozen=True)
class Expert(Rewrite):
    """A structural rewrite for one kernel class, with its worked example."""

    example: Text  # a small kernel of the class and its launcher (C++/CUDA)
    example_kernel: Text = field(metadata=yaml_key("example-kernel"))
    kernel_class: str = field(default="", metadata=NOT_YAML)  # the file's name


@dataclass(frozen=True)
class KernelClass:
    id: Id
    what: OneLine
    recognise: OneLine  # the signs in the syntax tree, in words


@dataclass(frozen=True)
class Library:
    classes: tuple[KernelClass, ...]
    experts: tuple[Expert, ...]

    def of(self, class_id: str) -> tuple[Expert, ...]:
        return tuple(e for e in self.experts if e.kernel_class == class_id)


def load_rewrites(path: Path | None = None) -> tuple[Rewrite, ...]:
    """The rewrites the rules mutator proposes: the expert library's structural ones
    first (they change the most), then those in `path` (default: rules/rewrites.yaml)."""
    if path is None:
        return _default_rewrites()
    return load_entries(path, Rewrite, "rewrite")


@cache
def _default_rewrites() -> tuple[Rewrite, ...]:
    path = rules_dir() / REWRITES_FILE
    small = load_entries(path, Rewrite, "rewrite")
    experts = load_library().experts
    clash = sorted({r.id for r in small} & {e.id for e in experts})
    if clash:
        raise KfbotError(f"{path}: rewrite {clash[0]} is also an expert rewrite's id")
    return (*experts, *small)


def load_library(folder: Path | None = None) -> Library:
    """The expert library in `folder` (default: the shipped rules/experts/, read once)."""
    return _default_library() if folder is None else _load_library(folder)


@cache
def _default_library() -> Library:
    return _load_library(rules_dir() / EXPERTS_DIR)


def _load_library(folder: Path) -> Library:
    classes = load_entries(folder / CLASSES_FILE, KernelClass, "kernel class")
    known = {c.id for c in classes}
    experts: list[Expert] = []
    for path in sorted(folder.glob("*.yaml")):
        if path.name == CLASSES_FILE:
            continue
        if path.stem not in known:
            raise KfbotError(f"{path}: no kernel class {path.stem!r} in {CLASSES_FILE} "
                             f"(classes: {', '.join(sorted(known))})")
        for expert in load_entries(path, Expert, "expert rewrite"):
            experts.append(Expert(**{**expert.__dict__, "kernel_class": path.stem}))
    seen: dict[str, str] = {}
    for e in experts:
        if e.id in seen:
            raise KfbotError(f"{folder}: expert rewrite {e.id} is in both {seen[e.id]}.yaml "
                             f"and {e.kernel_class}.yaml")
        seen[e.id] = e.kernel_class
    empty = sorted(known - {e.kernel_class for e in experts})
    if empty:
        raise KfbotError(f"{folder}: kernel class {', '.join(empty)} has no rewrite file")
    return Library(classes, tuple(experts))
