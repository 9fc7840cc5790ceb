"""The clean room: a candidate's outputs judged in a process it never ran in.

Everything in the candidate's worker is within its reach: a library it brings can
patch torch, change cuBLAS's math mode or the comparison's own code from a static
initializer, and the reference computed after it runs under whatever it left. So on a
few of the input sets it was verified on (the first of each captured shape and every
redrawn one), the candidate's worker only writes the candidate's outputs to files
(`save_outputs`); a second worker that never loads a candidate (`judge`) makes the same
inputs again from their signature, seed and distribution, computes the reference and
the original there under pinned numeric flags, reads the outputs back (tensors only:
`torch.load(weights_only=True)` runs no code from the file) and compares them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.device import health
from kfbot.evaluate.device.answers import tensors
from kfbot.evaluate.device.lenient import Leniency, relaxed
from kfbot.evaluate.device.loading import Op, load_op
from kfbot.evaluate.device.references import leniency, references_for
from kfbot.evaluate.device.values import values_for
from kfbot.evaluate.device.verify import (
    InputSet,
    call,
    compare_outputs,
    reference_output,
)
from kfbot.evaluate.inputs.contract import RECORDED, Trial, shape_label
from kfbot.evaluate.verdict.tolerances import Tolerance

MAX_SETS = 10


def specs(signatures: Sequence[CallSignature], seed: int, added: Sequence[Mapping[str, Any]],
          contract_seed: int) -> list[dict[str, Any]]:
    """The sets judged in the clean room, as what remakes them: the first seed of each
    captured shape (the label verification gave it) and every redrawn trial."""
    out = [{"label": f"{shape_label(sig)} seed#0", "signature": sig.to_json(), "seed": seed,
            "values": RECORDED} for sig in signatures]
    for data in added:
        trial = Trial.from_json(data)
        if trial.values != RECORDED:
            out.append({"label": trial.label, "signature": trial.signature.to_json(),
                        "seed": contract_seed, "values": trial.values})
    return out[:MAX_SETS]


def _inputs(spec: Mapping[str, Any], device: str) -> InputSet:
    sig = CallSignature.from_json(spec["signature"])
    trial = Trial(str(spec["values"]), str(spec["label"]), sig, str(spec["values"]))
    args, kwargs = values_for(trial, int(spec["seed"]), device)
    return InputSet(trial.label, args, kwargs, tests=sig.tests, via=sig.via)


def save_outputs(candidate: Op, sets: Sequence[Mapping[str, Any]], folder: str,
                 device: str = "cuda") -> list[dict[str, Any]]:
    """In the candidate's worker: one plain call per set, its outputs written to a file
    (`device` "cpu": a stand-in of the op, for tests). An op that answers in its
    arguments (it returns nothing) is left to the checks in its own worker."""
    out = []
    Path(folder).mkdir(parents=True, exist_ok=True)
    for n, spec in enumerate(sets):
        returned = call(candidate, _inputs(spec, device))
        if returned is None:
            return []
        got = tensors(returned)
        path = Path(folder) / f"{n}.pt"
        torch.save([t.detach().cpu() if isinstance(t, torch.Tensor) else t for t in got],
                   path)
        out.append({**spec, "file": str(path)})
    return out


def judge(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Job, in a worker no candidate ran in: each saved output against the reference (the
    original where there is none), on inputs made here."""
    numerics = health.pin_numerics()
    sys.path[:0] = [p for p in payload.get("sys_path", []) if p not in sys.path]
    original = load_op(payload["original"], payload["op"])
    references = references_for(payload.get("references", []))
    overrides = {k: Tolerance(*v) for k, v in payload.get("tolerances", {}).items()}
    device = str(payload.get("device", "cuda"))
    lenient = leniency(payload.get("references", []))
    records = [_judged(original, references, spec, overrides, device, lenient)
               for spec in payload["saved"]]
    return {"records": records, "numerics": numerics}


def _judged(original: Op, references: Any, spec: Mapping[str, Any],
            overrides: Mapping[str, Tolerance], device: str,
            lenient: Leniency | None = None) -> dict[str, Any]:
    """One saved output against the reference, compared as the repository's test
    compares where it is more lenient than kfbot (as in the candidate's own worker)."""
    inputs = _inputs(spec, device)
    try:
        got = torch.load(spec["file"], weights_only=True, map_location=device)
    except Exception as exc:
        return _record(inputs.label, f"the saved outputs cannot be read: {exc}"[:300])
    reference = references(inputs)
    expected = []
    if reference is not None:
        wide, upcast = reference_output(reference, inputs)
        expected = [("reference", wide)] + ([("reference", call(reference, inputs))]
                                            if upcast else [])
    else:
        expected = [("original", call(original, inputs))]
    problem = "no expectation"
    for against, want in expected:
        if against == "reference":
            want, _ = relaxed(list(got), want, lenient)
        try:
            comps = compare_outputs(list(got), want, overrides, None)
        except (RuntimeError, ValueError, TypeError) as exc:
            return _record(inputs.label, f"{type(exc).__name__}: {exc}"[:300])
        bad = next((c for c in comps if not c.passed), None)
        if bad is None:
            return {**_record(inputs.label, None), "against": against}
        problem = f"against the {against}: {bad.description}"
    return _record(inputs.label, f"judged in a process the candidate never ran in, its "
                                 f"output differs {problem}"[:400])


def _record(label: str, error: str | None) -> dict[str, Any]:
    return {"input": label, "against": "reference", "passed": error is None,
            "check": "clean-room", "error": error, "comparisons": [],
            "run": "outputs judged in a separate worker"}
