"""Apply the tasks declared in the config file to the discovered kernels.

A declared task names facts discovery cannot see (the callable that runs the op,
its reference, shapes, tolerances, editable files, a build); each such fact is
marked `origin="declared"` so the report shows where it came from.
"""

from __future__ import annotations

from dataclasses import replace

from kfbot.config import BuildConfig, Config, TaskConfig
from kfbot.errors import KfbotError
from kfbot.scan.model import BuildRecipe, Kernel, ReferenceTest
from kfbot.scan.select import select_kernel


def apply_tasks(kernels: list[Kernel], config: Config) -> list[Kernel]:
    out = list(kernels)
    for task in config.tasks:
        where = f"{config.path or 'config'}:{task.line}: task '{task.name}'"
        for index in _task_kernels(out, task, where):
            out[index] = _declare(out[index], task, config.path or "config")
    return out


def _task_kernels(kernels: list[Kernel], task: TaskConfig, where: str) -> list[int]:
    if task.kernel is not None:
        chosen = select_kernel(kernels, task.kernel, where)
        return [kernels.index(chosen)]
    found = [i for i, k in enumerate(kernels) if k.file in task.files]
    if not found:
        files = ", ".join(task.files) or "(none)"
        raise KfbotError(f"{where}: no kernel named and none found in its files: {files}")
    return found


def _declare(kernel: Kernel, task: TaskConfig, path: str) -> Kernel:
    refs = kernel.references
    if task.op is not None and task.reference is not None:
        refs = (_declared_reference(task, path), *refs)
    builds = kernel.builds
    if task.build is not None:
        builds = (_declared_build(task.build, path, task.line), *builds)
    return replace(kernel, task=task.name, references=refs, builds=builds,
                   editable_files=task.files or kernel.editable_files)


def _declared_reference(task: TaskConfig, path: str) -> ReferenceTest:
    assert task.op is not None  # checked by the caller
    module, _, func = task.op.partition(":")
    return ReferenceTest(
        file=path, line=task.line, test=task.name, kind="declared", op=task.op, op_name=func,
        module_hint=module, reference=task.reference, comparison="declared tolerances",
        shapes=tuple(str(tuple(s)) for s in task.shapes), dtypes=task.dtypes,
        why=f"declared by task '{task.name}' in {path}", confidence=1.0, origin="declared")


def _declared_build(build: BuildConfig, path: str, line: int) -> BuildRecipe:
    if build.kind == "repository":
        if build.file is None:
            raise KfbotError(f"{path}:{line}: a build of kind repository names its "
                             "setup.py or pyproject.toml in `file:`")
        return BuildRecipe(kind="repository", name=build.name or "", file=build.file,
                           line=1, sources=build.sources, origin="declared")
    if build.name is None:
        raise KfbotError(f"{path}:{line}: a build of kind {build.kind} needs a `name:` (the "
                         "extension's module name)")
    return BuildRecipe(
        kind=build.kind, name=build.name, file=path, line=line, sources=build.sources,
        defines=tuple(build.defines.items()), extra_cflags=build.extra_cflags,
        extra_cuda_cflags=build.extra_cuda_cflags, include_dirs=build.include_dirs,
        origin="declared")
