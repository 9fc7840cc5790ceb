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
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kfbot.anticheat.adequacy import Adequacy, cache_tag, check_adequacy, load_cached
from kfbot.anticheat.findings import Finding, strict
from kfbot.anticheat.rules import load_rules
from kfbot.anticheat.sizes import new_size_comparisons, sizes_to_try
from kfbot.anticheat.static import analyse, static_findings
from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
from kfbot.evaluate.baseline.preparation import Preparation
from kfbot.evaluate.baseline.step_reports import amended, comparison_step
from kfbot.evaluate.baseline.steps import StepReport, first_failure, inputs_snippet
from kfbot.evaluate.build import Builder, BuildRequest, BuildResult
from kfbot.evaluate.build.layouts.kernel_builder import is_kernel_builder
from kfbot.evaluate.build.layouts.load_inline import inline_sources
from kfbot.evaluate.build.repository import staged_modules
from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.capture.collect import MutantRuns
from kfbot.evaluate.capture.reach import split_by_launch
from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.evaluation import Evaluation, failed
from kfbot.evaluate.finalist import FinalistResult, run_finalist
from kfbot.evaluate.inputs.contract import (
    Contract,
    Trial,
    admitted,
    size_trials,
    standard_trials,
    unverified_sizes,
    with_contract,
)
from kfbot.evaluate.inputs.redrawn import distribution_trials, precision_finding
from kfbot.evaluate.isolation import Isolation
from kfbot.evaluate.judge import judge, no_reference_finding, runtime_failure
from kfbot.evaluate.neighbours import Neighbours
from kfbot.evaluate.scope import reaches
from kfbot.evaluate.sources import kernel_names, recipe_for, static_input, units
from kfbot.evaluate.task import KernelTask, OpBinding
from kfbot.evaluate.worker.session import JobResult, WorkerSession
from kfbot.scan.model import InlineSource

JOBS = "kfbot.evaluate.device.jobs"
REACH_JOB = "kfbot.evaluate.device.reach:reaching"
VARIANTS_JOB = "kfbot.evaluate.device.variants:time_variants"
CONTRACT_JOB = "kfbot.evaluate.device.contract:try_on_original"
KFBOT_PARENT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Prepared:
    """A candidate's work before the GPU: its static findings, and its build unless a
    strict finding rejected it first."""

    findings: tuple[Finding, ...]
    built: BuildResult | None


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
    distributions: bool = True  # redrawn inputs (off only to measure what they cost)
    clean_room: bool = True  # outputs judged in a second worker (off only to measure it)
    # A candidate's kernel compiled alone where it can be (`build.fast`); off only to
    # compare with the full build.
    fast_builds: bool = True
    # Where the heartbeat of the repository's own build goes while it runs (build/layouts/own.py;
    # a function of a module's top level: Ray pickles it).
    progress: Callable[[str], None] | None = field(default=None, compare=False)


class Engine:
    def __init__(
        self, task: KernelTask, settings: EngineSettings, builder: Builder | None = None
    ) -> None:
        self.task = task
        self.settings = settings
        self._owns_builder = builder is None
        self.builder = builder or Builder(settings.cache_dir / "build")
        self._session: WorkerSession | None = None
        self._original: BuildResult | None = None
        self.prep = Preparation(task, self.builder, self.request, settings.cache_dir,
                                settings.capture_timeout_s, settings.progress)
        self._reached = False
        self._original_kernels: list[str] | None = None
        self.device: dict[str, Any] = {}
        # The other ops of the build, verified with a candidate that changes code their
        # kernels share with the task's; by candidate, the kernels it must pass for.
        self.neighbours = Neighbours(task.neighbours, self._neighbour)
        self._shared: dict[str, tuple[str, ...]] = {}
        # What the original did on each input kfbot added (`evaluate.inputs.contract`).
        self._contract = Contract()
        self._contract_seed = secrets.randbits(48)
        # The run's private seed schedule: redrawn inputs, warm-up, timed and repeated
        # calls (`evaluate.inputs.distributions`); never written out.
        self._schedule_root = secrets.randbits(63)
        # The judge worker and what the device said between jobs (`isolation`).
        self.isolation = Isolation(self._new_session, settings.cache_dir / "clean-room" /
                                   f"{os.getpid()}-{secrets.token_hex(4)}",
                                   settings.job_timeout_s)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._session is not None:
            self._session.close()
        self.isolation.close()
        self.neighbours.close()
        self.prep.close()
        if self._owns_builder:  # a compile still running (the fast path's warm-up) ends
            self.builder.stop()

    def _neighbour(self, task: KernelTask) -> Engine:
        return Engine(replace(task, neighbours=()), self.settings, builder=self.builder)

    # --- the GPU ---------------------------------------------------------------------

    @property
    def session(self) -> WorkerSession:
        if self._session is None:
            self._session = self._new_session()
        return self._session

    def _new_session(self) -> WorkerSession:
        # Sandboxed: it reads the builds, and writes only the clean room's folder (the
        # outputs a candidate's worker saves for the judge).
        self.isolation.folder.mkdir(parents=True, exist_ok=True)
        return WorkerSession(gpu=self.settings.gpu, cwd=self.task.root,
                             python_path=[KFBOT_PARENT], preload=("torch",),
                             readable=[self.settings.cache_dir, self.builder.cache_dir],
                             writable=[self.isolation.folder])

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
        return self.prep.build(self.request(candidate))

    def request(self, candidate: Candidate) -> BuildRequest:
        # A candidate may carry compiler settings in the build file's flag list: its
        # build is the repository's with those flags, as a branch would build it.
        return BuildRequest(
            recipe=recipe_for(self.task, candidate.files),
            root=self.task.root,
            files=dict(candidate.files),
            params=dict(candidate.params),
            tag=candidate.short,
            inline_sources=self._inline(candidate),
            kernel=self.task.kernel_name if self.settings.fast_builds else "",
        )

    def _inline(self, candidate: Candidate) -> tuple[InlineSource, ...]:
        return inline_sources(self.task.root, self.task.build, candidate.files)

    def original(self) -> BuildResult:
        """The original's build: kfbot's own, or the repository's setup.py build when
        kfbot's failed; a KfbotError when neither built."""
        if self._original is None:
            self._warm_fast_path()
            built, own = self.prep.original_attempt()
            if not built.ok and own is not None and own.ok:
                built = own.result()
            if not built.ok:
                first = next(iter(built.diagnostics), None)
                detail = f": {first.message}" if first else ""
                raise KfbotError(
                    f"{self.task.kernel_id}: the original does not build "
                    f"({built.stage}){detail}"
                )
            self._original = built
        return self._original

    def _warm_fast_path(self) -> None:
        """The host part the fast path links candidates to, compiled beside the original
        (each takes about as long): the first candidate does not wait for it."""
        if self.settings.fast_builds:
            self.builder.warm_later(self.request(ORIGINAL))

    # --- inputs ----------------------------------------------------------------------

    def signatures(self) -> list[CallSignature]:
        """The op's real call signatures, captured once from the repository's tests (or,
        inside `at_signatures`, the ones given there)."""
        override = getattr(self, "_signatures_override", None)
        if override is not None:
            return list(override)
        return list(self.prep.captured().signatures)

    def evaluate_at(self, candidate: Candidate, signatures: Sequence[CallSignature]
                    ) -> Evaluation:
        """`evaluate` with `signatures` verified and timed instead of the captured ones:
        where a candidate holds beyond the shapes it was chosen on."""
        self._signatures_override: Sequence[CallSignature] | None = signatures
        try:
            return self.evaluate(candidate)
        finally:
            self._signatures_override = None

    def time_variants(self, variants: Sequence[OpBinding], signatures: Sequence[CallSignature]
                      ) -> list[dict[str, float]] | str:
        """For each signature in turn, each variant op's speed relative to the original's
        (original time / variant time) where its output is the original's, timed in one
        worker session with the second timer; or why they could not be timed."""
        payload = {
            "op": self.task.op.to_json(), "original": _artifact(self.original()),
            "variants": [{**v.to_json(), "text": v.name} for v in variants],
            "shapes": [{"label": str(n), "signature": s.to_json()}
                       for n, s in enumerate(signatures)],
            "seeds": [secrets.randbits(48) for _ in range(self.settings.seeds)],
            "tolerances": {k: list(v) for k, v in self.task.tolerances.items()},
            "sys_path": [str(self.task.root)],
        }
        job = self.session.call(VARIANTS_JOB, payload, timeout_s=self.settings.job_timeout_s)
        if not job.ok or job.value is None:
            return f"the variants could not be timed: {job.reason}"
        return [{name: found["original_us"] / found["variant_us"]
                 for name, found in shape["variants"].items()
                 if "error" not in found and found["variant_us"] > 0}
                for shape in job.value["shapes"]]

    def prepare_baseline(self) -> tuple[StepReport, ...]:
        """The baseline's steps before the GPU: pair, build, import, capture, reference."""
        return self.prep.steps()

    def warm(self) -> None:
        """What the first evaluation would pay besides its own work, paid now: the GPU
        worker and the device probe, the original's build (planning it imports torch's
        extension tooling here, seconds), its kernel names and the static rules. The
        call signatures are left to the baseline, which may have to capture them."""
        self.probe()
        self.original()
        self._original_kernel_names()
        load_rules()

    def baseline(self) -> Evaluation:
        """The original against its reference, step by step: it must pass before
        anything is compared; a failed step is the baseline's answer."""
        self.probe()  # no GPU: say so before spending minutes on builds
        steps = self.prepare_baseline()
        failure = first_failure(steps)
        if failure is None:
            steps = self._reaching(steps)
            failure = first_failure(steps)
        if failure is not None:
            return failed(ORIGINAL.hash, "baseline", failure.line(), steps=steps)
        result = self._run(ORIGINAL, None, bench=False)
        if result.ok:  # only an original that passes its own calls defines the contract
            return with_contract(result, steps, comparison_step(result), self.contract())
        return replace(result, steps=(*steps, comparison_step(result)))

    # --- the contract ----------------------------------------------------------------

    def contract(self) -> Contract:
        """The original on the inputs every candidate is checked on besides the
        captured calls (edge, scaled and large shapes, and the captured shapes with
        their floating inputs redrawn from other distributions)."""
        trials = standard_trials(self.signatures(), self.task.block)
        # Redrawn values need a reference to judge the original by: where the original
        # alone is the judge, an overflow of its own would bind the candidates to it.
        if self.settings.distributions and self.settings.runtime_checks and \
                self.task.references:
            trials += distribution_trials(self.signatures(), self._schedule_root)
        return self.admit(trials)

    def admit(self, trials: Sequence[Trial]) -> Contract:
        """Each trial tried on the original once (per engine): the verdicts on `trials`."""
        def run(todo: Sequence[Trial]) -> JobResult:
            return self.session.call(CONTRACT_JOB, self._contract_payload(todo),
                                     timeout_s=self.settings.job_timeout_s)

        self._contract = admitted(self._contract, trials, run)
        return self._contract.of(trials)

    def _contract_payload(self, trials: Sequence[Trial]) -> dict[str, Any]:
        return {"op": self.task.op.to_json(), "original": _artifact(self.original()),
                "references": [r.to_json() for r in self.task.references],
                "tolerances": {k: list(v) for k, v in self.task.tolerances.items()},
                "trials": [t.to_json() for t in trials], "seed": self._contract_seed,
                "sys_path": [str(self.task.root)]}

    def _added(self, candidate: Candidate) -> Contract:
        """The added inputs the candidate is checked on, the admitted ones of this
        contract: the standard ones, and those of the sizes it newly compares with."""
        sizes = size_trials(self.signatures(), self.compared_sizes(candidate))
        return Contract((*self.contract().verdicts, *self.admit(sizes).verdicts))

    def _reaching(self, steps: tuple[StepReport, ...]) -> tuple[StepReport, ...]:
        """Keep the captured calls that launch the kernel under optimization; the
        capture step says how many were dropped and why."""
        captured = self.prep.captured()
        if not captured.signatures or self._reached:
            return steps
        self._reached = True
        job = self.session.call(REACH_JOB, {
            "op": self.task.op.to_json(), "original": _artifact(self.original()),
            "signatures": [s.to_json() for s in captured.signatures],
            "seed": secrets.randbits(48), "sys_path": [str(self.task.root)],
        }, timeout_s=self.settings.job_timeout_s)
        if not job.ok or job.value is None:
            note = StepReport("capture", "warning", f"the kernels each captured call launches "
                              f"could not be listed ({job.reason}): every call is kept",
                              job.output_tail[-2000:])
            return amended(steps, note)
        reach = split_by_launch(captured.signatures, job.value["launched"],
                                self.task.kernel_name)
        self.prep.keep(reach.kept)
        if reach.none:
            note = StepReport("capture", "failed", reach.summary(self.task.kernel_name),
                              suggestion=inputs_snippet(self.task.kernel_id,
                                                        self.task.kernel_name))
        else:
            note = StepReport("capture", "ok", reach.summary(self.task.kernel_name))
        return amended(steps, note)

    def static_check(self, candidate: Candidate) -> list[Finding]:
        """The static anti-cheating rules on the candidate's source, before any build."""
        if not self.settings.static_checks or candidate.hash == ORIGINAL.hash:
            return []
        found = static_findings(static_input(self.task, candidate, self._op_dtypes()))
        return [*found, *self._scope(candidate)]

    def _scope(self, candidate: Candidate) -> list[Finding]:
        """Changes that reach other kernels: rejected, unless they are to code shared with
        a kernel whose op is verified with the candidate after the task's own."""
        scope = self.neighbours.scope(reaches(self.task, candidate))
        if scope.verify:
            self._shared[candidate.hash] = scope.verify
        return list(scope.findings)

    def _op_dtypes(self) -> list[str]:
        sigs = self.prep.captured().signatures if self.prep.has_captured else ()
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
        built = self.prep.build_many([self.request(candidates[i]) for i in keep])
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
        shared = self._shared.get(candidate.hash)
        if result.ok and shared:
            result = self.neighbours.verify(candidate, shared, result, bench)
        return _with_times(result, built.seconds, time.monotonic() - started)

    def evaluate_shared(self, candidate: Candidate, bench: bool = True) -> Evaluation:
        """This op against its reference with a candidate made for another op of the same
        build (the static checks are that op's): see `neighbours.py`."""
        return self.evaluate(candidate, bench, prepared=Prepared((), self.build(candidate)))

    def adequacy(self) -> Adequacy | None:
        """Does the repository's own test reject trivial mutants of the op? Cached while
        the tests are unchanged; None when the task has no test to run."""
        if not self.task.test_targets:
            return None
        path = self.settings.cache_dir / "adequacy" / \
            f"{self.prep.signature_key()}-{cache_tag()}.json"
        cached = load_cached(path)
        if cached is not None:
            return cached
        tree, env = self.prep.test_tree()
        gate = check_adequacy(MutantRuns(tree, tuple(self.task.test_targets), self.prep.op_ref(),
                                         timeout_s=self.settings.capture_timeout_s,
                                         staged=self.prep.staged(), extra_env=env))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(gate.to_json()))
        return gate

    def finalist(self, candidate: Candidate) -> FinalistResult:
        """The repository's own build and reference tests, against the candidate. A
        kernel-builder repository's tests get kfbot's build of it: no builder runs here."""
        if not is_kernel_builder(self.task.build):
            return run_finalist(self.task, candidate)
        request = replace(self.request(candidate), tag=f"{candidate.short}r", real_names=True)
        built = self.builder.build(request)
        if not built.ok:
            first = next((d.message for d in built.diagnostics if d.severity == "error"),
                         f"stopped at the {built.stage} stage")
            return FinalistResult(False, f"kfbot's build of the candidate failed: {first}",
                                  (), built.seconds, "")
        staged = staged_modules(Path("."), self.task.build, built)
        return run_finalist(self.task, candidate, staged=staged)

    def evaluate_many(self, candidates: Sequence[Candidate], bench: bool = True
                      ) -> Iterator[tuple[Candidate, Evaluation]]:
        """Build on every core at once; evaluate each on the GPU as soon as it is built."""
        workers = max(1, (os.cpu_count() or 2) // 2)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(self.prepare, c): c for c in candidates}
            try:
                for future in as_completed(futures):
                    candidate = futures[future]
                    # The pool's work is handed over: planning a build again costs a
                    # parse of every source, even when the cache holds the objects.
                    yield candidate, self.evaluate(candidate, bench,
                                                   prepared=future.result())
            except BaseException:  # a stopped run: no build that has not begun begins
                for future in futures:
                    future.cancel()
                raise

    def _run(self, candidate: Candidate, built: BuildResult | None, bench: bool) -> Evaluation:
        self.probe()  # no GPU: say so before spending minutes on builds
        original = self.original()
        # Trying new added inputs on the original is a job of its own, before this one.
        added = self._added(candidate) if built is not None else Contract()
        started = time.monotonic()
        payload = self._payload(original, built, bench)
        if built is not None:
            payload["kernels"] = self._kernels(candidate)
            payload["sizes"] = list(self.compared_sizes(candidate))
            payload["added"] = [t.to_json() for t in added.admitted]
            if self.settings.clean_room and self.settings.runtime_checks:
                payload["clean_room"] = self.isolation.outputs_folder(candidate.hash)
        payload_s = time.monotonic() - started
        job = self.isolation.evaluate_job(self.session, candidate.hash, payload)
        resources = (built or original).diagnostics
        if not job.ok or job.value is None:
            return runtime_failure(candidate.hash, job, resources)
        clean_s = self.isolation.judge_saved(payload, job.value)
        judged = time.monotonic()
        result = judge(candidate.hash, job.value, resources, self.device, baseline=built is None)
        result = replace(result, findings=(*result.findings,
                                           *precision_finding(job.value.get("precision"))))
        result = unverified_sizes(result, payload.get("sizes", ()), job.value.get("inputs", ()))
        if result.checks and not any(c.against == "reference" for c in result.checks):
            result = replace(result, findings=(*result.findings, no_reference_finding(self.task)))
        result = replace(result, findings=(*result.findings, *added.findings()))
        # This process's share beside the worker's own phases: a GPU that waits on its
        # driver (payload, pipe, judging) shows it, e.g. with several GPUs at once.
        return replace(result, phases={**result.phases, "driver-payload": payload_s,
                                       "clean-room": clean_s,
                                       "driver-round-trip": job.duration_s,
                                       "driver-judge": time.monotonic() - judged})

    def settle(self) -> None:
        """After the last candidate of a session: see `Isolation.settle`."""
        self.isolation.settle(self._session)

    def _kernels(self, candidate: Candidate) -> dict[str, list[str]]:
        """Kernel names defined in each build: the ones that count as the op's own."""
        return {
            "original": self._original_kernel_names(),
            "candidate": kernel_names(units(self.task, candidate.files)),
        }

    def compared_sizes(self, candidate: Candidate) -> tuple[int, ...]:
        """The numbers the candidate newly compares a size with: it is verified at each
        (a special case for an untested size is wrong there). Verification, not a static
        rule: it holds with the static checks off too."""
        rules = load_rules()  # the static checks' parse of the same units, from its cache
        return sizes_to_try(new_size_comparisons(
            analyse(units(self.task, {}), rules), analyse(units(self.task, candidate.files),
                                                            rules)))

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
            "schedule": self._schedule_root,
            "contract_seed": self._contract_seed,
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


def _artifact(result: BuildResult) -> dict[str, Any]:
    return {
        "artifact": str(result.artifact),
        "module_name": result.module_name,
        "init": result.init,
        "namespaces": dict(result.library_namespaces),
    }


def _with_times(result: Evaluation, build_s: float, total_s: float) -> Evaluation:
    return replace(result, build_seconds=build_s, eval_seconds=total_s)
