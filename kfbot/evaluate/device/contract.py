"""Redrawn inputs on the GPU: tried on the original first, then checked on candidates.

`distribution_sets` makes the input sets of the correctness phase that redraw each
floating input from one of `kfbot.evaluate.distributions`' distributions, one set per
distribution, on the captured signatures in turn (so every benchmarked shape meets at
least one distribution where there are several shapes).

The original defines the contract: `admit_on_original` runs each such set on the
original first. Where the op rejects the input (an exception from a shape or range
check) or the original is wrong on it (not within half the tolerance of the
reference, the margin `jobs._holds` keeps for shapes beyond the captured ones), the
set leaves the contract, with the reason as a note about the original; a candidate is
never failed on it. `admit` is the job that asks this once per run, before the first
candidate, so a CUDA error of the original costs one worker and no candidate.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kfbot.evaluate.compare import tolerance_for
from kfbot.evaluate.device.loading import Op, load_op
from kfbot.evaluate.device.verify import InputSet, call, compare_outputs, reference_output
from kfbot.evaluate.distributions import DISTRIBUTIONS, SeedSchedule, distribution_label, draw_args
from kfbot.evaluate.signature import CallSignature
from kfbot.evaluate.tolerances import DEFAULT_TOLERANCES, Tolerance
from kfbot.evaluate.worker import cuda_error_kind

MAX_SETS = 8


def planned(signatures: Sequence[CallSignature], root: int, shape_label: Callable[
        [CallSignature], str]) -> list[tuple[str, CallSignature, str, int]]:
    """(label, signature, distribution, seed) of each redrawn set: every distribution
    once, round-robin over the signatures, and every signature (up to `MAX_SETS`) once."""
    if not signatures:
        return []
    schedule = SeedSchedule(root)
    count = min(max(len(DISTRIBUTIONS), len(signatures)), max(MAX_SETS, len(DISTRIBUTIONS)))
    order = schedule.distributions("correctness", count)
    out: list[tuple[str, CallSignature, str, int]] = []
    for k in range(count):
        sig = signatures[k % len(signatures)]
        label = distribution_label(order[k], shape_label(sig))
        if any(label == seen for seen, *_ in out):
            continue
        out.append((label, sig, order[k], schedule.seed("correctness", k)))
    return out


def distribution_sets(signatures: Sequence[CallSignature], root: int, admitted: Sequence[str],
                      shape_label: Callable[[CallSignature], str]) -> list[InputSet]:
    """The admitted redrawn sets, each its own group (its own finite-pattern run)."""
    keep = set(admitted)
    return [InputSet(label, *draw_args(sig, seed, "cuda", dist), group=label,
                     tests=sig.tests, via=sig.via)
            for label, sig, dist, seed in planned(signatures, root, shape_label)
            if label in keep]


def admit_on_original(original: Op, reference: Op | None, inputs: InputSet,
                      overrides: Mapping[str, Tolerance]) -> dict[str, str] | None:
    """Try an added input on the original: None when it belongs to the contract, else
    why not ({"input", "reason", "detail"}). A CUDA error is raised: the worker is
    gone with it, and the engine says which input did it."""
    half = {name: Tolerance(t.atol / 2, t.rtol / 2)
            for name, t in ((n, tolerance_for(n, overrides)) for n in DEFAULT_TOLERANCES)}
    try:
        got = call(original, inputs)
        if reference is None:
            return None
        want, _ = reference_output(reference, inputs)
        comps = compare_outputs(got, want, half, None)
    except (RuntimeError, ValueError, TypeError) as exc:
        if cuda_error_kind(str(exc)) is not None:
            raise
        return {"input": inputs.label, "reason": "rejected",
                "detail": f"the op rejects it: {type(exc).__name__}: {exc}"[:300]}
    bad = next((c for c in comps if not c.passed), None)
    if bad is None:
        return None
    return {"input": inputs.label, "reason": "original-wrong",
            "detail": f"the original is wrong there: {bad.description}"[:300]}


def admit(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Job: which redrawn sets the original holds to (`only`: just those labels;
    `list_only`: the planned labels, no set made)."""
    from kfbot.evaluate.device.jobs import reference_finder, shape_label

    signatures = [CallSignature.from_json(s) for s in payload.get("signatures", [])]
    plan = planned(signatures, int(payload["root"]), shape_label)
    if payload.get("list_only"):
        return {"planned": [label for label, *_ in plan]}
    sys.path[:0] = [p for p in payload.get("sys_path", []) if p not in sys.path]
    original = load_op(payload["original"], payload["op"])
    references = reference_finder(payload.get("references", []))
    overrides = {k: Tolerance(*v) for k, v in payload.get("tolerances", {}).items()}
    only = set(payload.get("only") or ())
    admitted, outside = [], []
    for label, sig, dist, seed in plan:
        if only and label not in only:
            continue
        inputs = InputSet(label, *draw_args(sig, seed, "cuda", dist), tests=sig.tests,
                          via=sig.via)
        verdict = admit_on_original(original, references(inputs), inputs, overrides)
        if verdict is None:
            admitted.append(label)
        else:
            outside.append(verdict)
        del inputs
        torch.cuda.empty_cache()
    return {"admitted": admitted, "outside": outside}
