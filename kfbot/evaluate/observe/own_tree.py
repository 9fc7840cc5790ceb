"""Observing a repository that builds itself (a build of kind `repository`).

Its tests import the libraries its own build put beside its packages, so they run in
the copy that build made (`build/layouts/own.py`), its folder importable as an install would
make it. The mutant of a kernel (its body emptied, `mutants.silent`) is built the same
way, in the same workshop, and laid into a copy of that tree in place of the library
that holds the kernel (found by its symbols): the tests run there again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from kfbot.evaluate.build.layouts.own import OwnBuild, OwnBuilder, own_recipe
from kfbot.evaluate.build.symbols import holders
from kfbot.evaluate.observe.mutants import NoMutant, silent
from kfbot.scan.model import BuildRecipe, Kernel


def own_tree(root: Path, recipe: BuildRecipe, cache: Path,
             env: Mapping[str, str]) -> tuple[Path, dict[str, str]] | str:
    """The tree the repository's own build made and the environment its tests need
    there; else why it could not be made."""
    made = OwnBuilder(cache).original(root, own_recipe(recipe.file))
    if not made.ok:
        return f"the repository's own build ({recipe.file}) failed: {made.why}"
    return made.original, _importable(made, made.original, env)


def own_mutant_tree(root: Path, kernel: Kernel, recipe: BuildRecipe, cache: Path,
                    env: Mapping[str, str]) -> tuple[Path, dict[str, str]] | NoMutant:
    """A copy of the built tree whose library holding `kernel` is the mutant's."""
    mutant = silent(root, kernel)
    if isinstance(mutant, NoMutant):
        return mutant
    builder = OwnBuilder(cache)
    made = builder.original(root, own_recipe(recipe.file))
    found = holders(kernel.definition, [made.original / lib for lib in made.libraries]) \
        if made.ok else []
    if not found:
        return NoMutant(kernel.id, f"no library the repository's own build made holds it "
                        f"({made.why})")
    library = found[0].library.relative_to(made.original).as_posix()
    files = dict(mutant.files)
    tag = "m" + hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:8]
    built = builder.candidate(made, library, files, tag)
    if not built.ok or built.artifact is None:
        return NoMutant(kernel.id, f"the mutant did not build: {built.why}")
    tree = made.workshop.parent / "mutants" / tag
    if not tree.is_dir():
        scratch = tree.with_name(f".{tag}.part")
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(made.original, scratch, symlinks=True)
        shutil.copyfile(built.artifact, scratch / library)
        os.replace(scratch, tree)
    return tree, _importable(made, tree, env)


def _importable(made: OwnBuild, tree: Path, env: Mapping[str, str]) -> dict[str, str]:
    folders = [str(made.recipe.library_root(tree)), str(tree / made.recipe.folder)]
    path = os.pathsep.join(dict.fromkeys([*folders, *filter(None, [env.get("PYTHONPATH")])]))
    return {**env, "PYTHONPATH": path}
