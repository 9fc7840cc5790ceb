"""Build an extension the way its repository does, object by object, with a cache.

A candidate usually changes one small `.cu` file, while the bindings `.cpp` that
includes all of torch takes most of the compile time. So the builder does not run
torch's ninja build: it asks torch for the exact flags once, then compiles each
translation unit itself, keyed by everything that can change the object (compiler,
flags, the source and every local header it includes), and links the objects.

Every build happens in a staged copy of the files it needs, with the candidate's
edits applied, compiled from inside that copy with relative paths: objects and
compiler messages then do not depend on where the copy lives, which is what lets
one candidate reuse another's objects, and diagnostics name repository files.

A bad candidate never raises: it yields a `BuildResult` with `ok=False`, the stage
it stopped at and the compiler's diagnostics. Only a missing tool (nvcc, torch, a
C++ compiler) raises `KfbotError`.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from itertools import pairwise
from pathlib import Path

from kfbot.evaluate import torch_build
from kfbot.evaluate.build import flags as cmd
from kfbot.evaluate.build.model import (
    BuildPlan,
    BuildRequest,
    BuildResult,
    BuildStage,
    ObjectPlan,
    StageError,
    Staging,
    digest,
    internal_name,
    module_name,
    real_module_name,
)
from kfbot.evaluate.build.stage import normal, stage
from kfbot.evaluate.build.toolkit import (
    arch_list,
    default_arch_list,
    find_toolkit,
    require_compiler,
)
from kfbot.evaluate.diagnostics import (
    parse_compiler_output,
    parse_ptxas_resources,
    resource_diagnostics,
)
from kfbot.evaluate.model import Diagnostic, KernelResources
from kfbot.evaluate.sandbox import confined, exit_code, untrusted_env

COMPILE_TIMEOUT_S = 1800.0
LINK_TIMEOUT_S = 600.0
_MISSING_LIB = re.compile(r"cannot find -l(?P<lib>\S+?):?(?:\s|$)")


# --- running tools --------------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    returncode: int | None  # None: timed out
    output: str
    seconds: float = 0.0


@dataclass(frozen=True)
class CompiledObject:
    """One object file, compiled now or found in the cache, with its compiler output."""

    plan: ObjectPlan
    path: Path
    ok: bool
    reused: bool
    log: str
    returncode: int | None = 0
    seconds: float = 0.0  # compile time; 0 for a reused object


def _write_atomic(path: Path, data: bytes) -> None:
    scratch = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    scratch.write_bytes(data)
    os.replace(scratch, path)


def _with_output(command: Sequence[str], output: str) -> list[str]:
    return [output if word == cmd.OUTPUT else word for word in command]


def _written(command: Sequence[str]) -> list[Path]:
    """The folder of the command's `-o` output: all a compile or link may write."""
    return [Path(after).parent for word, after in pairwise(command) if word == "-o"]


# --- the builder ----------------------------------------------------------------------


def _cpu_count() -> int:
    # The cores this process may use (a container's share), not the host's.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


class Builder:
    """Builds recipes and candidates; one instance is shared by every build of a run."""

    def __init__(self, cache_dir: Path, arch: str | None = None, jobs: int | None = None) -> None:
        self.toolkit = find_toolkit()
        torch_build.require_torch()
        self.cache_dir = Path(cache_dir).resolve()
        self.arch_list = arch_list(arch) if arch else default_arch_list()
        self.arch = arch or self.arch_list
        self.jobs = max(1, jobs or _cpu_count())
        self._slots = threading.BoundedSemaphore(self.jobs)  # compiler processes, all builds
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        for folder in ("stage", "objects", "artifacts"):
            (self.cache_dir / folder).mkdir(parents=True, exist_ok=True)

    # planning

    def stage(self, request: BuildRequest) -> Staging:
        """Stage `request`'s files (exposed for tests and for the search's reports)."""
        return stage(request, self.cache_dir / "stage")

    def flags(self, request: BuildRequest, staging: Staging) -> torch_build.TorchFlags:
        """torch's flags for this recipe, with include folders relative to the stage."""
        recipe = request.recipe
        cflags, cuda_cflags = cmd.recipe_flags(recipe, request.extra_cuda_cflags)
        with_cuda = any(map(cmd.is_cuda, staging.sources)) or bool(recipe.extra_cuda_cflags)
        asked = torch_build.FlagRequest(
            internal_name(recipe.name),
            cflags,
            cuda_cflags,
            tuple(cmd.marked(folder) for folder in staging.include_dirs),
            with_cuda,
            self.arch_list,
            self.toolkit.cuda_home,
        )
        found = torch_build.torch_flags(asked)
        require_compiler(found.cxx)
        return torch_build.TorchFlags(
            *(cmd.unmark(getattr(found, f.name)) for f in fields(torch_build.TorchFlags))
        )

    def plan(self, request: BuildRequest) -> BuildPlan:
        """Stage, then name every object and the artifact by its cache key; nothing runs."""
        staging = self.stage(request)
        flags = self.flags(request, staging)
        objects = tuple(
            self._object_plan(flags, staging, source, request.params) for source in staging.sources
        )
        module = (real_module_name(request.recipe.name) if request.real_names
                  else module_name(request.recipe.name, request.tag))
        internal = internal_name(request.recipe.name)
        shim = (
            cmd.shim_plan(flags.cxx, module, internal)
            if staging.python_module and module != internal
            else None
        )
        dlink = (*flags.nvcc, *flags.cuda_dlink_post_cflags) if flags.cuda_dlink_post_cflags else ()
        ldflags = cmd.link_flags(flags)
        keys = [o.key for o in objects] + ([shim.key] if shim else [])
        link_key = digest("link", keys, cmd.resolved(flags.cxx), flags.cxx, ldflags, dlink, module)
        return BuildPlan(
            staging, module, internal, objects, shim, flags.cxx, ldflags, dlink, link_key
        )

    def _object_plan(
        self,
        flags: torch_build.TorchFlags,
        staging: Staging,
        source: str,
        params: Mapping[str, str],
    ) -> ObjectPlan:
        headers = [(h, staging.text(h)) for h in staging.closure[source]]
        everything = "\n".join([staging.text(source), *(text for _, text in headers)])
        cuda = cmd.is_cuda(source) and bool(flags.nvcc)
        command = cmd.compile_command(flags, source, cuda, params, everything)
        return ObjectPlan(
            source, command, cmd.object_key(command, source, staging.text(source), headers), cuda
        )

    # building

    def build(self, request: BuildRequest) -> BuildResult:
        """Build one request; a bad candidate is a result with `ok=False`, never raised."""
        started = time.monotonic()
        try:
            plan = self.plan(request)
        except StageError as problem:
            return BuildResult(
                ok=False,
                stage="stage",
                artifact=None,
                module_name=module_name(request.recipe.name, request.tag),
                library_namespaces={},
                diagnostics=(problem.diagnostic,),
                resources=(),
                seconds=time.monotonic() - started,
                compiled=0,
                reused=0,
                key="",
            )
        return self._build_planned(plan, started)

    def build_many(self, requests: Sequence[BuildRequest]) -> list[BuildResult]:
        """Build in parallel (compiles still share the `jobs` slots); results in order."""
        if not requests:
            return []
        workers = min(len(requests), 2 * self.jobs + 2)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kfbot-build") as pool:
            return list(pool.map(self.build, requests))

    def _build_planned(self, plan: BuildPlan, started: float) -> BuildResult:
        objects = self._compile_all(plan)
        diagnostics, resources = self._object_findings(plan, objects)
        stage: BuildStage = "compile"
        artifact: Path | None = None
        if all(o.ok for o in objects):
            artifact, linked = self._link(plan, objects)
            diagnostics += linked
            stage = "link" if artifact is None else "done"
        compiled = sum(not o.reused for o in objects)
        return BuildResult(
            ok=artifact is not None,
            stage=stage,
            artifact=artifact,
            module_name=plan.module_name,
            library_namespaces=dict(plan.staging.library_namespaces),
            diagnostics=tuple(diagnostics),
            resources=tuple(resources),
            seconds=time.monotonic() - started,
            compiled=compiled,
            reused=len(objects) - compiled,
            key=plan.link_key,
        )

    def _compile_all(self, plan: BuildPlan) -> list[CompiledObject]:
        if len(plan.objects) == 1:
            return [self._compile(plan.staging.directory, plan.objects[0])]
        with ThreadPoolExecutor(max_workers=len(plan.objects)) as pool:
            return list(pool.map(lambda o: self._compile(plan.staging.directory, o), plan.objects))

    def _object_findings(
        self, plan: BuildPlan, objects: Sequence[CompiledObject]
    ) -> tuple[list[Diagnostic], list[KernelResources]]:
        diagnostics: list[Diagnostic] = []
        resources: list[KernelResources] = []
        for item in objects:
            diagnostics += self._compile_diagnostics(plan.staging, item)
            resources += parse_ptxas_resources(item.log)
        resources = list(dict.fromkeys(resources))
        return [*diagnostics, *resource_diagnostics(resources)], resources

    def _compile_diagnostics(self, staging: Staging, item: CompiledObject) -> list[Diagnostic]:
        found = [
            self._to_repository(d, staging)
            for d in parse_compiler_output(item.log, root=str(staging.directory))
        ]
        if item.ok or any(d.severity == "error" for d in found):
            return found
        origin, _ = staging.files[item.plan.source].locate(None)
        if item.returncode is None:
            message = f"compiling {origin} took longer than {COMPILE_TIMEOUT_S:.0f} s"
            return [*found, Diagnostic("build", "compile_timeout", message, "error", origin)]
        last = next((line for line in reversed(item.log.splitlines()) if line.strip()), "")
        message = f"compiling {origin} failed (exit {item.returncode}): {last.strip()}"
        return [*found, Diagnostic("build", "compile_error", message.rstrip(": "), "error", origin)]

    def _to_repository(self, diagnostic: Diagnostic, staging: Staging) -> Diagnostic:
        """Staged paths (of this or any other stage folder) back to repository paths."""
        if diagnostic.file is None:
            return diagnostic
        path = normal(diagnostic.file)
        stage_root = str(self.cache_dir / "stage") + "/"
        if path.startswith(stage_root):
            path = path[len(stage_root) :].partition("/")[2]
        staged = staging.files.get(path)
        if staged is None:
            return replace(diagnostic, file=path)
        file, line = staged.locate(diagnostic.line)
        return replace(diagnostic, file=file, line=line)

    # compiling and linking

    @contextmanager
    def _exclusive(self, key: str) -> Iterator[None]:
        """One thread per cache entry: the second waits, then finds it built."""
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            yield

    def _run(
        self, command: Sequence[str], cwd: Path, timeout: float, stdin: str | None = None
    ) -> _Run:
        env = untrusted_env()  # a candidate can #include what it sees
        # Sandboxed too: it writes its output's folder only, and sees no /proc of kfbot.
        argv = confined(command, cwd, _written(command), [self.cache_dir], env)
        with self._slots:
            started = time.monotonic()
            try:
                done = subprocess.run(
                    argv,
                    cwd=cwd,
                    env=env,
                    input=stdin,
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    errors="replace",
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired as expired:
                output = expired.output
                text = output.decode(errors="replace") if isinstance(output, bytes) else ""
                return _Run(None, text or "", time.monotonic() - started)
            except OSError as exc:
                return _Run(127, f"{command[0]}: {exc}")
        return _Run(exit_code(done.returncode), done.stdout or "", time.monotonic() - started)

    def compile_object(self, plan: BuildPlan, obj: ObjectPlan) -> CompiledObject:
        """Compile (or find in the cache) one object of `plan`, outside a whole build."""
        return self._compile(plan.staging.directory, obj)

    def _compile(
        self, directory: Path, plan: ObjectPlan, stdin: str | None = None
    ) -> CompiledObject:
        target = self.cache_dir / "objects" / f"{plan.key}.o"
        log = target.with_suffix(".log")
        with self._exclusive(plan.key):
            if target.exists():
                text = log.read_text(errors="replace") if log.exists() else ""
                return CompiledObject(plan, target, True, True, text)
            scratch = target.with_name(f".{plan.key}.{uuid.uuid4().hex}.o")
            run = self._run(
                _with_output(plan.command, str(scratch)), directory, COMPILE_TIMEOUT_S, stdin
            )
            ok = run.returncode == 0 and scratch.exists()
            if ok:
                _write_atomic(log, run.output.encode("utf-8"))
                os.replace(scratch, target)
            else:
                scratch.unlink(missing_ok=True)
            return CompiledObject(plan, target, ok, False, run.output, run.returncode, run.seconds)

    def _link(
        self, plan: BuildPlan, objects: Sequence[CompiledObject]
    ) -> tuple[Path | None, list[Diagnostic]]:
        folder = self.cache_dir / "artifacts" / plan.link_key
        target = folder / f"{plan.module_name}.so"
        with self._exclusive(plan.link_key):
            if target.exists():
                return target, []
            inputs = [str(o.path) for o in objects]
            if plan.shim is not None:
                shim = self._compile(
                    folder.parent, plan.shim, cmd.shim_text(plan.module_name, plan.internal_name)
                )
                if not shim.ok:
                    return None, self._link_diagnostics(shim.log) or [
                        _link_failure(_Run(shim.returncode, shim.log))
                    ]
                inputs.append(str(shim.path))
            folder.mkdir(parents=True, exist_ok=True)
            if plan.dlink:
                device = self._device_link(plan, folder, [o for o in objects if o.plan.cuda])
                if isinstance(device, list):
                    return None, device
                inputs.append(str(device))
            return self._link_run(plan, folder, target, inputs)

    def _device_link(
        self, plan: BuildPlan, folder: Path, objects: Sequence[CompiledObject]
    ) -> Path | list[Diagnostic]:
        target = folder / "dlink.o"
        head, flags = plan.dlink[:1], plan.dlink[1:]
        run = self._run(
            [*head, *(str(o.path) for o in objects), "-o", str(target), *flags],
            folder,
            LINK_TIMEOUT_S,
        )
        return target if run.returncode == 0 else self._link_diagnostics(run.output)

    def _link_run(
        self, plan: BuildPlan, folder: Path, target: Path, inputs: Sequence[str]
    ) -> tuple[Path | None, list[Diagnostic]]:
        scratch = folder / f".{plan.module_name}.{uuid.uuid4().hex}.so"
        command = [*plan.cxx, *inputs, *plan.ldflags, "-o", str(scratch)]
        run = self._run(command, folder, LINK_TIMEOUT_S)
        found = self._link_diagnostics(run.output)
        if run.returncode != 0 or not scratch.exists():
            scratch.unlink(missing_ok=True)
            return None, found or [_link_failure(run)]
        os.replace(scratch, target)
        return target, found

    def _link_diagnostics(self, output: str) -> list[Diagnostic]:
        return [_explain_link(d) for d in parse_compiler_output(output)]


def _link_failure(run: _Run) -> Diagnostic:
    last = next((line for line in reversed(run.output.splitlines()) if line.strip()), "")
    why = "timed out" if run.returncode is None else f"exit {run.returncode}"
    return Diagnostic("build", "link_error", f"linking failed ({why}): {last.strip()}".rstrip(": "))


def _explain_link(diagnostic: Diagnostic) -> Diagnostic:
    """Say what a missing library means: usually a CPU-only torch or a partial toolkit."""
    match = _MISSING_LIB.search(diagnostic.message)
    if match is None:
        return diagnostic
    library = match["lib"]
    if library in ("torch_cuda", "c10_cuda") and not torch_build.has_cuda_libraries():
        why = (
            "this torch has no CUDA libraries (a CPU-only build); install a CUDA build of "
            "PyTorch to link CUDA extensions"
        )
    elif library == "cudart":
        why = "the CUDA runtime library is missing from the toolkit's lib64 folder"
    else:
        return diagnostic
    return replace(
        diagnostic,
        message=f"cannot find -l{library}: {why}",
        details=(*diagnostic.details, ("library", library)),
    )
