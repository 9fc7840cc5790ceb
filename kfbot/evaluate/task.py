"""What the engine needs to know about one kernel: a `KernelTask`, made from a scan.

It picks the build that holds the kernel, the op that reaches it from Python, the
references that can be called, the tests to capture inputs from and to run as the
finalist check, and the task's tolerances.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from kfbot.config import Config, TaskConfig
from kfbot.errors import EXIT_FAILURE, KfbotError
from kfbot.evaluate.baseline.steps import StepName
from kfbot.evaluate.build.layouts.kernel_builder import is_kernel_builder
from kfbot.evaluate.reference.spec import ReferenceSpec, Unusable, reference_spec
from kfbot.evaluate.verdict.tolerances import floor_with_defaults
from kfbot.paths import resolve_inside
from kfbot.scan.model import Binding, BuildRecipe, Kernel, KernelDef, ReferenceTest, Tunable
from kfbot.text import read_source

OpKind = Literal["module", "torch_op", "callable"]
EXTENSION_NAMESPACE = "TORCH_EXTENSION_NAME"


@dataclass(frozen=True)
class OpBinding:
    """How the worker calls the op in a built artifact."""

    kind: OpKind
    module: str  # extension module name, torch library namespace, or Python module
    name: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "module": self.module, "name": self.name}


@dataclass(frozen=True)
class KernelTask:
    kernel_id: str
    kernel_name: str
    root: Path
    build: BuildRecipe
    op: OpBinding
    references: tuple[ReferenceSpec, ...]
    unusable_references: tuple[str, ...]  # why a found reference could not be called
    test_targets: tuple[str, ...]  # pytest targets (file::test) that call the op
    editable_files: tuple[str, ...]
    script_targets: tuple[str, ...] = ()  # scripts (run as scripts) that call the op
    tolerances: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    declared_shapes: tuple[tuple[int, ...], ...] = ()
    declared_dtypes: tuple[str, ...] = ()
    inputs_ref: str | None = None  # "module:callable" input generator from the config
    block: int | None = None  # the launch's block size, to localise tail mismatches
    in_place: bool = False
    flops: str | None = None  # FLOPs of one call, an expression over `args` (config)
    tunables: tuple[Tunable, ...] = ()  # the numbers the search may change
    # The other kernels of the build that have an op to verify: a candidate that changes
    # code shared with one of them must pass that op too (evaluate/neighbours.py).
    neighbours: tuple[KernelTask, ...] = ()
    # The definition as scanned: the built library that holds it is found by its name,
    # namespace and template arguments (the repository's own builds).
    definition: KernelDef | None = None
    own_build_timeout_s: float = 3600.0  # the repository's own build (kfbot.yaml)
    # What running the tests on a GPU showed: one line per test seen launching the kernel.
    observed: tuple[str, ...] = ()


def make_task(kernel: Kernel, root: Path, config: Config,
              others: Sequence[Kernel] = ()) -> KernelTask:
    """The task of optimizing `kernel`; `others`, the rest of the scan's kernels, give it
    its neighbours (the kernels of its build that have a reference to verify against)."""
    _check_sources(root, kernel.editable_files)
    task_cfg = next((t for t in config.tasks if t.name == kernel.task), None)
    build = _build(kernel)
    op = _op(kernel, build)
    specs, unusable = _references(root, kernel.references, op)
    return KernelTask(
        kernel_id=kernel.id,
        kernel_name=kernel.name,
        root=root,
        build=build,
        op=op,
        references=tuple(specs),
        unusable_references=tuple(unusable),
        test_targets=_targets(kernel.references, "pytest"),
        script_targets=_targets(kernel.references, "script"),
        editable_files=kernel.editable_files,
        tolerances=_tolerances(task_cfg, kernel.references),
        declared_shapes=task_cfg.shapes if task_cfg else (),
        declared_dtypes=task_cfg.dtypes if task_cfg else (),
        inputs_ref=task_cfg.inputs if task_cfg else None,
        block=_block(kernel),
        in_place=task_cfg.in_place if task_cfg else False,
        flops=task_cfg.flops if task_cfg else None,
        tunables=kernel.tunables,
        neighbours=_neighbours(kernel, build, others, root, config),
        definition=kernel.definition,
        own_build_timeout_s=config.repository_build.timeout_s,
        observed=tuple(t.line() for t in kernel.observed),
    )


def _neighbours(kernel: Kernel, build: BuildRecipe, others: Sequence[Kernel], root: Path,
                config: Config) -> tuple[KernelTask, ...]:
    """The tasks of the other kernels defined in the files this kernel's build compiles
    or a candidate may edit: the ones a change to shared code can reach. A kernel with no
    reference, or no task (no build or binding found), has none and is left out: a
    change that reaches it is rejected."""
    files = {*build.sources, *kernel.editable_files}
    out = []
    for other in others:
        if other.id == kernel.id or other.file not in files or not other.references:
            continue
        try:
            out.append(make_task(other, root, config))
        except KfbotError:
            continue  # no task: its kernel stays out of reach (see the docstring)
    return tuple(out)


def _check_sources(root: Path, editable: tuple[str, ...]) -> None:
    """Files a candidate may edit must be in the repository and UTF-8: refused now, before
    any GPU time, rather than after a search whose winner could not be committed as is."""
    for rel in editable:
        read_source(resolve_inside(root, rel, "kernel source"), rel)


class TaskError(KfbotError):
    """Why no task can be made of a kernel, as the baseline step it stops at (`kfbot
    verify --explain` shows that step's evidence and the kfbot.yaml that gets past it)."""

    def __init__(self, message: str, step: StepName) -> None:
        super().__init__(message, EXIT_FAILURE)
        self.step: StepName = step


def _build(kernel: Kernel) -> BuildRecipe:
    if not kernel.builds:
        raise TaskError(
            f"{kernel.id}: kfbot cannot tell how this kernel is built (`kfbot verify "
            f"{kernel.name} --explain` shows what the scan read, and the `build:` section "
            "of kfbot.yaml that would tell it)", "build")
    declared = [b for b in kernel.builds if b.origin == "declared"]
    return (declared or list(kernel.builds))[0]


def _op(kernel: Kernel, build: BuildRecipe) -> OpBinding:
    bindings = [b for b in kernel.bindings if b.cpp_function is not None]
    if not bindings:
        raise TaskError(
            f"{kernel.id}: no Python binding reaches this kernel "
            "(no pybind11 m.def or TORCH_LIBRARY op calls its launcher)", "pair")
    tested = {r.op_name for r in kernel.references}
    chosen = next((b for b in bindings if b.name in tested), bindings[0])
    return _binding_op(chosen, build)


def _binding_op(binding: Binding, build: BuildRecipe) -> OpBinding:
    if binding.kind == "pybind11":
        return OpBinding("module", build.name, binding.name)
    if is_kernel_builder(build):
        # Its namespace is whatever the build defines TORCH_EXTENSION_NAME as.
        return OpBinding("torch_op", EXTENSION_NAMESPACE, binding.name)
    return OpBinding("torch_op", binding.module, binding.name)


def _references(
    root: Path, refs: tuple[ReferenceTest, ...], op: OpBinding
) -> tuple[list[ReferenceSpec], list[str]]:
    specs: list[ReferenceSpec] = []
    unusable: list[str] = []
    for ref in sorted(refs, key=lambda r: -r.confidence):
        spec = reference_spec(root, ref)
        if isinstance(spec, Unusable):
            unusable.append(f"{ref.file}:{ref.line} {ref.test}: {spec.reason}")
            continue
        if spec.outer == f"{op.module}:{op.name}":
            # The test calls the bound op itself (`obs_ext.double32(x)`): the reference
            # is over the op's own arguments, with no wrapper in between to trace.
            spec = replace(spec, outer=None)
        if spec not in specs:
            specs.append(spec)
    return specs, unusable


def _targets(refs: tuple[ReferenceTest, ...], kind: str) -> tuple[str, ...]:
    """The pytest node ids (file::test), or the script files, of the references found."""
    targets = [
        f"{r.file}::{r.test.split('.')[0]}" if r.kind == "pytest" else r.file
        for r in refs
        if r.origin in ("discovered", "observed") and r.kind == kind
    ]
    return tuple(dict.fromkeys(targets))


def _tolerances(task: TaskConfig | None, refs: tuple[ReferenceTest, ...]
                ) -> dict[str, tuple[float, float]]:
    """The config's tolerances; for the other float dtypes the repository's tests use, the
    loosest tolerance a test writes for its comparison, never below kfbot's default (the
    tests' own judgement of close enough, e.g. `rtol=1e-4, atol=1e-3` for a long sum)."""
    declared = {dtype: (tol.atol, tol.rtol) for dtype, tol in (task.tolerances.items()
                                                               if task else ())}
    found: dict[str, tuple[float, float]] = {}
    for ref in refs:
        for dtype in ref.dtypes or ("float32",):
            name = dtype.removeprefix("torch.")
            own = floor_with_defaults(name, ref.atol, ref.rtol)
            if own is not None:
                old = found.get(name, own)
                found[name] = (max(old[0], own[0]), max(old[1], own[1]))
    return {**found, **declared}


def _block(kernel: Kernel) -> int | None:
    """The threads per block of the first launch, when the scan can read it as a number."""
    values = {t.name: t.value for t in kernel.tunables}
    for site in kernel.launch_sites:
        block = (site.block or "").strip()
        value = values.get(block, block)
        if value.isdigit():
            return int(value)
    return None
