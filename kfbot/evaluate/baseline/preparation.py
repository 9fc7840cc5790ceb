"""What the baseline needs before the GPU compares anything: the original's build (or
the repository's own), the same code under the repository's real names for its tests
and scripts, the call signatures they make, and the report of each step.

    prep = Preparation(task, builder, request, cache_dir, capture_timeout_s)
    steps = prep.steps()               # pair, build, import, capture, reference
    signatures = prep.captured().signatures

Everything here runs on the CPU; the engine adds the GPU's steps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kfbot.errors import KfbotError
from kfbot.evaluate.baseline.step_reports import (
    build_step,
    capture_steps,
    own_build_step,
    pair_step,
    reference_step,
    skipped,
)
from kfbot.evaluate.baseline.steps import StepReport
from kfbot.evaluate.build import Builder, BuildRequest, BuildResult
from kfbot.evaluate.build.layouts.own import OwnBuilder, Progress, own_recipe
from kfbot.evaluate.build.repository import (
    OwnOriginal,
    Registrations,
    fallback_recipe,
    own_candidate,
    own_original,
    registrations,
    staged_modules,
)
from kfbot.evaluate.candidate import ORIGINAL, Candidate, content_hash
from kfbot.evaluate.capture.collect import CaptureResult, capture_signatures
from kfbot.evaluate.capture.imports import StagedModule
from kfbot.evaluate.capture.signature import SIGNATURE_FORMAT, CallSignature, OpRef
from kfbot.evaluate.task import KernelTask
from kfbot.paths import default_skip, inside


@dataclass(frozen=True)
class Captured:
    """The op's call signatures, and the capture run that found them (None when they
    were cached, or when there was nothing to run)."""

    signatures: tuple[CallSignature, ...]
    run: CaptureResult | None = None
    cached: int | None = None


class Preparation:
    def __init__(self, task: KernelTask, builder: Builder,
                 request: Callable[[Candidate], BuildRequest], cache_dir: Path,
                 capture_timeout_s: float, progress: Progress | None = None) -> None:
        self.task = task
        self.builder = builder
        self._request = request
        self._cache_dir = cache_dir
        self._capture_timeout_s = capture_timeout_s
        # The repository's own builds, where it builds itself: with their own budget, and
        # a heartbeat to `progress` while they run.
        self.own = OwnBuilder(cache_dir / "own", task.own_build_timeout_s, progress)
        self._attempt: tuple[BuildResult, OwnOriginal | None] | None = None
        self._real: BuildResult | None = None
        self._staged: tuple[StagedModule, ...] | None = None
        self._captured: Captured | None = None
        self._steps: tuple[StepReport, ...] | None = None
        self._registrations: Registrations | None = None

    def close(self) -> None:
        """Nothing to remove: the repository's own builds are kept, by content, in
        kfbot's cache."""

    # --- the original --------------------------------------------------------------

    def original_attempt(self) -> tuple[BuildResult, OwnOriginal | None]:
        """kfbot's build of the original and, where it failed or the recipe is the
        repository's own, the repository's own build in a scratch copy."""
        if self._attempt is None:
            recipe = self.task.build
            if recipe.kind == "repository":
                mine = own_original(self.task.root, own_recipe(recipe.file), self.own,
                                    self.task.definition, recipe.name)
                self._attempt = (mine.result(), mine)
            else:
                built = self.builder.build(self._request(ORIGINAL))
                own = self._own_original() if not built.ok else None
                self._attempt = (built, own)
        return self._attempt

    def _own_original(self) -> OwnOriginal | None:
        recipe = fallback_recipe(self.task.build)
        if recipe is None:
            return None
        return own_original(self.task.root, recipe, self.own, self.task.definition,
                            self.task.build.name)

    @property
    def own_built(self) -> OwnOriginal | None:
        """The repository's own build, when it is the one the original and the
        candidates use (the recipe is its own, or kfbot's build failed)."""
        built, own = self.original_attempt()
        return own if own is not None and own.ok and not (
            built.ok and self.task.build.kind != "repository") else None

    def repository_build(self) -> BuildResult | None:
        """The original built with the names the repository's code uses: kfbot's build,
        else the repository's own build; None when neither built."""
        if self._real is None:
            built, _ = self.original_attempt()
            own = self.own_built
            if own is not None:
                self._real = own.result()
            elif built.ok:
                request = replace(self._request(ORIGINAL), tag="repo", real_names=True)
                self._real = self.builder.build(request)
            else:
                self._real = built
        return self._real if self._real.ok else None

    def build(self, request: BuildRequest) -> BuildResult:
        """A candidate's build: the repository's own where the original's is, else
        kfbot's."""
        return self.candidate_build(request) or self.builder.build(request)

    def build_many(self, requests: Sequence[BuildRequest]) -> list[BuildResult]:
        """`build` for a batch: kfbot's on every core, the repository's own one at a
        time (its workshop serves one build)."""
        if self.own_built is not None:
            return [self.build(r) for r in requests]
        return self.builder.build_many(requests)

    def candidate_build(self, request: BuildRequest) -> BuildResult | None:
        """A candidate built by the repository's own build, when the original was;
        None when kfbot builds candidates itself."""
        own = self.own_built
        if own is None:
            return None
        if self._registrations is None and own.artifact is not None:
            self._registrations = registrations(own.build, own.artifact)
        assert self._registrations is not None  # an own build that is ok has its library
        return own_candidate(own, self.own, self._registrations, request)

    def staged(self) -> tuple[StagedModule, ...]:
        """The original as the repository's tests import it, under its real names (none
        for the repository's own build: its tests run in the tree it built)."""
        if self._staged is None:
            built = self.repository_build()
            own = self.own_built
            if own is not None and self.task.build.kind == "repository":
                self._staged = ()
            else:
                self._staged = staged_modules(self.task.root, self.task.build, built) \
                    if built is not None else ()
        return self._staged

    def test_tree(self) -> tuple[Path, dict[str, str]]:
        """Where the repository's tests run, and what their environment adds: the tree
        of the repository's own build (its libraries in place, its folder importable as
        an installed package would be), else the repository itself."""
        own = self.own_built
        if own is None or self.task.build.kind != "repository":
            return self.task.root, {}
        tree = own.build.original
        folder = tree / own.build.recipe.folder
        paths = [own.build.recipe.library_root(tree), folder]
        return tree, {"PYTHONPATH": os.pathsep.join(dict.fromkeys(str(p) for p in paths))}

    def op_ref(self) -> OpRef:
        """The op as the repository's code reaches it (in the real-names build, a
        namespace named by a macro is the one that macro stands for; in the
        repository's own build, a module is the library the kernel was found in)."""
        op = self.task.op
        if op.kind == "torch_op":
            real = self.repository_build()
            names = real.library_namespaces if real is not None else {}
            return OpRef.parse(f"torch.ops.{names.get(op.module, op.module)}.{op.name}")
        own = self.own_built
        if op.kind == "module" and own is not None and own.module:
            return OpRef.parse(f"{own.module}.{op.name}")
        return OpRef.parse(f"{op.module}.{op.name}")

    # --- the calls -----------------------------------------------------------------

    @property
    def has_captured(self) -> bool:
        return self._captured is not None

    def captured(self) -> Captured:
        if self._captured is None:
            self._captured = self._load_or_capture()
        return self._captured

    def keep(self, signatures: tuple[CallSignature, ...]) -> None:
        """Only these signatures from now on (those that reach the kernel)."""
        self._captured = replace(self.captured(), signatures=signatures)

    def _load_or_capture(self) -> Captured:
        path = self._cache_dir / "signatures" / f"{self.signature_key()}.json"
        if path.is_file():
            sigs = [CallSignature.from_json(s) for s in json.loads(path.read_text())]
            return Captured(tuple(sigs), cached=len(sigs))
        if not self.task.test_targets and not self.task.script_targets:
            return Captured(())
        tree, env = self.test_tree()
        result = capture_signatures(
            tree,
            self.task.test_targets,
            [self.op_ref()],
            timeout_s=self._capture_timeout_s,
            scripts=self.task.script_targets,
            staged=self.staged(),
            outer=[OpRef.parse(r.outer) for r in self.task.references if r.outer],
            extra_env=env,
        )
        sigs = sorted(result.signatures, key=_size, reverse=True)
        if sigs:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps([s.to_json() for s in sigs]))
        return Captured(tuple(sigs), result)

    def signature_key(self) -> str:
        """Captured signatures stay valid while the repository's Python is unchanged:
        the tests and scripts, and the wrappers they reach the op through."""
        return content_hash(python_sources(self.task.root),
                            {"kernel": self.task.kernel_id, "op": str(self.task.op),
                             "format": str(SIGNATURE_FORMAT)})

    # --- the steps -----------------------------------------------------------------

    def steps(self) -> tuple[StepReport, ...]:
        """The baseline's steps before the GPU: pair, build, import, capture, reference."""
        if self._steps is None:
            self._steps = tuple(self._steps_in_order())
        return self._steps

    def _steps_in_order(self) -> Iterator[StepReport]:
        yield pair_step(self.task)
        built, own = self.original_attempt()
        if self.task.build.kind == "repository":
            build = own_build_step(self.task, own)
        else:
            build = build_step(self.task, built, own.why if own and own.ok else "")
        if build.failed and own is not None and self.task.build.kind != "repository":
            build = replace(build, summary=f"{build.summary}; the repository's own build: "
                            f"{own.why}", evidence="\n".join(filter(None, (
                                build.evidence, own.evidence()))))
        yield build
        if build.failed:
            yield from skipped("build", ("import", "capture", "reference"))
            return
        try:
            captured = self.captured()
        except KfbotError as exc:  # the tests could not even be started
            yield StepReport("import", "skipped", "not run: the tests could not be started")
            yield StepReport("capture", "failed", f"the tests could not be started: {exc}")
            yield from skipped("capture", ("reference",))
            return
        staged = [m.name for m in self.staged()]
        yield from capture_steps(self.task, captured.run, captured.cached, staged)
        yield reference_step(self.task)


def python_sources(root: Path) -> dict[str, str]:
    """Every Python file of the repository by path, read as text; links that leave it
    and build outputs are not followed."""
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):  # links to folders are not walked into
        dirs[:] = sorted(d for d in dirs if not default_skip(d))
        for name in sorted(f for f in files if f.endswith(".py")):
            path = Path(folder) / name
            if not inside(root, path):
                continue
            try:
                found[path.relative_to(root).as_posix()] = path.read_text(errors="replace")
            except OSError:
                continue  # unreadable: it cannot have run either
    return found


def _size(sig: CallSignature) -> int:
    return sum(t.numel for t in sig.tensors())
