"""The fast path: a candidate's kernel compiled alone and linked to the host part of its
unit, which was compiled once for the original (see `split` for how a unit is cut).

    fast = FastPath(builder)
    found = fast.build(request, plan)   # a BuildResult, or why the full build is needed

Every answer that is not a build says why, in words the evaluation's diagnostics carry;
the builder then compiles the unit whole. Nothing here turns a candidate that the full
build would build into a failed build: a kernel's unit that does not compile, or a link
that fails, also sends the candidate to the full build, with the compiler's words.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Protocol

from kfbot.evaluate.build import flags as cmd
from kfbot.evaluate.build.fast.split import (
    Refused,
    Split,
    host_difference,
    includes_host_headers,
    instantiations,
    split_unit,
)
from kfbot.evaluate.build.model import (
    BuildPlan,
    BuildRequest,
    BuildResult,
    CompiledObject,
    ObjectPlan,
    StagedFile,
    Staging,
    digest,
)
from kfbot.evaluate.build.stage import normal, write_stage
from kfbot.evaluate.build.toolkit import Toolkit
from kfbot.evaluate.model import Diagnostic


class Compiler(Protocol):
    """What the fast path asks of the builder that owns it (`builder.Builder`)."""

    toolkit: Toolkit
    cache_dir: Path

    def plan(self, request: BuildRequest) -> BuildPlan: ...
    def compile_object(self, plan: BuildPlan, obj: ObjectPlan) -> CompiledObject: ...
    def compile_in(self, directory: Path, obj: ObjectPlan) -> CompiledObject: ...
    def link_objects(self, plan: BuildPlan, objects: Sequence[CompiledObject],
                     started: float) -> BuildResult: ...
    def object_diagnostics(self, staging: Staging, item: CompiledObject) -> list[Diagnostic]: ...


# nvcc 13 gives a template kernel's host stub internal linkage unless told otherwise;
# the host part launches instantiations that the kernel's unit defines.
TEMPLATE_STUBS = "-static-global-template-stub=false"
_UNDEFINED = re.compile(r"^\s*U (?P<symbol>.+)$")
# What the torch headers include that a kernel may use without including it.
STANDARD_HEADERS = ("cassert", "cfloat", "climits", "cmath", "cstddef", "cstdint", "cstdio",
                    "cstdlib", "cstring", "algorithm", "limits", "type_traits", "utility")


@dataclass(frozen=True)
class _Origin:
    """The original's build plan and, by unit, how it splits around the kernel."""

    plan: BuildPlan
    splits: Mapping[str, Split | Refused]


class FastPath:
    def __init__(self, builder: Compiler) -> None:
        self.builder = builder
        self._guard = threading.Lock()
        self._origins: dict[str, _Origin] = {}
        self._host_failures: dict[str, str] = {}  # host object key -> why it failed

    # --- deciding --------------------------------------------------------------------

    def build(self, request: BuildRequest, plan: BuildPlan, started: float
              ) -> BuildResult | str:
        """The candidate built the fast way, or why it takes the full build. A kernel's
        unit that hangs its compiler is a failed build: the full build would hang too."""
        made = self.objects(request, plan)
        if isinstance(made, str):
            return made
        host, device, unit = made
        if device.returncode is None:
            return self.builder.link_objects(plan, [device], started)
        if not device.ok:
            return f"the kernel's unit did not compile alone: " \
                   f"{_first_error(self.builder, plan, device)}"
        return self._link(plan, unit, host, device, started)

    def objects(self, request: BuildRequest, plan: BuildPlan
                ) -> tuple[CompiledObject, CompiledObject, str] | str:
        """The host part's object (cached) and the kernel's unit's, compiled, with the
        unit they stand for; or why the candidate cannot be split."""
        origin = self._origin(request)
        unit = self._changed_unit(request, plan, origin)
        if isinstance(unit, Refused):
            return unit.reason
        if not unit:
            return "the candidate changes no compiled file"
        original = origin.splits.get(unit)
        if original is None:
            return f"{unit} is not a CUDA unit of the original build"
        if isinstance(original, Refused):
            return original.reason
        candidate = split_unit(unit, _texts(plan, unit), request.kernel)
        if isinstance(candidate, Refused):
            return candidate.reason
        why = host_difference(original, candidate) or _params_in_host(request, candidate)
        if why:
            return why
        host = self._host_object(origin, original)
        if isinstance(host, str):
            return host
        made = self._instantiations(host, original)
        if isinstance(made, Refused):
            return made.reason
        return host, self._device_object(plan, candidate, made), unit

    def _origin(self, request: BuildRequest) -> _Origin:
        key = digest("origin", request.recipe, str(request.root), request.kernel,
                     request.inline_sources)
        with self._guard:
            found = self._origins.get(key)
        if found is not None:
            return found
        plan = self.builder.plan(replace(request, files={}, params={}, tag="orig",
                                         extra_cuda_cflags=()))
        splits = {unit: _split_or_refuse(plan, unit, request.kernel)
                  for unit in plan.staging.sources if cmd.is_cuda(unit)}
        made = _Origin(plan, splits)
        with self._guard:
            self._origins[key] = made
        return made

    def _changed_unit(self, request: BuildRequest, plan: BuildPlan, origin: _Origin
                      ) -> str | Refused:
        """The one unit whose files the candidate changes ("" for none), or why not."""
        changed = {normal(path) for path, text in request.files.items()
                   if _original_text(request.root, normal(path)) != text}
        closure = plan.staging.closure
        units = [u for u in plan.staging.sources if changed & {u, *closure.get(u, ())}]
        if not units and (request.params or request.extra_cuda_cflags):
            # Build parameters only: they matter to the kernel's unit (the host part
            # is checked for the names below).
            units = [u for u, found in origin.splits.items() if isinstance(found, Split)]
        if not units:
            return ""
        if len(units) > 1:
            return Refused(f"the candidate changes files that {len(units)} units compile "
                           f"({', '.join(units)})")
        return units[0]

    # --- building --------------------------------------------------------------------

    def warm(self, request: BuildRequest) -> None:
        """Compile the host part of the unit that defines the kernel, ahead of the first
        candidate (it takes as long as the original's unit)."""
        origin = self._origin(request)
        for split in origin.splits.values():
            if isinstance(split, Split):
                self._host_object(origin, split)

    def _host_object(self, origin: _Origin, split: Split) -> CompiledObject | str:
        obj = _unit_plan(origin.plan, split.unit, split.host, self.builder.toolkit.nvcc)
        with self._guard:
            failed = self._host_failures.get(obj.key)
        if failed is not None:
            return failed
        directory = _staged(self.builder, origin.plan, split.host)
        made = self.builder.compile_in(directory, obj)
        if not made.ok:
            why = f"the host part of {split.unit} did not compile: " \
                  f"{_first_error(self.builder, origin.plan, made)}"
            with self._guard:
                self._host_failures[obj.key] = why
            return why
        return made

    def _instantiations(self, host: CompiledObject, split: Split) -> list[str] | Refused:
        if not any(m.template for m in split.moved):
            return []
        try:
            run = subprocess.run(["nm", "-C", "-u", str(host.path)], capture_output=True,
                                 text=True, errors="replace", timeout=60, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return Refused(f"nm (binutils) could not list the host part's symbols: {exc}")
        if run.returncode != 0:
            return Refused(f"nm could not list the host part's symbols: {run.stderr.strip()}")
        symbols = [m["symbol"].strip() for m in map(_UNDEFINED.match, run.stdout.splitlines())
                   if m is not None]
        return instantiations(split, symbols)

    def _device_object(self, plan: BuildPlan, split: Split, made: Sequence[str]
                       ) -> CompiledObject:
        """The kernel's unit compiled; where it fails, once more with the standard
        headers the torch headers brought it (a kernel may use std:: names it never
        included itself)."""
        files = dict(split.device)
        if made:  # after everything the unit includes, so every name is declared
            files[split.unit] = files[split.unit].rstrip("\n") + "\n" + " ".join(made) + "\n"
        directory = _staged(self.builder, plan, files)
        nvcc = self.builder.toolkit.nvcc
        first = self.builder.compile_in(directory, _unit_plan(plan, split.unit, files, nvcc))
        if first.ok or first.returncode is None:
            return first
        again = self.builder.compile_in(directory, _unit_plan(plan, split.unit, files, nvcc,
                                                              STANDARD_HEADERS))
        return again if again.ok else first

    def _link(self, plan: BuildPlan, unit: str, host: CompiledObject,
              device: CompiledObject, started: float) -> BuildResult | str:
        others = [o for o in plan.objects if o.source != unit]
        split_plan = replace(plan, objects=(*others, host.plan, device.plan),
                             link_key=digest("split-link", plan.link_key, host.plan.key,
                                             device.plan.key))
        compiled = [self.builder.compile_object(plan, o) for o in others]
        if not all(o.ok for o in compiled):
            return "another unit of the build did not compile"
        result = self.builder.link_objects(split_plan, [*compiled, host, device], started)
        if not result.ok:
            first = next((d.message for d in result.diagnostics if d.severity == "error"), "")
            return f"linking the kernel's unit to the host part failed: {first}"
        return result


def _split_or_refuse(plan: BuildPlan, unit: str, kernel: str) -> Split | Refused:
    files = _texts(plan, unit)
    if not includes_host_headers(files):
        return Refused(f"{unit} includes no torch headers: compiled whole, which is fast")
    return split_unit(unit, files, kernel)


def _texts(plan: BuildPlan, unit: str) -> dict[str, str]:
    """The unit and the local headers it includes, as staged."""
    staged = plan.staging.files
    return {path: staged[path].text for path in (unit, *plan.staging.closure[unit])
            if path in staged}


def _original_text(root: Path, path: str) -> str | None:
    try:
        return (root / path).read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def _params_in_host(request: BuildRequest, split: Split) -> str | None:
    """A -D value the host part reads would make it another object than the original's."""
    text = "\n".join(split.host.values())
    used = sorted(n for n in request.params if re.search(rf"\b{re.escape(n)}\b", text))
    if used:
        return f"the candidate sets {', '.join(used)}, which the host part reads too"
    return None


@cache
def _template_stub_flag(nvcc: str) -> tuple[str, ...]:
    """The flag where this nvcc has it (12.8 and later); before, template stubs were
    external anyway."""
    try:
        shown = subprocess.run([nvcc, "--help"], capture_output=True, text=True, timeout=60,
                               check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return (TEMPLATE_STUBS,) if "static-global-template-stub" in shown else ()


def _unit_plan(plan: BuildPlan, unit: str, files: Mapping[str, str], nvcc: str,
               headers_first: Sequence[str] = ()) -> ObjectPlan:
    """The unit's compile as the plan has it, over `files`, keyed by their texts."""
    obj = next(o for o in plan.objects if o.source == unit)
    forced = [word for header in headers_first for word in ("-include", header)]
    command = (*obj.command, *_template_stub_flag(nvcc), *forced)
    headers = [(h, files.get(h) or plan.staging.text(h)) for h in plan.staging.closure[unit]]
    return ObjectPlan(unit, command, cmd.object_key(command, unit, files[unit], headers), True)


def _staged(builder: Compiler, plan: BuildPlan, files: Mapping[str, str]) -> Path:
    """A stage folder holding the plan's files with `files` in place of theirs."""
    staged: dict[str, StagedFile] = dict(plan.staging.files)
    staged.update({p: replace(staged[p], text=t) for p, t in files.items() if p in staged})
    key = digest("stage", sorted((p, s.text) for p, s in staged.items()))
    directory = builder.cache_dir / "stage" / key
    write_stage(directory, staged)
    return directory


def _first_error(builder: Compiler, plan: BuildPlan, made: CompiledObject) -> str:
    found = builder.object_diagnostics(plan.staging, made)
    first = next((d for d in found if d.severity == "error"), None)
    if first is None:
        return "no message"
    where = f"{first.file}:{first.line}: " if first.file and first.line else ""
    return where + first.message


def path_note(path: str, why: str) -> Diagnostic:
    """The evaluation's record of how its candidate was built, and why."""
    return Diagnostic("build", "build_path", f"{path} build: {why}", "info")
