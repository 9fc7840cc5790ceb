"""Correctness inside the worker: the op against its reference and against the original.

Each candidate check runs candidate -> reference (and original) -> candidate on the
same inputs. The first candidate call finds the allocator poisoned with NaN; the
second finds it emptied and refilled with another pattern after the reference ran,
so an output the op does not write, or one it takes from memory the reference or
the original left behind, cannot pass. Inputs are compared before and after each
call, and outputs of different inputs must differ wherever the reference's do.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kfbot.evaluate.capture.via import Via, answers_in_arguments
from kfbot.evaluate.device.answers import (
    fits,
    for_reference,
    in_arguments,
    tensors,
)
from kfbot.evaluate.device.lenient import Leniency, relaxed
from kfbot.evaluate.device.probes import (
    mutated,
    poisoned_elements,
    snapshot,
    tensors_in,
)
from kfbot.evaluate.poison import POISON_FINITE, POISON_NAMES, POISON_NAN, poison
from kfbot.evaluate.verdict.compare import (
    Comparison,
    close_all,
    close_all_finite,
    compare,
    dtype_name,
    tolerance_for,
)
from kfbot.evaluate.verdict.tolerances import Tolerance
from kfbot.evaluate.worker.session import cuda_error_kind

Op = Callable[..., Any]
Args = tuple[list[Any], dict[str, Any]]
Record = dict[str, Any]


@dataclass(frozen=True)
class InputSet:
    label: str  # e.g. "(4096, 1024) float32 seed#1" or "edge (1, 1)"
    args: list[Any]
    kwargs: dict[str, Any]
    group: str = ""  # the same shapes from another seed share a group
    tests: tuple[str, ...] = ()  # the tests (or script) whose calls these inputs repeat
    via: Via | None = None  # how those calls came through the wrapper the test called


def clone(value: Any) -> Any:
    """Deep copy of tensors so one call cannot change what the next call sees."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone(v) for v in value)
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    return value


def upcast(value: Any) -> Any:
    """Floating tensors in float64: the reference is computed in higher precision."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    if isinstance(value, (list, tuple)):
        return type(value)(upcast(v) for v in value)
    return value


def call(fn: Op, inputs: InputSet) -> Any:
    out = fn(*clone(inputs.args), **clone(inputs.kwargs))
    wait()
    return out


def wait() -> None:
    """Wait for the GPU's work; nothing to wait for where CUDA never started (a CPU
    stand-in of an op, on a machine without a GPU)."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def reference_output(ref: Op, inputs: InputSet) -> tuple[Any, bool]:
    """The reference's output in float64 where it accepts it, else in the input dtype."""
    try:
        return call(ref, InputSet(inputs.label, upcast(inputs.args), upcast(inputs.kwargs))), True
    except (RuntimeError, TypeError):
        return call(ref, inputs), False


def _reference(ref: Op, inputs: InputSet) -> tuple[Any, Callable[[], Any] | None]:
    """The reference output, and (when that was computed in float64) a way to get it
    in the inputs' own precision."""
    out, upcast_ok = reference_output(ref, inputs)
    return out, (lambda: call(ref, inputs)) if upcast_ok else None


def input_bytes(inputs: InputSet) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in([inputs.args, inputs.kwargs]))


def compare_outputs(
    actual: Any, expected: Any, overrides: Mapping[str, Tolerance], block: int | None
) -> list[Comparison]:
    got, want = tensors(actual), tensors(expected)
    if len(got) != len(want):
        raise ValueError(f"the op returned {len(got)} outputs, the reference {len(want)}")
    results = []
    for a, e in zip(got, want, strict=True):
        if not isinstance(a, torch.Tensor) or not isinstance(e, torch.Tensor):
            a = torch.as_tensor(a)
            e = torch.as_tensor(e)
        tol = tolerance_for(dtype_name(a.dtype), overrides)
        results.append(compare(a, e, tol, block))
    return results


@dataclass(frozen=True)
class Run:
    """One call of the op: its output, or the error it raised, and what it changed."""

    out: Any = None
    error: str | None = None
    mutated: tuple[int, ...] = ()
    poison: int | None = None
    in_args: bool = False  # `out` is the op's tensor arguments (`answers.in_arguments`)

    def for_reference(self, want: Any) -> Run:
        """This run as a reference computing `want` judges it: an answer in arguments
        narrowed to the arguments the reference computes (`answers.for_reference`)."""
        if not self.in_args or self.error is not None or fits(want, self.out):
            return self
        part = for_reference(self.out, want)
        return self if part is None else replace(self, out=part)


def run(fn: Op, inputs: InputSet, byte: int | None, *, watch: bool = True,
        spent: dict[str, float] | None = None) -> Run:
    """Call `fn` on copies of the inputs, after poisoning the allocator with `byte`;
    with `watch`, note which inputs the call changed. `spent` adds up the seconds the
    poisoning and the watching took, which are the probes' share of a verification."""
    spent = {} if spent is None else spent
    args, kwargs = clone(inputs.args), clone(inputs.kwargs)
    with _adding(spent, "watch"):
        before = snapshot([args, kwargs]) if watch else []
    if byte is not None:
        with _adding(spent, "poison"):
            poison(byte, input_bytes(inputs))
    called = _call(fn, args, kwargs, inputs.via)
    if called.error is not None:
        return replace(called, poison=byte)
    with _adding(spent, "watch"):
        changed = tuple(mutated(before, [args, kwargs])) if watch else ()
    return replace(called, mutated=changed, poison=byte)


@contextlib.contextmanager
def _adding(spent: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - started


def _call(fn: Op, args: list[Any], kwargs: dict[str, Any], via: Via | None = None) -> Run:
    """One call, waited for: its output, or the error it raised. An op that returns
    nothing or a status answers in its arguments (`via.answers_in_arguments`, as the
    capture decides it): its output is what the test's wrapper returned of them (`via`),
    else `answers.in_arguments`."""
    try:
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
    except (RuntimeError, ValueError, TypeError) as exc:
        if cuda_error_kind(str(exc)) is not None:
            raise  # a sticky CUDA error: the worker must restart; the engine records it
        return Run(error=f"{type(exc).__name__}: {exc}"[:500])
    if not answers_in_arguments(out):
        return Run(out)
    if via is not None and via.result:
        return Run(via.output(args))
    return Run(in_arguments(out, args, kwargs), in_args=True)


def record(inputs: InputSet, against: str, passed: bool, check: str, **extra: Any) -> Record:
    return {
        "input": inputs.label,
        "against": against,
        "passed": passed,
        "check": check,
        "error": extra.get("error"),
        "comparisons": extra.get("comparisons", []),
        "run": extra.get("run", ""),
    }


NOTES = {
    "reference": "within tolerance of the reference in the op's precision",
    # Two float32 orders of summation may differ by more than the tolerance from each
    # other while each is as close to the reference as float32 allows.
    "original": "differs from the original, but is within tolerance of the reference",
    "itself": "the original against its own output (no independent reference)",
}


def judge(
    result: Run, expected: Any, inputs: InputSet, against: str, ctx: Context,
    fallback: Callable[[], Any] | None = None,
    note: str = NOTES["reference"],
) -> Record:
    """One output against one expectation, naming the check that failed.

    `fallback` gives the reference computed in the op's own precision: an output
    within tolerance of it is as accurate as PyTorch itself at that precision (a long
    float32 reduction can miss a float64 reference by more than the tolerance).
    """
    first = _judge(result, expected, inputs, against, ctx)
    if first["passed"] or fallback is None or result.error is not None:
        return first
    second = _judge(result, fallback(), inputs, against, ctx)
    if not second["passed"]:
        return first
    second["run"] = f"{second['run']}; {note}"
    return second


def _judge(result: Run, expected: Any, inputs: InputSet, against: str, ctx: Context) -> Record:
    label = _run_label(result.poison)
    if result.error is not None:
        return record(inputs, against, False, "correctness", error=result.error, run=label)
    lenient = ctx.lenient if against == "reference" else None
    expected, accepted = relaxed(tensors(result.out), expected, lenient)
    try:
        comps = compare_outputs(result.out, expected, ctx.overrides, ctx.block)
    except (RuntimeError, ValueError, TypeError) as exc:
        return record(inputs, against, False, "correctness", run=label,
                      error=f"{type(exc).__name__}: {exc}"[:500])
    passed = all(c.passed for c in comps)
    check = "correctness" if passed else _failed_check(result, expected)
    error = None if check == "correctness" else _poison_text(result, expected)
    made = record(inputs, against, passed, check, run=label, error=error,
                  comparisons=[c.to_json() for c in comps])
    if passed and accepted:
        made["lenient"] = accepted  # kfbot's own comparison would have failed it
    return made


def _run_label(byte: int | None) -> str:
    if byte is None:
        return "plain call"
    return f"outputs poisoned with {POISON_NAMES[byte]}"


def _poisoned(result: Run, expected: Any) -> tuple[int, int]:
    """(elements still holding the poison, total output elements)."""
    if result.poison is None:
        return 0, 0
    hit = total = 0
    for out, exp in zip(tensors(result.out), tensors(expected), strict=False):
        if not isinstance(out, torch.Tensor):
            continue
        total += out.numel()
        hit += poisoned_elements(out, result.poison)
        if result.poison == POISON_NAN and out.is_floating_point() \
                and isinstance(exp, torch.Tensor) and exp.shape == out.shape:
            # NaN in, NaN out: an op that reads memory it never wrote spreads the poison.
            spread = out.isnan() & ~exp.to(out.device).isnan()
            hit = max(hit, int(spread.sum().item()))
    return hit, total


def _failed_check(result: Run, expected: Any) -> str:
    hit, _ = _poisoned(result, expected)
    return "output-poison" if hit else "correctness"


def _poison_text(result: Run, expected: Any) -> str:
    hit, total = _poisoned(result, expected)
    pattern = POISON_NAMES.get(result.poison or 0, "poison")
    return (f"{hit} of {total} output elements hold or derive from the poison "
            f"({pattern}) the allocator was filled with: the op did not write them, "
            f"or read memory it did not write")


@dataclass
class Context:
    overrides: Mapping[str, Tolerance]
    block: int | None
    in_place: bool = False
    probes: bool = True  # poisoning, mutation and constant-output checks
    original_mutates: bool | None = None  # None until seen
    first_outputs: dict[str, list[tuple[Any, Any, str]]] = field(default_factory=dict)
    spent: dict[str, float] = field(default_factory=dict)  # seconds by part, see `run`
    finite_seen: set[str] = field(default_factory=set)  # groups run under the finite pattern
    lenient: Leniency | None = None  # what the repository's own comparison accepts


def check_candidate(
    fn: Op, original: Op | None, ref: Op | None, inputs: InputSet, ctx: Context
) -> list[Record]:
    """candidate -> reference, original -> candidate on one input set."""
    if not ctx.probes:
        return _plain_check(fn, original, ref, inputs, ctx)
    first = run(fn, inputs, POISON_NAN, spent=ctx.spent)
    expected: list[tuple[str, Any, Callable[[], Any] | None]] = []
    if ref is not None:
        expected.append(("reference", *_reference(ref, inputs)))
    if original is not None:
        # Whether the original changes its inputs is the op's nature, learnt on the
        # first input set: the snapshots it takes cost as much as the call.
        base = run(original, inputs, None, watch=ctx.original_mutates is None, spent=ctx.spent)
        if base.error is None:
            if expected and not fits(expected[0][1], base.for_reference(expected[0][1]).out):
                expected.clear()  # a reference of another shape than the op's: not a judge
            if ctx.original_mutates is None:
                ctx.original_mutates = bool(base.mutated)
            expected.append(("original", base.out, _as_reference(expected)))
    # The finite pattern catches what NaN hides (fmax, comparisons, a NaN test that
    # switches the cheat off). What it catches depends on the memory the op is handed,
    # which follows the shapes, not the values: once per group of same-shaped inputs.
    group = inputs.group or inputs.label
    second = run(fn, inputs, POISON_FINITE, spent=ctx.spent) \
        if group not in ctx.finite_seen else None
    ctx.finite_seen.add(group)
    runs = (first,) if second is None else (first, second)
    records = _mutation_records(inputs, runs, ctx.in_place or bool(ctx.original_mutates))
    judged = [(against, want, fallback,
               judge(_as_judged(first, against, want), want, inputs, against, ctx, fallback,
                     NOTES[against]))
              for against, want, fallback in expected]
    quick = second is not None and all(rec["passed"] for *_, rec in judged) \
        and second.error is None \
        and _quick_pass(second.out, [want for _, want, _, _ in judged], ctx)
    for against, want, fallback, rec in judged:
        if quick:
            rec["run"] = f"{rec['run']}, then with {POISON_NAMES[POISON_FINITE]}"
        elif second is not None and rec["passed"]:
            rec = judge(_as_judged(second, against, want), want, inputs, against, ctx,
                        fallback, NOTES[against])
        records.append(own_non_finite(rec, second, want))
    seen = ctx.first_outputs.setdefault(inputs.group or inputs.label, [])
    if first.error is None and expected and len(seen) < 2:
        # Two per group are all `constant_records` compares; holding more would only
        # crowd the allocator, whose every block the poisoning visits.
        seen.append((_as_judged(first, *expected[0][:2]).out, expected[0][1], inputs.label))
    return records


def _as_judged(result: Run, against: str, want: Any) -> Run:
    return result.for_reference(want) if against == "reference" else result


def own_non_finite(rec: Record, second: Run | None, expected: Any) -> Record:
    """A failure renamed `non-finite` when the op itself wrote NaN or Inf where the
    expectation is finite: seen in the run whose allocator held a finite pattern, so no
    NaN there is the poison read back (in the NaN-poisoned run a written NaN and an
    unwritten element look alike). A NaN passes no comparison kfbot makes, whatever a
    test's `err > tol` would let through."""
    if rec["passed"] or rec["check"] not in ("correctness", "output-poison") \
            or second is None or second.error is not None:
        return rec
    count = total = 0
    for out, exp in zip(tensors(second.out), tensors(expected), strict=False):
        if isinstance(out, torch.Tensor) and isinstance(exp, torch.Tensor) \
                and out.is_floating_point() and out.shape == exp.shape:
            total += out.numel()
            count += int((~out.isfinite() & exp.to(out.device).isfinite()).sum().item())
    if not count:
        return rec
    return {**rec, "check": "non-finite",
            "error": f"{count} of {total} output elements are NaN or Inf where the "
                     f"{rec['against']} is finite, with the allocator filled with a finite "
                     "pattern: the op wrote them (a NaN passes no comparison)"}


def close_flag(actual: Any, expected: Any, overrides: Mapping[str, Tolerance],
               *, finite: bool) -> bool | torch.Tensor:
    """Whether every output is within tolerance, without a synchronize: False or True
    when the outputs' structure or dtypes already say, else a 0-dim bool on the device.
    `finite` takes the four-pass check, which can only fail, never pass, where the
    expected output holds a NaN or Inf; else the full mask. A float64 expected output
    (the reference) is met in float64, under the tolerance of the op's own dtype."""
    got, want = tensors(actual), tensors(expected)
    if len(got) != len(want):
        return False
    close = close_all_finite if finite else close_all
    flags = []
    for a, e in zip(got, want, strict=True):
        if not isinstance(a, torch.Tensor) or not isinstance(e, torch.Tensor):
            return False
        tol = tolerance_for(dtype_name(a.dtype), overrides)
        if a.dtype != e.dtype:
            if e.dtype != torch.float64 or not a.is_floating_point():
                return False  # the dtype check `compare` makes
            a = a.double()
        flag = close(a, e.to(a.device), tol)
        if isinstance(flag, bool):
            if not flag:
                return False
            continue
        flags.append(flag)
    if not flags:
        return True
    return flags[0] if len(flags) == 1 else torch.stack(flags).all()


def _quick_pass(actual: Any, expected: Sequence[Any], ctx: Context) -> bool:
    """Whether `actual` is within tolerance of every expectation, with one synchronize
    and none of the statistics: a call usually passes like the first one, and only a
    failure needs the full account (`judge`, which gives the verdict there). The
    four-pass check is never more lenient than the full one, so it serves here."""
    flags = []
    for want in expected:
        flag = close_flag(actual, want, ctx.overrides, finite=True)
        if flag is False:
            return False
        if isinstance(flag, torch.Tensor):
            flags.append(flag)
    return not flags or bool(torch.stack(flags).all())


def _as_reference(
    expected: Sequence[tuple[str, Any, Callable[[], Any] | None]],
) -> Callable[[], Any] | None:
    """The reference as the fallback for a comparison with the original: in the op's
    own precision where there is one, else as computed."""
    for against, want, fallback in expected:
        if against == "reference":
            return fallback if fallback is not None else functools.partial(_same_value, want)
    return None


def _same_value(value: Any) -> Any:
    return value


def _plain_check(
    fn: Op, original: Op | None, ref: Op | None, inputs: InputSet, ctx: Context
) -> list[Record]:
    """One plain call against each expectation: verification without the probes."""
    got = run(fn, inputs, None, spent=ctx.spent)
    expected: list[tuple[str, Any, Callable[[], Any] | None]] = []
    if ref is not None:
        expected.append(("reference", *_reference(ref, inputs)))
    if original is not None:
        expected.append(("original", run(original, inputs, None, spent=ctx.spent).out,
                         _as_reference(expected)))
    return [judge(got, want, inputs, against, ctx, fallback, NOTES[against])
            for against, want, fallback in expected]


def _mutation_records(inputs: InputSet, runs: Sequence[Run], allowed: bool) -> list[Record]:
    changed = sorted({i for r in runs for i in r.mutated})
    if allowed or not changed:
        return []
    which = ", ".join(f"#{i}" for i in changed)
    return [record(inputs, "inputs", False, "input-mutation",
                   error=f"the call changed input tensor {which}, and the op is not "
                         "declared in-place (a result could be smuggled through it)")]


def constant_records(ctx: Context) -> list[Record]:
    """Different inputs with different reference results must give different outputs."""
    out = []
    for group, seen in ctx.first_outputs.items():
        if len(seen) < 2:
            continue
        (got_a, want_a, label_a), (got_b, want_b, label_b) = seen[0], seen[1]
        if not _same(want_a, want_b) and _same(got_a, got_b):
            inputs = InputSet(f"{label_a} and {label_b}", [], {}, group)
            out.append(record(inputs, "reference", False, "constant-output",
                              error="two different inputs gave the same output bit for bit, "
                                    "while the reference's outputs differ: a constant or "
                                    "cached result"))
    return out


def _same(a: Any, b: Any) -> bool:
    ta, tb = tensors(a), tensors(b)
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb, strict=True):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            if x != y:
                return False
        elif x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            return False
    return True


def verify(
    fn: Op,
    original: Op | None,
    reference: Callable[[InputSet], Op | None],
    input_sets: Sequence[InputSet],
    ctx: Context,
) -> list[Record]:
    """The op against the reference (where callable) and the original on each input."""
    records: list[Record] = []
    for inputs in input_sets:
        ref = reference(inputs)
        if original is None:  # the baseline: the original against its reference
            byte = POISON_NAN if ctx.probes else None
            want, fallback = _reference(ref, inputs) if ref is not None else (None, None)
            got = run(fn, inputs, byte).for_reference(want) if ref is not None else None
            if got is not None and (got.error is not None or fits(want, got.out)):
                records.append(judge(got, want, inputs, "reference", ctx, fallback))
            else:
                records.append(_against_itself(fn, inputs, byte, ctx))
            continue
        records += check_candidate(fn, original, ref, inputs, ctx)
    if original is not None and ctx.probes:
        records += constant_records(ctx)
    return records


def _against_itself(fn: Op, inputs: InputSet, byte: int | None, ctx: Context) -> Record:
    """With no independent reference the original's own outputs are the judge, so they
    must at least be its outputs: the same from a plain call as from one whose output
    memory was poisoned first (an output it does not write, or writes differently
    from call to call, would make every comparison with it a coin toss)."""
    plain = run(fn, inputs, None, watch=False, spent=ctx.spent)
    if plain.error is not None:
        return record(inputs, "original", False, "correctness", error=plain.error,
                      run="plain call")
    return judge(run(fn, inputs, byte, watch=False, spent=ctx.spent), plain.out, inputs,
                 "original", ctx, note=NOTES["itself"])


def repeat_records(
    fn: Op, original: Op, make_inputs: Callable[[int], InputSet], calls: int, ctx: Context,
    reference: Callable[[InputSet], Op | None] = lambda inputs: None,
) -> list[Record]:
    """Call the candidate `calls` times on fresh inputs, back to back as a program's loop
    does (each call waited for, nothing else in between), then judge every output: as
    close to the original, or to the reference, as the tolerance allows. A launcher
    that acts differently when called in quick succession (a call counter, a clock
    read between calls) shows it here; the verification calls are far apart."""
    first = make_inputs(0)
    # Each call holds its inputs, their copies and its outputs until judged.
    group = back_to_back_group(calls, 3 * input_bytes(first), torch.cuda.mem_get_info()[0])
    for start in range(0, calls, group):
        ks = range(start, min(calls, start + group))
        sets = [first if k == 0 else make_inputs(k) for k in ks]
        failure = _judge_repeats(fn, original, sets, start, calls, ctx, reference)
        if failure:
            return failure
    return []


def back_to_back_group(calls: int, set_bytes: int, free_bytes: int) -> int:
    """How many calls to make back to back before judging them: all of them where what
    each holds (`set_bytes`) fits in a quarter of the free memory, else
    as many as fit, and never fewer than two (a pair is the least a loop makes)."""
    fits = free_bytes // 4 // max(1, set_bytes)
    return max(2, min(calls, fits))


def _judge_repeats(
    fn: Op, original: Op, sets: Sequence[InputSet], start: int, calls: int, ctx: Context,
    reference: Callable[[InputSet], Op | None],
) -> list[Record]:
    outs = _back_to_back(fn, [(clone(s.args), clone(s.kwargs)) for s in sets])
    for k, (inputs, got) in enumerate(zip(sets, outs, strict=True), start):
        want = run(original, inputs, None, watch=False)
        if want.error is not None:
            continue
        if got.error is None and _quick_pass(got.out, [want.out], ctx):
            continue  # the usual case: one synchronize, no reference call
        ref = reference(inputs)
        fallback = _as_reference([("reference", *_reference(ref, inputs))]) \
            if ref is not None else None
        rec = judge(got, want.out, inputs, "original", ctx, fallback, NOTES["original"])
        if not rec["passed"]:
            rec["check"] = "repeat-calls"
            rec["input"] = f"call {k + 1} of {calls} on fresh inputs, {inputs.label}"
            rec["run"] = f"{rec['run']}; called back to back"
            return [rec]
    return []


def _back_to_back(fn: Op, argsets: Sequence[Args]) -> list[Run]:
    return [_call(fn, args, kwargs) for args, kwargs in argsets]
