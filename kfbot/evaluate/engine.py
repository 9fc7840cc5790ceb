"""The evaluation engine: build, capture inputs, verify and benchmark in the worker.

    engine = Engine(task, EngineSettings(cache_dir=...))
    with engine:
        base = engine.baseline()          # the original must pass its own reference
        result = engine.evaluate(candidate)

Builds run here (in parallel, cached by content); everything that touches the GPU
runs in one isolated worker session, restarted after any crash.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kfbot.anticheat.adequacy import Adequacy, check_adequacy, load_cached
from kfbot.anticheat.findings import Finding, strict
from kfbot.anticheat.physics import physics_findings
from kfbot.anticheat.rules import load_rules
from kfbot.anticheat.sources import kernel_names, static_input, units
from kfbot.anticheat.static import static_findings
from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
from kfbot.evaluate.baseline import (
    build_step,
    capture_steps,
    comparison_step,
    pair_step,
    reference_step,
    skipped,
)
from kfbot.evaluate.build import Builder, BuildRequest, BuildResult
from kfbot.evaluate.candidate import ORIGINAL, Candidate, content_hash
from kfbot.evaluate.capture_run import CaptureResult, capture_signatures
from kfbot.evaluate.evaluation import Check, Evaluation, Stage, failed, shape_timings
from kfbot.evaluate.finalist import FinalistResult, run_finalist
from kfbot.evaluate.repository_build import Fallback, setup_py_fallback, staged_modules
from kfbot.evaluate.signature import SIGNATURE_FORMAT, CallSignature, OpRef
from kfbot.evaluate.staged import StagedModule
from kfbot.evaluate.steps import NO_REFERENCE, StepReport, first_failure
from kfbot.evaluate.task import KernelTask
from kfbot.evaluate.worker import JobResult, WorkerSession
from kfbot.paths import default_skip, inside
from kfbot.scan.model import InlineSource
from kfbot.scan.python_facts import extract_python_facts

JOBS = "kfbot.evaluate.device.jobs"
KFBOT_PARENT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Prepared:
    """A candidate's work before the GPU: its static findings, and its build unless a
    strict finding rejected it first."""

    findings: tuple[Finding, ...]
    built: BuildResult | None


@dataclass(frozen=True)
class Captured:
    """The op's call signatures, and the capture run that found them (None when they
    were cached, or when there was nothing to run)."""

    signatures: tuple[CallSignature, ...]
    run: CaptureResult | None = None
    cached: int | None = None


@dataclass(frozen=True)
class EngineSettings:
    cache_dir: Path
    gpu: int | None = None
    seeds: int = 3
    job_timeout_s: float = 300.0
    capture_timeout_s: float = 900.0
    timing: Mapping[str, float] = field(default_factory=dict)  # TimingSettings fields
    max_bench_shapes: int = 8
    measure_peaks: bool = True
    static_checks: bool = True  # off only to prove the runtime layer on its own
    runtime_checks: bool = True  # off only to measure what the runtime probes cost


class Engine:
    def __init__(
        self, task: KernelTask, settings: EngineSettings, builder: Builder | None = None
    ) -> None:
        self.task = task
        self.settings = settings
        self.builder = builder or Builder(settings.cache_dir / "build")
        self._session: WorkerSession | None = None
        self._original: BuildResult | None = None
        self._attempt: tuple[BuildResult, Fallback | None] | None = None
        self._staged: tuple[StagedModule, ...] | None = None
        self._real: BuildResult | None = None
        self._captured: Captured | None = None
        self._steps: tuple[StepReport, ...] | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._original_kernels: list[str] | None = None
        self.device: dict[str, Any] = {}

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._session is not None:
            self._session.close()
        if self._scratch is not None:
            self._scratch.cleanup()

    # --- the GPU ---------------------------------------------------------------------

    @property
    def session(self) -> WorkerSession:
        if self._session is None:
            self._session = WorkerSession(
                gpu=self.settings.gpu,
                cwd=self.task.root,
                python_path=[KFBOT_PARENT],
                preload=("torch",),
            )
        return self._session

    def probe(self) -> dict[str, Any]:
        """Device facts; a KfbotError with one line when there is no usable GPU."""
        if not self.device:
            result = self.session.call(
                f"{JOBS}:probe",
                {"peaks": self.settings.measure_peaks,
                 "warm_profiler": self.settings.runtime_checks},
                timeout_s=self.settings.job_timeout_s,
            )
            if not result.ok or result.value is None:
                raise KfbotError(
                    f"the GPU worker did not start: {result.reason}", EXIT_MISSING_TOOL
                )
            if not result.value.get("cuda"):
                raise KfbotError(f"no CUDA GPU: {result.value.get('reason')}", EXIT_MISSING_TOOL)
            self.device = dict(result.value)
        return self.device

    # --- builds ----------------------------------------------------------------------

    def build(self, candidate: Candidate) -> BuildResult:
        return self.builder.build(self.request(candidate))

    def request(self, candidate: Candidate) -> BuildRequest:
        return BuildRequest(
            recipe=self.task.build,
            root=self.task.root,
            files=dict(candidate.files),
            params=dict(candidate.params),
            tag=candidate.short,
            inline_sources=self._inline(candidate),
        )

    def _inline(self, candidate: Candidate) -> tuple[InlineSource, ...]:
        recipe = self.task.build
        if recipe.kind != "load_inline":
            return ()
        text = candidate.files.get(recipe.file)
        if text is None:
            text = (self.task.root / recipe.file).read_text()
        facts = extract_python_facts(recipe.file, text.encode())
        return tuple(
            self._inline_text(s, candidate) for s in facts.inline_sources if s.build == recipe.name
        )

    def _inline_text(self, source: InlineSource, candidate: Candidate) -> InlineSource:
        if source.text is not None or source.path is None:
            return source
        text = candidate.files.get(source.path) or (self.task.root / source.path).read_text()
        return InlineSource(source.build, source.language, text, 0, source.path)

    def original(self) -> BuildResult:
        """The original's build: kfbot's own, or the repository's setup.py build when
        kfbot's failed; a KfbotError when neither built."""
        if self._original is None:
            built, fallback = self._original_attempt()
            if not built.ok and fallback is not None and fallback.ok:
                built = fallback.result(self.task.build)
            if not built.ok:
                first = next(iter(built.diagnostics), None)
                detail = f": {first.message}" if first else ""
                raise KfbotError(
                    f"{self.task.kernel_id}: the original does not build "
                    f"({built.stage}){detail}"
                )
            self._original = built
        return self._original

    def _original_attempt(self) -> tuple[BuildResult, Fallback | None]:
        """kfbot's build of the original and, where it failed on a setup.py extension,
        the repository's own build in a scratch copy."""
        if self._attempt is None:
            built = self.build(ORIGINAL)
            fallback = None
            if not built.ok and self.task.build.kind == "setup_py":
                fallback = setup_py_fallback(self.task.root, self.task.build,
                                             Path(self._scratch_dir()))
            self._attempt = (built, fallback)
        return self._attempt

    def _scratch_dir(self) -> str:
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="kfbot-engine-")
        return self._scratch.name

    def staged(self) -> tuple[StagedModule, ...]:
        """The original as the repository's tests import it, under its real names."""
        if self._staged is None:
            built = self._repository_build()
            self._staged = staged_modules(self.task.root, self.task.build, built) \
                if built is not None else ()
        return self._staged

    def _repository_build(self) -> BuildResult | None:
        """The original built with the names the repository's code uses: kfbot's build,
        else the repository's own setup.py build; None when neither built."""
        if self._real is None:
            built, fallback = self._original_attempt()
            if fallback is not None and fallback.ok:
                self._real = fallback.result(self.task.build)
            elif built.ok:
                request = replace(self.request(ORIGINAL), tag="repo", real_names=True)
                self._real = self.builder.build(request)
            else:
                self._real = built
        return self._real if self._real.ok else None

    # --- inputs ----------------------------------------------------------------------

    def signatures(self) -> list[CallSignature]:
        """The op's real call signatures, captured once from the repository's tests."""
        return list(self.captured().signatures)

    def captured(self) -> Captured:
        if self._captured is None:
            self._captured = self._load_or_capture()
        return self._captured

    def _load_or_capture(self) -> Captured:
        path = self.settings.cache_dir / "signatures" / f"{self._signature_key()}.json"
        if path.is_file():
            sigs = [CallSignature.from_json(s) for s in json.loads(path.read_text())]
            return Captured(tuple(sigs), cached=len(sigs))
        if not self.task.test_targets and not self.task.script_targets:
            return Captured(())
        result = capture_signatures(
            self.task.root,
            self.task.test_targets,
            [self._op_ref()],
            timeout_s=self.settings.capture_timeout_s,
            scripts=self.task.script_targets,
            staged=self.staged(),
        )
        sigs = sorted(result.signatures, key=_size, reverse=True)
        if sigs:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps([s.to_json() for s in sigs]))
        return Captured(tuple(sigs), result)

    def _op_ref(self) -> OpRef:
        """The op as the repository's code reaches it (in the real-names build, a
        namespace named by a macro is the one that macro stands for)."""
        op = self.task.op
        if op.kind == "torch_op":
            real = self._repository_build()
            names = real.library_namespaces if real is not None else {}
            return OpRef.parse(f"torch.ops.{names.get(op.module, op.module)}.{op.name}")
        return OpRef.parse(f"{op.module}.{op.name}")

    def _signature_key(self) -> str:
        """Captured signatures stay valid while the repository's Python is unchanged:
        the tests and scripts, and the wrappers they reach the op through."""
        return content_hash(python_sources(self.task.root),
                            {"kernel": self.task.kernel_id, "op": str(self.task.op),
                             "format": str(SIGNATURE_FORMAT)})

    # --- evaluation ------------------------------------------------------------------

    def warm(self) -> None:
        """What the first evaluation would pay besides its own work, paid now: the GPU
        worker and the device probe, the original's build (planning it imports torch's
        extension tooling here, seconds), its kernel names and the static rules. The
        call signatures are left to the baseline, which may have to capture them."""
        self.probe()
        self.original()
        self._original_kernel_names()
        load_rules()

    def prepare_baseline(self) -> tuple[StepReport, ...]:
        """The baseline's steps before the GPU: pair, build, import, capture, reference."""
        if self._steps is None:
            self._steps = tuple(self._cpu_steps())
        return self._steps

    def _cpu_steps(self) -> Iterator[StepReport]:
        yield pair_step(self.task)
        built, fallback = self._original_attempt()
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

    def baseline(self) -> Evaluation:
        """The original against its reference, step by step: it must pass before
        anything is compared; a failed step is the baseline's answer."""
        self.probe()  # no GPU: say so before spending minutes on builds
        steps = self.prepare_baseline()
        failure = first_failure(steps)
        if failure is not None:
            return failed(ORIGINAL.hash, "baseline", failure.line(), steps=steps)
        result = self._run(ORIGINAL, None, bench=False)
        return replace(result, steps=(*steps, comparison_step(result)))

    def static_check(self, candidate: Candidate) -> list[Finding]:
        """The static anti-cheating rules on the candidate's source, before any build."""
        if not self.settings.static_checks or candidate.hash == ORIGINAL.hash:
            return []
        return static_findings(static_input(self.task, candidate, self._op_dtypes()))

    def _op_dtypes(self) -> list[str]:
        sigs = self._captured.signatures if self._captured is not None else ()
        found = {t.dtype for s in sigs for t in s.tensors()}
        return sorted(found | set(self.task.declared_dtypes))

    def prepare(self, candidate: Candidate, built: BuildResult | None = None) -> Prepared:
        """What a candidate needs before the GPU: its static findings, then its build
        (or `built`, made already) unless a strict finding rejected it. CPU work, done
        off the GPU's path by the executors."""
        findings = tuple(self.static_check(candidate))
        if strict(findings):
            return Prepared(findings, None)
        return Prepared(findings, built if built is not None else self.build(candidate))

    def prepare_many(self, candidates: Sequence[Candidate]) -> list[Prepared]:
        """`prepare` for a batch: every static check first, then one build, on every
        core, of the candidates no strict finding rejected; a rejected one is never
        compiled."""
        findings = [tuple(self.static_check(c)) for c in candidates]
        keep = [i for i, found in enumerate(findings) if not strict(found)]
        built = self.builder.build_many([self.request(candidates[i]) for i in keep])
        made = dict(zip(keep, built, strict=True))
        return [Prepared(found, made.get(i)) for i, found in enumerate(findings)]

    def evaluate(self, candidate: Candidate, bench: bool = True,
                 prepared: Prepared | None = None) -> Evaluation:
        """Static checks, build, then verify and benchmark; with `prepared`, the first
        two were done already and are not repeated."""
        started = time.monotonic()
        prepared = prepared or self.prepare(candidate)
        findings = prepared.findings
        rejected = strict(findings)
        if rejected or prepared.built is None:
            reason = "; ".join(f.line() for f in rejected)
            return failed(candidate.hash, "static", reason, findings=findings)
        built = prepared.built
        if not built.ok:
            reason = next(
                (d.message for d in built.diagnostics if d.severity == "error"),
                f"build failed at the {built.stage} stage",
            )
            return failed(
                candidate.hash, "build", reason, built.diagnostics, build_seconds=built.seconds
            )
        result = self._run(candidate, built, bench=bench)
        result = replace(result, findings=(*findings, *result.findings))
        return _with_times(result, built.seconds, time.monotonic() - started)

    def adequacy(self) -> Adequacy | None:
        """Does the repository's own test reject trivial mutants of the op? Cached while
        the tests are unchanged; None when the task has no test to run."""
        if not self.task.test_targets:
            return None
        path = self.settings.cache_dir / "adequacy" / f"{self._signature_key()}.json"
        cached = load_cached(path)
        if cached is not None:
            return cached
        gate = check_adequacy(self.task.root, self.task.test_targets, self._op_ref(),
                              timeout_s=self.settings.capture_timeout_s)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(gate.to_json()))
        return gate

    def finalist(self, candidate: Candidate) -> FinalistResult:
        """The repository's own build and reference tests, against the candidate."""
        return run_finalist(self.task, candidate)

    def evaluate_many(self, candidates: Sequence[Candidate], bench: bool = True
                      ) -> Iterator[tuple[Candidate, Evaluation]]:
        """Build on every core at once; evaluate each on the GPU as soon as it is built."""
        workers = max(1, (os.cpu_count() or 2) // 2)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(self.prepare, c): c for c in candidates}
            for future in as_completed(futures):
                candidate = futures[future]
                # The pool's work is handed over: planning a build again costs a parse
                # of every source, even when the cache holds the objects.
                yield candidate, self.evaluate(candidate, bench, prepared=future.result())

    def _run(self, candidate: Candidate, built: BuildResult | None, bench: bool) -> Evaluation:
        self.probe()  # no GPU: say so before spending minutes on builds
        original = self.original()
        started = time.monotonic()
        payload = self._payload(original, built, bench)
        if built is not None:
            payload["kernels"] = self._kernels(candidate)
        payload_s = time.monotonic() - started
        job = self.session.call(f"{JOBS}:evaluate", payload, timeout_s=self.settings.job_timeout_s)
        resources = (built or original).diagnostics
        if not job.ok or job.value is None:
            return _runtime_failure(candidate.hash, job, resources)
        judged = time.monotonic()
        result = self._judge(candidate.hash, job.value, resources, baseline=built is None)
        if not self.task.references:
            result = replace(result, findings=(*result.findings, no_reference_finding(self.task)))
        # This process's share beside the worker's own phases: a GPU that waits on its
        # driver (payload, pipe, judging) shows it, e.g. with several GPUs at once.
        return replace(result, phases={**result.phases, "driver-payload": payload_s,
                                       "driver-round-trip": job.duration_s,
                                       "driver-judge": time.monotonic() - judged})

    def _kernels(self, candidate: Candidate) -> dict[str, list[str]]:
        """Kernel names defined in each build: the ones that count as the op's own."""
        return {
            "original": self._original_kernel_names(),
            "candidate": kernel_names(units(self.task, candidate.files)),
        }

    def _original_kernel_names(self) -> list[str]:
        if self._original_kernels is None:  # a parse of every source: once per engine
            self._original_kernels = kernel_names(units(self.task, {}))
        return self._original_kernels

    def _payload(
        self, original: BuildResult, candidate: BuildResult | None, bench: bool
    ) -> dict[str, Any]:
        task = self.task
        return {
            "op": task.op.to_json(),
            "original": _artifact(original),
            "candidate": _artifact(candidate) if candidate is not None else None,
            "references": [r.to_json() for r in task.references],
            "tolerances": {k: list(v) for k, v in task.tolerances.items()},
            "block": task.block,
            "signatures": [s.to_json() for s in self.signatures()],
            "seeds": [secrets.randbits(48) for _ in range(self.settings.seeds)],
            "baseline": candidate is None,
            "in_place": task.in_place,
            "probes": self.settings.runtime_checks,
            "sys_path": [str(task.root)],
            "inputs_ref": task.inputs_ref,
            "declared": {
                "shapes": [list(s) for s in task.declared_shapes],
                "dtypes": list(task.declared_dtypes),
            },
            "bench": {
                "timing": dict(self.settings.timing),
                "flops": task.flops,
                "max_shapes": self.settings.max_bench_shapes,
            }
            if bench
            else None,
        }

    def _judge(
        self, digest: str, value: Mapping[str, Any], resources: Sequence[Any], baseline: bool
    ) -> Evaluation:
        records = value.get("baseline" if baseline else "verify", [])
        checks = tuple(Check.from_json(r) for r in [*records, *value.get("probes", [])])
        env = value.get("environment", {})
        if not records:
            return failed(
                digest,
                "baseline" if baseline else "correctness",
                "no inputs to check: the op's inputs could not be made from the captured "
                "signatures or the declared shapes",
                resources,
                environment=env,
            )
        timings = shape_timings(value.get("bench") or [], seed=0, peaks=self.device.get("peaks"))
        bad = next((c for c in checks if not c.passed), None)
        phases = {k: float(v) for k, v in value.get("phases", {}).items()}
        if bad is not None:
            return replace(self._rejected(digest, bad, baseline, resources, checks, env,
                                          timings), phases=phases)
        return Evaluation(
            phases=phases,
            candidate=digest,
            stage="done",
            ok=True,
            reason=f"correct on {len(checks)} checks",
            diagnostics=tuple(resources),
            checks=checks,
            timings=timings,
            environment=env,
            findings=tuple(physics_findings(timings, self.device.get("peaks"))),
        )

    @staticmethod
    def _rejected(digest: str, bad: Check, baseline: bool, resources: Sequence[Any],
                  checks: tuple[Check, ...], env: Mapping[str, Any],
                  timings: tuple[Any, ...]) -> Evaluation:
        why = bad.error or bad.description or f"mismatch on {bad.input}"
        if baseline or bad.check == "correctness":
            stage: Stage = "baseline" if baseline else "correctness"
            return failed(digest, stage, f"{bad.input} vs {bad.against}: {why}", resources,
                          checks=checks, environment=env)
        first = bad.finding()
        return failed(digest, "anticheat", first.line(), resources, checks=checks,
                      environment=env, timings=timings, findings=_evidence(first, checks))


def python_sources(root: Path) -> dict[str, str]:
    """Every Python file of the repository by path, read as text; links that leave it
    and build outputs are not followed."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(default_skip(part) for part in rel.parts[:-1]) or not inside(root, path):
            continue
        try:
            found[rel.as_posix()] = path.read_text(errors="replace")
        except OSError:
            continue  # unreadable: it cannot have run either
    return found


def no_reference_finding(task: KernelTask) -> Finding:
    """Every report of a kernel without a reference says so: the original is the judge."""
    why = "; ".join(task.unusable_references) or "the tests name no reference computation"
    return Finding("no-reference", "adequacy", "warn", NO_REFERENCE, why)


def _evidence(first: Finding, checks: Sequence[Check]) -> tuple[Finding, ...]:
    """Every anti-cheating check that failed, the one that decided first: a cheat often
    trips more than one (a library call is both a foreign kernel and, through its host
    overhead, a timer disagreement), and the report shows all of them."""
    seen, out = {first.check}, [first]
    for check in checks:
        if not check.passed and check.check not in seen and check.check != "correctness":
            seen.add(check.check)
            out.append(check.finding())
    return tuple(out)


def _artifact(result: BuildResult) -> dict[str, Any]:
    return {
        "artifact": str(result.artifact),
        "module_name": result.module_name,
        "namespaces": dict(result.library_namespaces),
    }


def _size(sig: CallSignature) -> int:
    return sum(t.numel for t in sig.tensors())


def _runtime_failure(digest: str, job: JobResult, resources: Sequence[Any]) -> Evaluation:
    diag = job.diagnostic()
    return failed(
        digest, "runtime", job.reason, [*resources, *([diag] if diag is not None else [])]
    )


def _with_times(result: Evaluation, build_s: float, total_s: float) -> Evaluation:
    return replace(result, build_seconds=build_s, eval_seconds=total_s)
