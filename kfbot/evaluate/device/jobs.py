"""Worker entry points (`kfbot.evaluate.device.jobs:<name>`), called with a JSON payload.

Payload fields are written by `kfbot.evaluate.engine`; results go back as JSON.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.device import environment, health
from kfbot.evaluate.device.answers import tensors
from kfbot.evaluate.device.cleanroom import save_outputs
from kfbot.evaluate.device.cleanroom import specs as clean_specs
from kfbot.evaluate.device.lenient import Leniency, relaxed
from kfbot.evaluate.device.loading import Op, load_op
from kfbot.evaluate.device.precision import precision, precision_record
from kfbot.evaluate.device.probes import (
    Launch,
    is_benign,
    kernel_identifier,
    launches,
)
from kfbot.evaluate.device.references import leniency, references_for
from kfbot.evaluate.device.retime import RetimeSettings, measure, retime_shapes
from kfbot.evaluate.device.timed import second_timer, timed_check
from kfbot.evaluate.device.timing import Swaps, TimingSettings, interleaved
from kfbot.evaluate.device.values import values_for
from kfbot.evaluate.device.verify import (
    Context,
    InputSet,
    Record,
    call,
    clone,
    compare_outputs,
    record,
    reference_output,
    repeat_records,
    verify,
)
from kfbot.evaluate.inputs.contract import RECORDED, Trial, shape_label
from kfbot.evaluate.inputs.distributions import Phase, SeedSchedule
from kfbot.evaluate.inputs.fresh import make_args, storage_extent
from kfbot.evaluate.verdict.tolerances import Tolerance
from kfbot.evaluate.worker.main import RESTART_KEY
from kfbot.evaluate.worker.session import cuda_error_kind

REPEAT_CALLS = 10
TIMED_SETS = 3  # argument sets the timed trials rotate through, per shape
def probe(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Is there a CUDA GPU, and what is it."""
    if not torch.cuda.is_available():
        return {"cuda": False, "reason": f"torch {torch.__version__} sees no CUDA GPU"}
    info: dict[str, Any] = {"cuda": True, **environment.describe()}
    if payload.get("peaks"):
        info["peaks"] = environment.measured_peaks()
    if payload.get("warm_profiler"):
        # The profiler's first start in a process takes seconds (CUPTI loads); pay it
        # with the worker's start, not inside the first candidate's evaluation.
        with contextlib.suppress(RuntimeError, ImportError, AttributeError):
            launches(lambda: torch.ones(8, device="cuda").add_(1), [], {})
    return info


def device_health(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Whether the device still works (see `health.stale_context`)."""
    stale = health.stale_context()
    return {"stale": stale, RESTART_KEY: True} if stale else {"stale": None}


def evaluate(payload: Mapping[str, Any]) -> dict[str, Any]:
    stale = health.stale_context()
    if stale is not None:  # an earlier job's doing: a fresh worker runs this one again
        return {"stale": stale, RESTART_KEY: True}
    numerics = health.pin_numerics()
    sys.path[:0] = [p for p in payload.get("sys_path", []) if p not in sys.path]
    phases: dict[str, float] = {}
    with _phase(phases, "load"):
        original = load_op(payload["original"], payload["op"])
        candidate = load_op(payload["candidate"], payload["op"]) \
            if payload.get("candidate") else None
        references = references_for(payload.get("references", []))
    overrides = {k: Tolerance(*v) for k, v in payload.get("tolerances", {}).items()}
    block = payload.get("block")
    signatures = [CallSignature.from_json(s) for s in payload.get("signatures", [])]
    seeds = list(payload["seeds"])
    if payload.get("probes", True):
        # Earlier jobs' freed memory would be poisoned before every checked call of
        # this one: hand it back once, so the poisoning fills this job's blocks only.
        torch.cuda.empty_cache()
    with _phase(phases, "inputs"):
        checked = _input_sets(signatures, seeds, payload) + _added_sets(
            payload.get("added", []), seeds[0], int(payload.get("contract_seed") or seeds[0]))
    result: dict[str, Any] = {
        "inputs": [s.label for s in checked],
        "environment": {**environment.describe(), "numerics": numerics},
    }
    ctx = Context(overrides, block, in_place=bool(payload.get("in_place")),
                  probes=bool(payload.get("probes", True)),
                  lenient=leniency(payload.get("references", [])))
    result["phases"] = phases
    if payload.get("baseline"):
        with _phase(phases, "verify"):
            result["baseline"] = verify(original, None, references, checked, ctx)
    if candidate is not None:
        with _phase(phases, "verify"):
            result["verify"] = _verify_candidate(candidate, original, references, checked,
                                                 ctx, payload, phases)
            result["verify"] += health.flag_records(numerics, "after verification")
        # Parts of the verify phase (a name with a colon is inside another phase).
        phases.update({f"verify:{k}": v for k, v in ctx.spent.items()})
        if ctx.probes and checked and all(r["passed"] for r in result["verify"]):
            with _phase(phases, "precision"):
                found = _precision(candidate, original, references, checked[0])
            if found is not None:
                result["precision"] = found
                if found["verdict"] == "strict":
                    result["verify"].append(precision_record(found))
        if payload.get("clean_room") and all(r["passed"] for r in result["verify"]):
            with _phase(phases, "clean-room-save"):
                result["saved"] = save_outputs(candidate, clean_specs(
                    signatures, seeds[0], payload.get("added", []),
                    int(payload.get("contract_seed") or seeds[0])), payload["clean_room"])
        if payload.get("bench") and all(r["passed"] for r in result["verify"]):
            result["bench"], result["probes"] = _bench(
                original, candidate, signatures, _root(payload), payload["bench"], ctx, phases)
            result["probes"] += health.flag_records(numerics, "after timing")
        kernels = payload.get("kernels")
        # Listed whenever the outputs are right, even after a timing check failed: the
        # kernels a cheat launches are evidence of their own, and cheap to take.
        passed = all(r["passed"] for r in result["verify"])
        if ctx.probes and checked and kernels and passed:
            with _phase(phases, "kernels"):
                result["verify"] += _launch_records(original, candidate, checked[0], kernels,
                                                    str(payload["original"]["artifact"]))
    return _settled(result)


def _settled(result: dict[str, Any]) -> dict[str, Any]:
    """The device waited for (a fault in work left running is this job's); a fresh
    worker after the job when any call met a CUDA error."""
    health.settle()
    records = [*result.get("verify", []), *result.get("baseline", []), *result.get("probes", [])]
    if health.saw_cuda_error(records):
        result[RESTART_KEY] = True
    return result


def _root(payload: Mapping[str, Any]) -> int:
    """The run's private seed root (a job without one draws from its first seed)."""
    return int(payload.get("schedule") or payload["seeds"][0])


def _phase_args(sig: CallSignature, root: int, phase: Phase, first: int, count: int
                ) -> list[tuple[list[Any], dict[str, Any]]]:
    schedule = SeedSchedule(root)
    return [make_args(sig, schedule.seed(phase, first + i), "cuda") for i in range(count)]


def _precision(candidate: Op, original: Op, references: Callable[[InputSet], Op | None],
               inputs: InputSet) -> dict[str, Any] | None:
    """The precision verdict on the first input set (see `precision`), if measurable."""
    ref = references(inputs)
    return precision(candidate, original, ref, inputs) if ref is not None else None


def reproduce(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The second timer on each shape: original against candidate, on fresh inputs,
    after a check that the candidate's output is still right there."""
    sys.path[:0] = [p for p in payload.get("sys_path", []) if p not in sys.path]
    original = load_op(payload["original"], payload["op"])
    candidate = load_op(payload["candidate"], payload["op"])
    references = references_for(payload.get("references", []))
    overrides = {k: Tolerance(*v) for k, v in payload.get("tolerances", {}).items()}
    settings = RetimeSettings(**payload.get("retime", {}))
    shapes: list[dict[str, Any]] = []
    for shape in retime_shapes(payload):
        label, arg_sets, inputs = shape.label, shape.arg_sets, shape.inputs
        try:
            wrong = wrong_output(candidate, original, references(inputs), inputs, overrides)
        except (RuntimeError, ValueError, TypeError) as exc:
            if cuda_error_kind(str(exc)) is not None:
                raise
            wrong = f"{type(exc).__name__}: {exc}"[:300]
        if wrong:
            shapes.append({"label": label, "error": wrong})
            continue
        samples = measure({"original": original, "candidate": candidate}, arg_sets, settings)
        shapes.append({"label": label, "original_us": samples["original"],
                       "candidate_us": samples["candidate"]})
    return {"shapes": shapes, "environment": environment.describe()}


def wrong_output(candidate: Op, original: Op, reference: Op | None, inputs: InputSet,
                 overrides: Mapping[str, Tolerance],
                 lenient: Leniency | None = None) -> str | None:
    """Why the candidate's output is not within tolerance of the reference (in float64,
    else in the inputs' precision), or of the original without a reference; None if it is."""
    got = call(candidate, inputs)
    if reference is None:
        expected = [call(original, inputs)]
    else:
        wide, upcast = reference_output(reference, inputs)
        expected = [wide, call(reference, inputs)] if upcast else [wide]
    problem = "no output to compare"
    for want in expected:
        if reference is not None:
            want, _ = relaxed(tensors(got), want, lenient)
        try:
            comps = compare_outputs(got, want, overrides, None)
        except (RuntimeError, ValueError, TypeError) as exc:
            return f"{type(exc).__name__}: {exc}"[:300]
        bad = next((c for c in comps if not c.passed), None)
        if bad is None:
            return None
        problem = bad.description or f"max abs error {bad.max_abs_error:.3g}"
    against = "reference" if reference is not None else "original"
    return f"the output differs from the {against}'s: {problem}"


@contextlib.contextmanager
def _phase(phases: dict[str, float], name: str) -> Iterator[None]:
    """Adds the seconds spent inside to `phases[name]`: where an evaluation's time goes."""
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - started


def _verify_candidate(
    candidate: Op, original: Op, references: Callable[[InputSet], Op | None],
    checked: Sequence[InputSet], ctx: Context, payload: Mapping[str, Any],
    phases: dict[str, float],
) -> list[Record]:
    records = verify(candidate, original, references, checked, ctx)
    if not ctx.probes:
        return records
    if checked and all(r["passed"] for r in records):
        fresh = _fresh_inputs(checked[0], payload)
        # Inside the caller's "verify" phase, so named as a part of it (not summed twice).
        with _phase(phases, "verify:repeat-calls"):
            records += repeat_records(candidate, original, fresh, REPEAT_CALLS, ctx,
                                      references)
    return records


def _fresh_inputs(like: InputSet, payload: Mapping[str, Any]) -> Callable[[int], InputSet]:
    """Inputs shaped like `like` from new seeds: the same shapes, other values."""
    signatures = [CallSignature.from_json(s) for s in payload.get("signatures", [])]
    schedule = SeedSchedule(_root(payload))

    def make(k: int) -> InputSet:
        seed = schedule.seed("repeat", k)
        if signatures:
            return InputSet(f"seed +{k}", *make_args(signatures[0], seed, "cuda"),
                            tests=signatures[0].tests, via=signatures[0].via)
        args = [_reseeded(a, seed) for a in like.args]
        return InputSet(f"seed +{k}", args, dict(like.kwargs), tests=like.tests, via=like.via)

    return make


def _reseeded(value: Any, seed: int) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        gen = torch.Generator(device=value.device).manual_seed(seed)
        return torch.randn(value.shape, generator=gen, device=value.device, dtype=value.dtype)
    return value


# The original's kernel listing per (its build artifact, input label): listing costs a
# profiler session, and neither the original nor its inputs change between candidates.
_ORIGINAL_LAUNCHES: dict[tuple[str, str], list[Launch]] = {}


def _launch_records(original: Op, candidate: Op, inputs: InputSet,
                    kernels: Mapping[str, Sequence[str]], origin: str) -> list[Record]:
    """The candidate must launch its own kernels, on the caller's stream, and no
    library kernel that the original did not launch."""
    try:
        key = (origin, inputs.label)  # the original's build is the same all session long
        if key not in _ORIGINAL_LAUNCHES:
            _ORIGINAL_LAUNCHES[key] = launches(original, *_copies(inputs))
        seen_o = _ORIGINAL_LAUNCHES[key]
        seen_c = launches(candidate, *_copies(inputs))
    except (RuntimeError, ImportError, AttributeError) as exc:
        if cuda_error_kind(str(exc)) is not None:
            raise
        return []  # no profiler here: the other layers still stand
    own_o, own_c = set(kernels.get("original", ())), set(kernels.get("candidate", ()))
    foreign_o = {kernel_identifier(k.name) for k in seen_o} - own_o
    mine = [k for k in seen_c if kernel_identifier(k.name) in own_c]
    alien = sorted({k.name[:120] for k in seen_c if kernel_identifier(k.name) not in own_c
                    and kernel_identifier(k.name) not in foreign_o and not is_benign(k.name)})
    streams_o = {k.stream for k in seen_o}
    strays = sorted({k.name[:80] for k in seen_c if streams_o and k.stream not in streams_o})
    out = []
    if alien:
        out.append(record(inputs, "original", False, "foreign-kernels",
                          error=f"launches library kernels the original did not: {alien[:4]}"))
    if not mine and any(kernel_identifier(k.name) in own_o for k in seen_o):
        out.append(record(inputs, "original", False, "no-own-kernel",
                          error="launched none of its own kernels (saw "
                                f"{[k.name[:80] for k in seen_c][:4] or 'no kernels'})"))
    if strays:
        out.append(record(inputs, "original", False, "side-stream",
                          error=f"runs {strays[:3]} on a stream the original does not use: "
                                "work the caller's stream (and its timer) does not wait for"))
    return out


def _copies(inputs: InputSet) -> tuple[list[Any], dict[str, Any]]:
    return clone(inputs.args), clone(inputs.kwargs)


def _input_sets(
    signatures: Sequence[CallSignature], seeds: Sequence[int], payload: Mapping[str, Any]
) -> list[InputSet]:
    sets = [
        InputSet(f"{shape_label(sig)} seed#{i}", *make_args(sig, seed, "cuda"),
                 group=f"sig{n}", tests=sig.tests, via=sig.via)
        for n, sig in enumerate(signatures)
        for i, seed in enumerate(seeds)
    ]
    declared = payload.get("declared") or {}
    if payload.get("inputs_ref") and declared.get("shapes"):
        sets += _declared_sets(str(payload["inputs_ref"]), declared, seeds)
    return sets


def _declared_sets(ref: str, declared: Mapping[str, Any], seeds: Sequence[int]) -> list[InputSet]:
    module, _, name = ref.partition(":")
    make = getattr(importlib.import_module(module), name)
    sets = []
    for shape in declared["shapes"]:
        for dtype in declared.get("dtypes") or ["float32"]:
            for i, seed in enumerate(seeds):
                torch.manual_seed(seed)
                args = list(make(tuple(shape), dtype))
                label = f"{tuple(shape)} {dtype} seed#{i} (declared)"
                sets.append(InputSet(label, args, {}, group=f"{tuple(shape)} {dtype}"))
    return sets


def _added_sets(added: Sequence[Mapping[str, Any]], seed: int, contract_seed: int
                ) -> list[InputSet]:
    """The inputs kfbot adds that the original held to (`evaluate.inputs.contract`): edge
    shapes, scaled and large shapes, the sizes a candidate compares with, redrawn
    values. Recorded values are drawn afresh (`seed`); redrawn ones exactly as the
    original was tried on them (`contract_seed`): a heavy tail's extremes differ from
    draw to draw, and the original held to these."""
    sets = []
    for data in added:
        trial = Trial.from_json(data)
        drawn_with = seed if trial.values == RECORDED else contract_seed
        args, kwargs = values_for(trial, drawn_with, "cuda")
        sig = trial.signature
        sets.append(InputSet(trial.label, args, kwargs, tests=sig.tests, via=sig.via))
    return sets


def _bench(
    original: Op,
    candidate: Op,
    signatures: Sequence[CallSignature],
    root: int,
    settings: Mapping[str, Any],
    ctx: Context,
    phases: dict[str, float],
) -> tuple[list[dict[str, Any]], list[Record]]:
    """Interleaved timings per shape, with the timed outputs re-checked and the CUDA
    events of the first shape confirmed by the host's wall clock. The warm-up and the
    timed trials get inputs of their own phases of the seed schedule (none is an input
    the verification used), and with the probes on, the timed inputs change between
    trials (`Swaps`)."""
    timing = TimingSettings(**settings.get("timing", {}))
    out, probes = [], []
    for n, sig in enumerate(signatures[: int(settings.get("max_shapes", 8))]):
        arg_sets = _phase_args(sig, root, "timed", TIMED_SETS * n, TIMED_SETS)
        warmup = _phase_args(sig, root, "warmup", n, 1)
        swaps = Swaps(arg_sets, SeedSchedule(root).seed("timed", -1 - n)) if ctx.probes \
            else None
        with _phase(phases, "bench"):
            timed = interleaved({"original": original, "candidate": candidate}, arg_sets,
                                timing, seed=root, warmup_sets=warmup, before_trial=swaps,
                                check=timed_check(ctx, swaps.dirty if swaps else None)
                                if ctx.probes else None)
        label = shape_label(sig)
        out.append({
            "input": label,
            "signature": sig.to_json(),
            "bytes": _bytes(original, arg_sets[0]),
            "flops": _flops(settings.get("flops"), arg_sets[0]),
            "original_us": timed.samples["original"],
            "candidate_us": timed.samples["candidate"],
        })
        if timed.mismatch is not None:
            probes.append(record(InputSet(label, [], {}), "original", False, "timed-output",
                                 error=f"a timed output differs from the original's "
                                       f"({timed.mismatch})"))
        if n == 0 and ctx.probes:
            with _phase(phases, "second-timer"):
                probes += second_timer(original, candidate, arg_sets[0], out[-1], label)
    return out, probes


def _flops(expression: str | None, args: tuple[list[Any], dict[str, Any]]) -> float | None:
    """FLOPs of one call from the task's declared expression over `args`, if any."""
    if not expression:
        return None
    value = eval(expression, {"__builtins__": {}}, {"args": args[0]})  # the user's own config
    return float(value)


def _bytes(fn: Op, args: tuple[list[Any], dict[str, Any]]) -> int:
    """Bytes one call must read and write at least: every element its inputs and outputs
    span, once (an expanded input's repeats are one element)."""
    ins = [a for a in [*args[0], *args[1].values()] if isinstance(a, torch.Tensor)]
    outs = [t for t in tensors(fn(*args[0], **args[1])) if isinstance(t, torch.Tensor)]
    return sum(_span(t) * t.element_size() for t in [*ins, *outs])


def _span(t: torch.Tensor) -> int:
    if any(s < 0 for s in t.stride()):
        return t.numel()
    return min(t.numel(), storage_extent(tuple(t.shape), tuple(t.stride())))
