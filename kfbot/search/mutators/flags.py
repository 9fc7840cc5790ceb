"""Compiler settings as genes: nvcc flags that change speed and not results, searched
beside the source edits and committed in the repository's own build file.

Each gene is one setting with its options: the host optimisation level (`-O3`),
ptxas' (`--ptxas-options=-O3`), `--extra-device-vectorization`, a register cap
(`-maxrregcount=32/64/128`) and `--use_fast_math`, the last only where the task's
float32 tolerance holds the fast intrinsics' error (the contract allows it; the
anti-cheating check still reports it as a finding). A candidate's genes are its build
file's nvcc flag list: the repository's own flags, a gene's option in place of the
repository's flag for the same setting (`-O2` becomes `-O3`), then the other options.
So the flags travel as a change of the build file, which the search's builds read like
any other candidate file, a branch commits and a pull request shows.

One proposal changes one gene of the parent (sets, changes or removes its option), so
the flags combine with whatever the parent's kernel already holds.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.task import KernelTask
from kfbot.scan.python.flag_edit import FlagList, flag_list, with_values
from kfbot.search.rewrites.fastmath import INTRINSICS, allowed
from kfbot.search.rewrites.syntax import Target
from kfbot.text import read_source

PREFIX = "flags"  # the rationale's first word: what lessons and lineages name the step


@dataclass(frozen=True)
class Gene:
    key: str  # what a flag of this setting starts with
    options: tuple[str, ...]


GENES = (
    Gene("-O", ("-O3",)),
    Gene("--ptxas-options=-O", ("--ptxas-options=-O3",)),
    Gene("--extra-device-vectorization", ("--extra-device-vectorization",)),
    Gene("-maxrregcount", ("-maxrregcount=32", "-maxrregcount=64", "-maxrregcount=128")),
    Gene("--use_fast_math", ("--use_fast_math",)),
)


@dataclass(frozen=True)
class FlagSpace:
    path: str  # the build file
    kind: str  # the build's kind and the line of its call there
    line: int
    base: tuple[str, ...]  # the repository's nvcc flags there
    genes: tuple[Gene, ...]
    text: str  # the build file as the repository has it
    notes: tuple[str, ...] = ()  # genes left out, and why

    def lines(self) -> list[str]:
        """The plan's lines: the genes and what each may be set to."""
        head = f"flags: {len(self.genes)} compiler settings in {self.path} (now " \
            f"{' '.join(self.base) or 'none'})"
        return [head, *[f"  {g.key}: tries {', '.join(g.options)}" for g in self.genes],
                *[f"  {n}" for n in self.notes]]


def flag_space(task: KernelTask, files: Mapping[str, str]) -> FlagSpace | str:
    """The genes the task's build can carry, or why none can; `files` holds the build
    file as the repository has it."""
    recipe = task.build
    if recipe.kind == "load_inline":
        return ("the build is a load_inline call whose file also holds the kernel's source: "
                "kfbot changes only the strings of that file")
    if recipe.origin == "declared":
        return ("the build is declared in kfbot.yaml: kfbot does not know where the "
                "repository's own build keeps its flags")
    text = files.get(recipe.file)
    if text is None:
        return f"the build file {recipe.file} could not be read"
    found = flag_list(recipe.file, text, recipe.kind, recipe.line)
    if isinstance(found, str):
        return found
    genes, notes = [], []
    for gene in GENES:
        held = [v for v in found.values if _matches(gene, v)]
        if gene.key == "--use_fast_math" and not _fast_math_allowed(task):
            notes.append("--use_fast_math left out: the task's float32 tolerance is tighter "
                         "than the fast intrinsics' error")
        elif held and all(v in gene.options for v in held) and len(gene.options) == 1:
            notes.append(f"{gene.options[0]} left out: the build already has it")
        else:
            genes.append(gene)
    return FlagSpace(recipe.file, recipe.kind, recipe.line, found.values, tuple(genes), text,
                     tuple(notes))


def _fast_math_allowed(task: KernelTask) -> bool:
    declared = task.tolerances.get("float32")
    worst = max(ulp for _, ulp in INTRINSICS.values())
    return allowed(worst, Target(task.kernel_name, rtol=declared[1] if declared else None))


def _matches(gene: Gene, flag: str) -> bool:
    if gene.key == "-O":  # -O3, not -Ofast-something or -Xptxas
        return len(flag) == 3 and flag.startswith("-O") and flag[2].isdigit()
    return flag.startswith(gene.key)


def state_of(space: FlagSpace, current: Sequence[str]) -> dict[str, str | None]:
    """Each gene's option in a candidate's flag list (None: as the repository has it)."""
    out: dict[str, str | None] = {}
    for gene in space.genes:
        mine = [v for v in current if _matches(gene, v) and v not in space.base]
        out[gene.key] = mine[-1] if mine and mine[-1] in gene.options else None
    return out


def render(space: FlagSpace, state: Mapping[str, str | None]) -> tuple[str, ...]:
    """The flag list: the repository's flags with a set gene's option in place of its
    own flag for the setting, then the options of the genes it had no flag for."""
    out: list[str] = []
    placed: set[str] = set()
    for flag in space.base:
        gene = next((g for g in space.genes if _matches(g, flag)), None)
        option = state.get(gene.key) if gene is not None else None
        if gene is not None and option is not None:
            if gene.key not in placed:
                out.append(option)
                placed.add(gene.key)
        else:
            out.append(flag)
    out += [o for g in space.genes if (o := state.get(g.key)) is not None
            and g.key not in placed]
    return tuple(out)


def propose_flags(space: FlagSpace, parent: Candidate, files: Mapping[str, str],
                  rng: random.Random) -> list[Candidate]:
    """Every one-gene change of the parent's flags, in a random order."""
    text = files.get(space.path, space.text)
    found = flag_list(space.path, text, space.kind, space.line) if text is not None else None
    if text is None or not isinstance(found, FlagList):
        return []
    state = state_of(space, found.values)
    moves = [(gene, option) for gene in space.genes
             for option in (None, *gene.options) if option != state.get(gene.key)]
    rng.shuffle(moves)
    out = []
    for gene, option in moves:
        new_state = {**state, gene.key: option}
        values = render(space, new_state)
        changed = with_values(text, found, values)
        if changed == text:
            continue
        out.append(Candidate(files={**parent.files, space.path: changed},
                             params=dict(parent.params), origin="params", parent=parent.hash,
                             rationale=f"{PREFIX}: {_describe(space, gene, option, state)}"))
    return out


def _describe(space: FlagSpace, gene: Gene, option: str | None,
              state: Mapping[str, str | None]) -> str:
    before = state.get(gene.key) or next((f for f in space.base if _matches(gene, f)), None)
    if option is None:
        return f"nvcc without {before} (back to the repository's setting)"
    if before is not None:
        return f"nvcc {option} instead of {before}"
    return f"nvcc {option}"


def task_flags(task: KernelTask) -> FlagSpace | None:
    """The compiler settings the task's build file can carry (None: it cannot)."""
    found = _flag_space(task)
    return found if isinstance(found, FlagSpace) else None


def flag_plan(task: KernelTask) -> tuple[str, ...]:
    found = _flag_space(task)
    if isinstance(found, str):
        return (f"flags: no compiler settings searched: {found}",)
    return tuple(found.lines())


def _flag_space(task: KernelTask) -> FlagSpace | str:
    path = task.root / task.build.file
    text = read_source(path, task.build.file) if path.is_file() else None
    return flag_space(task, {task.build.file: text} if text is not None else {})
