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

import logging
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

from kfbot.evaluate.build import cpp_extension
from kfbot.evaluate.build import flags as cmd
from kfbot.evaluate.build.diagnostics import (
    parse_compiler_output,
    parse_ptxas_resources,
    resource_diagnostics,
)
from kfbot.evaluate.build.fast.path import FastPath, path_note
from kfbot.evaluate.build.model import (
    BuildPath,
    BuildPlan,
    BuildRequest,
    BuildResult,
    BuildStage,
    CompiledObject,
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
from kfbot.evaluate.model import Diagnostic, KernelResources
from kfbot.evaluate.sandbox import confined, exit_code, untrusted_env
from kfbot.evaluate.sandbox.policy import finished
from kfbot.evaluate.sandbox.processes import kill_group

log = logging.getLogger(__name__)

COMPILE_TIMEOUT_S = 1800.0  # the most one compile may take, however slow the original's
LINK_TIMEOUT_S = 600.0
# A compile is given this many times what the same unit of the original took, and at
# least MIN_TIMEOUT_S: a candidate that takes longer has hung.
TIMEOUT_FACTOR = 5.0
MIN_TIMEOUT_S = 120.0
STOPPED = "the build was stopped: the run is ending"
_MISSING_LIB = re.compile(r"cannot find -l(?P<lib>\S+?):?(?:\s|$)")


# --- running tools --------------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    returncode: int | None  # None: timed out
    output: str
    seconds: float = 0.0
    timeout_s: float = 0.0


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

    def __init__(self, cache_dir: Path, arch: str | None = None, jobs: int | None = None,
                 timeout_s: float = COMPILE_TIMEOUT_S) -> None:
        self.toolkit = find_toolkit()
        cpp_extension.require_torch()
        self.cache_dir = Path(cache_dir).resolve()
        self.arch_list = arch_list(arch) if arch else default_arch_list()
        self.arch = arch or self.arch_list
        self.jobs = max(1, jobs or _cpu_count())
        self._slots = threading.BoundedSemaphore(self.jobs)  # compiler processes, all builds
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self.timeout_s = timeout_s
        # Seconds the slowest compile of each staged source took (cached ones too): a
        # compile of that source gets TIMEOUT_FACTOR times as long.
        self._took: dict[str, float] = {}
        self._running: set[subprocess.Popen[bytes]] = set()
        self._stopped = threading.Event()
        self.fast = FastPath(self)
        for folder in ("stage", "objects", "artifacts"):
            (self.cache_dir / folder).mkdir(parents=True, exist_ok=True)

    # planning

    def stage(self, request: BuildRequest) -> Staging:
        """Stage `request`'s files (exposed for tests and for the search's reports)."""
        return stage(request, self.cache_dir / "stage")

    def flags(self, request: BuildRequest, staging: Staging) -> cpp_extension.TorchFlags:
        """torch's flags for this recipe, with include folders relative to the stage."""
        recipe = request.recipe
        cflags, cuda_cflags = cmd.recipe_flags(recipe, request.extra_cuda_cflags)
        with_cuda = any(map(cmd.is_cuda, staging.sources)) or bool(recipe.extra_cuda_cflags)
        asked = cpp_extension.FlagRequest(
            internal_name(recipe.name),
            cflags,
            cuda_cflags,
            tuple(cmd.marked(folder) for folder in staging.include_dirs),
            with_cuda,
            self.arch_list,
            self.toolkit.cuda_home,
        )
        found = cpp_extension.torch_flags(asked)
        require_compiler(found.cxx)
        return cpp_extension.TorchFlags(
            *(cmd.unmark(getattr(found, f.name)) for f in fields(cpp_extension.TorchFlags))
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
        flags: cpp_extension.TorchFlags,
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
        """Build one request; a bad candidate is a result with `ok=False`, never raised.

        A candidate of a request that names its kernel takes the fast path where it can
        (`fast`); where it cannot, the full build, and its diagnostics say why."""
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
        if not _candidate(request):
            return self._build_planned(plan, started)
        found = self.fast.build(request, plan, started)
        if isinstance(found, BuildResult):
            note = (f"kernel {request.kernel} compiled alone and linked to the host part, "
                    "compiled once for the original") if found.ok else \
                f"kernel {request.kernel} compiled alone did not finish compiling"
            return _noted(found, "fast", note)
        return _noted(self._build_planned(plan, started), "full", found or "the candidate "
                      "changes no compiled file")

    def warm(self, request: BuildRequest) -> None:
        """What the fast path builds once per original (the host part of the kernel's
        unit), built now: off the first candidate's path."""
        if request.kernel and not request.real_names:
            self.fast.warm(request)

    def warm_later(self, request: BuildRequest) -> None:
        """`warm`, in a thread of its own; the first candidate that needs the host part
        waits for it there (one compile per object, whoever asks first)."""
        threading.Thread(target=self._warm_quietly, args=(request,),
                         name="kfbot-warm-fast-path", daemon=True).start()

    def _warm_quietly(self, request: BuildRequest) -> None:
        try:
            self.warm(request)
        except Exception as exc:  # the first candidate meets the same problem and says it
            log.debug("preparing the fast path failed: %s", exc)

    def build_many(self, requests: Sequence[BuildRequest]) -> list[BuildResult]:
        """Build in parallel (compiles still share the `jobs` slots); results in order."""
        if not requests:
            return []
        workers = min(len(requests), 2 * self.jobs + 2)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kfbot-build") as pool:
            return list(pool.map(self.build, requests))

    def _build_planned(self, plan: BuildPlan, started: float) -> BuildResult:
        return self.link_objects(plan, self._compile_all(plan), started)

    def link_objects(self, plan: BuildPlan, objects: Sequence[CompiledObject],
                     started: float) -> BuildResult:
        """Link compiled objects (when all compiled) into the plan's artifact."""
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
            diagnostics += self.object_diagnostics(plan.staging, item)
            resources += parse_ptxas_resources(item.log)
        resources = list(dict.fromkeys(resources))
        return [*diagnostics, *resource_diagnostics(resources)], resources

    def object_diagnostics(self, staging: Staging, item: CompiledObject) -> list[Diagnostic]:
        found = [
            self._to_repository(d, staging)
            for d in parse_compiler_output(item.log, root=str(staging.directory))
        ]
        if item.ok or any(d.severity == "error" for d in found):
            return found
        origin, _ = staging.files[item.plan.source].locate(None)
        if item.returncode is None:
            message = (f"compiling {origin} took longer than {item.timeout_s:.0f} s and was "
                       "killed")
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
        """Run one tool in its own process group: a timeout or `stop` kills it and all
        it started (nvcc's cicc and ptxas too). Sandboxed like every untrusted process:
        it writes its output's folder only, and sees no /proc of kfbot."""
        env = untrusted_env()  # a candidate can #include what it sees
        argv = confined(command, cwd, _written(command), [self.cache_dir], env)
        with self._slots:
            if self._stopped.is_set():
                return _Run(-1, STOPPED)
            started = time.monotonic()
            try:
                proc = subprocess.Popen(
                    argv, cwd=cwd, env=env,
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                return _Run(127, f"{command[0]}: {exc}")
            with self._guard:
                self._running.add(proc)
            try:
                code, output = _communicate(proc, stdin, timeout, argv)
                code = None if code is None else exit_code(code)
            finally:
                kill_group(proc)
                proc.wait()
                finished(argv)  # what left the group (a separate user's setsid daemons)
                with self._guard:
                    self._running.discard(proc)
        if self._stopped.is_set() and code != 0:
            return _Run(-1, STOPPED, time.monotonic() - started)
        return _Run(code, output, time.monotonic() - started, timeout)

    def stop(self) -> None:
        """Kill every compile and link in progress and start no more: the run ends."""
        self._stopped.set()
        with self._guard:
            running = list(self._running)
        for proc in running:
            kill_group(proc)

    def slowest_compile_s(self) -> float:
        """The longest compile of any unit so far (cached ones as they took then)."""
        with self._guard:
            return max(self._took.values(), default=0.0)

    def compile_timeout(self, source: str) -> float:
        """How long a compile of `source` may take before it counts as hung."""
        took = self._took.get(source)
        if took is None:
            return self.timeout_s
        return min(self.timeout_s, max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * took))

    def compile_object(self, plan: BuildPlan, obj: ObjectPlan) -> CompiledObject:
        """Compile (or find in the cache) one object of `plan`, outside a whole build."""
        return self._compile(plan.staging.directory, obj)

    def compile_in(self, directory: Path, obj: ObjectPlan) -> CompiledObject:
        """Compile (or find in the cache) an object from the files of `directory`."""
        return self._compile(directory, obj)

    def _compile(
        self, directory: Path, plan: ObjectPlan, stdin: str | None = None
    ) -> CompiledObject:
        target = self.cache_dir / "objects" / f"{plan.key}.o"
        log = target.with_suffix(".log")
        with self._exclusive(plan.key):
            if target.exists():
                text = log.read_text(errors="replace") if log.exists() else ""
                self._note_time(plan.source, _recorded_seconds(target))
                return CompiledObject(plan, target, True, True, text)
            scratch = target.with_name(f".{plan.key}.{uuid.uuid4().hex}.o")
            run = self._run(_with_output(plan.command, str(scratch)), directory,
                            self.compile_timeout(plan.source), stdin)
            ok = run.returncode == 0 and scratch.exists()
            if ok:
                _write_atomic(log, run.output.encode("utf-8"))
                _write_atomic(target.with_suffix(".seconds"), f"{run.seconds:.3f}".encode())
                os.replace(scratch, target)
                self._note_time(plan.source, run.seconds)
            else:
                scratch.unlink(missing_ok=True)
            return CompiledObject(plan, target, ok, False, run.output, run.returncode,
                                  run.seconds, run.timeout_s)

    def _note_time(self, source: str, seconds: float | None) -> None:
        if seconds is not None:
            with self._guard:
                self._took[source] = max(seconds, self._took.get(source, 0.0))

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


def _candidate(request: BuildRequest) -> bool:
    """A candidate that names its kernel: one the fast path may build."""
    return bool(request.kernel) and not request.real_names and bool(
        request.files or request.params or request.extra_cuda_cflags)


def _noted(result: BuildResult, path: BuildPath, why: str) -> BuildResult:
    return replace(result, path=path, diagnostics=(*result.diagnostics, path_note(path, why)))


def _communicate(proc: subprocess.Popen[bytes], stdin: str | None, timeout: float,
                 argv: Sequence[str]) -> tuple[int | None, str]:
    """(exit code or None when it timed out, output); the group is killed on a timeout,
    and what left it (it could hold the output open)."""
    data = stdin.encode("utf-8") if stdin is not None else None
    try:
        output, _ = proc.communicate(data, timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        kill_group(proc)
        finished(argv)
        output, _ = proc.communicate()
        code = None
    return code, (output or b"").decode("utf-8", errors="replace")


def _recorded_seconds(target: Path) -> float | None:
    try:
        return float(target.with_suffix(".seconds").read_text())
    except (OSError, ValueError):
        return None


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
    if library in ("torch_cuda", "c10_cuda") and not cpp_extension.has_cuda_libraries():
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
