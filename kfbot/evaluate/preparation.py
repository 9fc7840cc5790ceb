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
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from kfbot.evaluate.baseline import (
    build_step,
    capture_steps,
    pair_step,
    reference_step,
    skipped,
)
from kfbot.evaluate.build import Builder, BuildRequest, BuildResult
from kfbot.evaluate.candidate import ORIGINAL, Candidate, content_hash
from kfbot.evaluate.capture_run import CaptureResult, capture_signatures
from kfbot.evaluate.repository_build import Fallback, setup_py_fallback, staged_modules
from kfbot.evaluate.sandbox import scratch_root
from kfbot.evaluate.signature import SIGNATURE_FORMAT, CallSignature, OpRef
from kfbot.evaluate.staged import StagedModule
from kfbot.evaluate.steps import StepReport
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
                 capture_timeout_s: float) -> None:
        self.task = task
        self.builder = builder
        self._request = request
        self._cache_dir = cache_dir
        self._capture_timeout_s = capture_timeout_s
        self._attempt: tuple[BuildResult, Fallback | None] | None = None
        self._real: BuildResult | None = None
        self._staged: tuple[StagedModule, ...] | None = None
        self._captured: Captured | None = None
        self._steps: tuple[StepReport, ...] | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    def close(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()

    # --- the original --------------------------------------------------------------

    def original_attempt(self) -> tuple[BuildResult, Fallback | None]:
        """kfbot's build of the original and, where it failed on a setup.py extension,
        the repository's own build in a scratch copy."""
        if self._attempt is None:
            built = self.builder.build(self._request(ORIGINAL))
            fallback = None
            if not built.ok and self.task.build.kind == "setup_py":
                if self._scratch is None:
                    # Where the sandboxed GPU worker can read the extension it builds.
                    self._scratch = tempfile.TemporaryDirectory(prefix="kfbot-setup-",
                                                                dir=scratch_root())
                fallback = setup_py_fallback(self.task.root, self.task.build,
                                             Path(self._scratch.name))
            self._attempt = (built, fallback)
        return self._attempt

    def repository_build(self) -> BuildResult | None:
        """The original built with the names the repository's code uses: kfbot's build,
        else the repository's own setup.py build; None when neither built."""
        if self._real is None:
            built, fallback = self.original_attempt()
            if fallback is not None and fallback.ok:
                self._real = fallback.result(self.task.build)
            elif built.ok:
                request = replace(self._request(ORIGINAL), tag="repo", real_names=True)
                self._real = self.builder.build(request)
            else:
                self._real = built
        return self._real if self._real.ok else None

    def staged(self) -> tuple[StagedModule, ...]:
        """The original as the repository's tests import it, under its real names."""
        if self._staged is None:
            built = self.repository_build()
            self._staged = staged_modules(self.task.root, self.task.build, built) \
                if built is not None else ()
        return self._staged

    def op_ref(self) -> OpRef:
        """The op as the repository's code reaches it (in the real-names build, a
        namespace named by a macro is the one that macro stands for)."""
        op = self.task.op
        if op.kind == "torch_op":
            real = self.repository_build()
            names = real.library_namespaces if real is not None else {}
            return OpRef.parse(f"torch.ops.{names.get(op.module, op.module)}.{op.name}")
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
        result = capture_signatures(
            self.task.root,
            self.task.test_targets,
            [self.op_ref()],
            timeout_s=self._capture_timeout_s,
            scripts=self.task.script_targets,
            staged=self.staged(),
            outer=[OpRef.parse(r.outer) for r in self.task.references if r.outer],
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
        built, fallback = self.original_attempt()
        build = build_step(self.task, built, fallback.why if fallback and fallback.ok else "")
        if build.failed and fallback is not None:
            build = replace(build, summary=f"{build.summary}; the fallback: {fallback.why}",
                            evidence="\n".join(filter(None, (build.evidence,
                                                               fallback.evidence()))))
        yield build
        if build.failed:
            yield from skipped("build", ("import", "capture", "reference"))
            return
        captured = self.captured()
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
