"""How a changed kernel compares with its version at a base revision: both built and
verified the same way, and timed against each other (`kfbot hook verify`, the pull
request guard). Which kernels a change touches is `kfbot.scan.changes`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kfbot.config import Config, load_config
from kfbot.scan.changes import ChangedKernel, base_worktree, chosen_build, resolve_base
from kfbot.scan.model import BuildRecipe, Kernel
from kfbot.scan.scanner import scan
from kfbot.text import read_source

if TYPE_CHECKING:
    from kfbot.evaluate.engine import EngineSettings
    from kfbot.evaluate.evaluation import Evaluation
    from kfbot.evaluate.task import KernelTask


@dataclass(frozen=True)
class Comparison:
    """A changed kernel against its version at the base revision.

    `change` is the working version against its reference and, when `base` is there
    and passed, timed against the base version (`change.timings`, speedup = base time
    / working time). `base` is the base version against its own reference, None when
    it was not run. `note` says why the working version was verified on its own: the
    kernel is new, its build changed, or the base fails its own reference.
    """

    kernel_id: str
    change: Evaluation
    base: Evaluation | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.change.ok

    @property
    def slower_shapes(self) -> list[str]:
        """Inputs on which the change is significantly slower than the base."""
        return self.slower_beyond(0.0)

    def slower_beyond(self, threshold: float) -> list[str]:
        """Inputs on which the change is significantly slower than the base by more than
        `threshold` (0.05: 5 %): the speedup's whole confidence interval lies below
        1 / (1 + threshold)."""
        limit = 1.0 / (1.0 + threshold)
        return [t.input for t in self.change.timings
                if t.speedup.verdict == "slower" and t.speedup.ci_high < limit]


def compare_with_base(root: Path, base: str, changed: ChangedKernel, gpu: int | None,
                      cache_dir: Path, config: Config | None = None) -> Comparison:
    """Build and verify the working version of a changed kernel, and time it against
    the base revision's.

    The base is checked out in a temporary worktree; the task (build, op, references,
    inputs) is made from the base's scan, and the changed files are laid over it as
    the candidate, so both sides are built the same way and judged by the same
    reference. A kernel the base does not have, whose build recipe changed, or whose
    base version fails its own reference is verified on its own (see `note`).

    The engine's static anti-cheating rules are off: they guard the search against
    reward hacking, and would reject a person's legitimate change (say, a new cuBLAS
    call). Needs a CUDA GPU, torch and nvcc: without them a KfbotError with exit code
    EXIT_MISSING_TOOL says which is missing; a kernel kfbot cannot build or call is
    a KfbotError too.
    """
    # Imported here: the light hook imports this module and must not pay for the engine.
    from kfbot.evaluate.candidate import Candidate
    from kfbot.evaluate.engine import Engine, EngineSettings

    root = root.resolve()
    settings = EngineSettings(cache_dir=cache_dir, gpu=gpu, static_checks=False)
    alone = functools.partial(_verify_alone, root, changed.kernel, settings, config)
    sha = resolve_base(root, base)
    if sha is None:
        return alone(f"{base} has no commit yet")
    with base_worktree(root, sha) as base_root:
        task = _base_task(base_root, changed.kernel.id, config)
        if task is None:
            return alone(f"new since {base}")
        if _recipe(task.build) != _recipe(chosen_build(changed.kernel)):
            return alone(f"its build changed since {base}, so the two cannot be timed alike")
        files = {f: read_source(root / f, f) for f in changed.files if (root / f).is_file()}
        candidate = Candidate(files=files, origin="user", rationale=f"the change against {base}")
        with Engine(task, settings) as engine:
            before = engine.baseline()
            if before.ok:
                return Comparison(changed.kernel.id, engine.evaluate(candidate), before)
    return alone(f"at {base} it already fails its reference ({before.stage}: {before.reason})",
                 before)


def _base_task(base_root: Path, kernel_id: str, config: Config | None) -> KernelTask | None:
    from kfbot.evaluate.task import make_task

    config = config or load_config(None, base_root)
    found = next((k for k in scan(base_root, config).kernels if k.id == kernel_id), None)
    return make_task(found, base_root, config) if found is not None else None


def _recipe(build: BuildRecipe | None) -> tuple[object, ...]:
    """What makes two builds build alike: not where the recipe is written."""
    if build is None:
        return ()
    return (build.kind, build.name, build.sources, build.inline, build.defines,
            build.extra_cflags, build.extra_cuda_cflags, build.include_dirs, build.functions)


def _verify_alone(root: Path, kernel: Kernel, settings: EngineSettings, config: Config | None,
                  note: str, base: Evaluation | None = None) -> Comparison:
    """The working version against its reference only: there is no base to time it with."""
    from kfbot.evaluate.engine import Engine
    from kfbot.evaluate.task import make_task

    task = make_task(kernel, root, config or load_config(None, root))
    with Engine(task, settings) as engine:
        return Comparison(kernel.id, engine.baseline(), base, note)
