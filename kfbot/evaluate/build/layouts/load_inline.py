"""The CUDA and C++ texts of a `load_inline` build, as a candidate's files hold them.

A `load_inline` recipe names no source files: its sources are strings in a Python
file (or files that file reads). A build of a candidate takes them from the
candidate's version of those files, the original's where it has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kfbot.scan.model import BuildRecipe, InlineSource
from kfbot.scan.python.facts import extract_python_facts
from kfbot.text import read_source


def inline_sources(root: Path, recipe: BuildRecipe,
                   files: Mapping[str, str]) -> tuple[InlineSource, ...]:
    """The inline sources of `recipe` with `files` (repository path -> text) in place
    of the repository's; () for any other kind of build."""
    if recipe.kind != "load_inline":
        return ()
    text = files.get(recipe.file)
    if text is None:
        text = read_source(root / recipe.file, recipe.file)
    facts = extract_python_facts(recipe.file, text.encode())
    return tuple(_with_text(root, s, files) for s in facts.inline_sources
                 if s.build == recipe.name)


def _with_text(root: Path, source: InlineSource, files: Mapping[str, str]) -> InlineSource:
    if source.text is not None or source.path is None:
        return source
    text = files.get(source.path) or read_source(root / source.path, source.path)
    return InlineSource(source.build, source.language, text, 0, source.path)
