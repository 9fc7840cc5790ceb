"""The source units a candidate is judged on: the op's C++/CUDA before and after.

For a load_inline build the units are the CUDA and C++ strings in the Python file;
for a file build they are the recipe's sources plus every editable C/C++/CUDA file
(headers included), read from the candidate where it edits them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from kfbot.anticheat.units import Source, StaticInput
from kfbot.evaluate.candidate import NVCC_FLAGS_PARAM, Candidate, nvcc_flags
from kfbot.evaluate.task import KernelTask
from kfbot.scan.cuda.facts import extract_cuda_facts
from kfbot.scan.model import BuildRecipe
from kfbot.scan.python.facts import extract_python_facts
from kfbot.scan.python.flag_edit import FlagList, flag_list, flags_only_change

CXX_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".hxx", ".inl")


def units(task: KernelTask, files: Mapping[str, str]) -> tuple[Source, ...]:
    """The op's C++/CUDA units with `files` (path -> text) laid over the repository."""
    recipe = task.build
    if recipe.kind == "load_inline":
        return _inline_units(task.root, recipe, files)
    paths = dict.fromkeys([*recipe.sources, *task.editable_files])
    out = []
    for path in paths:
        if not path.endswith(CXX_SUFFIXES):
            continue
        text = files.get(path)
        if text is None and (task.root / path).is_file():
            text = (task.root / path).read_text(errors="replace")
        if text is not None:
            out.append(Source(path, text))
    return tuple(out)


def _inline_units(root: Path, recipe: BuildRecipe, files: Mapping[str, str]) -> tuple[Source, ...]:
    text = _read(root, recipe.file, files)
    if text is None:
        return ()
    facts = extract_python_facts(recipe.file, text.encode())
    out = []
    for source in facts.inline_sources:
        if source.build != recipe.name:
            continue
        code = source.text
        if code is None and source.path is not None:
            code = _read(root, source.path, files)
        if code is not None:
            label = f"{source.path or recipe.file}#{source.language}_sources"
            out.append(Source(label, code, source.line_offset if source.text else 0))
    return tuple(out)


def _read(root: Path, path: str, files: Mapping[str, str]) -> str | None:
    if path in files:
        return files[path]
    full = root / path
    return full.read_text(errors="replace") if full.is_file() else None


def build_flags(task: KernelTask, files: Mapping[str, str], params: Mapping[str, str]
                ) -> tuple[str, ...]:
    """The build's compiler flags as the candidate would build it (its -D values too)."""
    recipe = _recipe_after(task, files)
    flags = [*recipe.extra_cflags, *recipe.extra_cuda_cflags]
    flags += [f"-D{k}={v}" if v else f"-D{k}" for k, v in recipe.defines]
    flags += [f"-D{k}={v}" for k, v in sorted(params.items()) if k != NVCC_FLAGS_PARAM]
    return (*flags, *nvcc_flags(params))


def _recipe_after(task: KernelTask, files: Mapping[str, str]) -> BuildRecipe:
    """A Python file that holds the build call may be edited: read its flags again."""
    recipe = task.build
    if recipe.file not in files or not recipe.file.endswith(".py"):
        return recipe
    facts = extract_python_facts(recipe.file, files[recipe.file].encode())
    return next((b for b in facts.builds if b.name == recipe.name), recipe)


def recipe_for(task: KernelTask, files: Mapping[str, str]) -> BuildRecipe:
    """The task's build with the nvcc flags of the candidate's build file, where the
    candidate changed the flag list of the build call (see `kfbot.scan.python.flag_edit`)."""
    recipe = task.build
    if recipe.file not in files or not recipe.file.endswith(".py"):
        return recipe
    original = _read(task.root, recipe.file, {})
    before = flag_list(recipe.file, original, recipe.kind, recipe.line) if original else None
    after = flag_list(recipe.file, files[recipe.file], recipe.kind, recipe.line)
    if not isinstance(before, FlagList) or not isinstance(after, FlagList) \
            or before.values == after.values:
        return recipe
    return replace(recipe, extra_cuda_cflags=after.values)


def carried_flags(task: KernelTask, files: Mapping[str, str]) -> bool:
    """The candidate changes the build file in its nvcc flag list only, by speed flags:
    a compiler setting, checked as flags (fast math is a finding), not a file edit."""
    recipe = task.build
    original = _read(task.root, recipe.file, {})
    new = files.get(recipe.file)
    if new is None or original is None or new == original:
        return False
    return flags_only_change(recipe.file, original, new, recipe.kind, recipe.line) is not None


def static_input(task: KernelTask, candidate: Candidate, op_dtypes: Sequence[str]
                 ) -> StaticInput:
    carried = task.build.file if carried_flags(task, candidate.files) else None
    changed = {
        path: (_read(task.root, path, {}), text) for path, text in candidate.files.items()
        if path != carried
    }
    return StaticInput(
        original=units(task, {}),
        candidate=units(task, candidate.files),
        changed=changed,
        allowed=tuple(task.editable_files),
        original_flags=build_flags(task, {}, {}),
        candidate_flags=build_flags(task, candidate.files, candidate.params),
        op_dtypes=tuple(op_dtypes),
    )


def kernel_names(sources: Sequence[Source]) -> list[str]:
    """Every `__global__` kernel defined in the units, by bare name."""
    names: list[str] = []
    for source in sources:
        facts = extract_cuda_facts(source.path, source.text.encode())
        names += [k.name.rsplit("::", 1)[-1] for k in facts.kernels]
    return sorted(set(names))
