"""Worker job: the inputs kfbot adds, each tried on the original (`evaluate.inputs.contract`).

Each trial, in order: is there room for it (its estimated bytes against the GPU's free
memory, before anything is allocated); then the original on fresh inputs, against the
reference within half the tolerance (a candidate that sums in another order must not
fail where the original only just passed), or against nothing but whether it runs.

Before each trial the job prints `kfbot contract: trying <index>` and flushes: where
the original takes the worker down with it (a segfault, an illegal instruction), the
engine reads the last such line and knows which input did it. A sticky CUDA error the
job catches itself ends the job: it answers with what it has and asks for a fresh
worker, and the engine sends the rest again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import torch

from kfbot.evaluate.device.jobs import wrong_output
from kfbot.evaluate.device.lenient import Leniency
from kfbot.evaluate.device.loading import Op, load_op
from kfbot.evaluate.device.references import leniency, references_for
from kfbot.evaluate.device.values import values_for
from kfbot.evaluate.device.verify import InputSet
from kfbot.evaluate.inputs.contract import MEMORY_SHARE, Trial, Verdict
from kfbot.evaluate.verdict.compare import tolerance_for
from kfbot.evaluate.verdict.tolerances import DEFAULT_TOLERANCES, Tolerance
from kfbot.evaluate.worker.main import RESTART_KEY
from kfbot.evaluate.worker.session import cuda_error_kind

ANNOUNCE = "kfbot contract: trying "


def try_on_original(payload: Mapping[str, Any]) -> dict[str, Any]:
    """{"verdicts": [...], "tried": n}: the first n trials judged; fewer than all when a
    sticky CUDA error ended the job (then it asks for a fresh worker)."""
    sys.path[:0] = [p for p in payload.get("sys_path", []) if p not in sys.path]
    original = load_op(payload["original"], payload["op"])
    references = references_for(payload.get("references", []))
    overrides = {k: Tolerance(*v) for k, v in payload.get("tolerances", {}).items()}
    seed = int(payload["seed"])
    device = str(payload.get("device", "cuda"))  # "cpu": a stand-in of the op, for tests
    lenient = leniency(payload.get("references", []))
    verdicts: list[dict[str, Any]] = []
    for index, data in enumerate(payload["trials"]):
        print(f"{ANNOUNCE}{index}", flush=True)
        trial = Trial.from_json(data)
        verdict, sticky = _try(original, references, trial, int(data.get("bytes", 0)), seed,
                               overrides, device, lenient)
        verdicts.append(verdict.to_json())
        if sticky:
            return {"verdicts": verdicts, "tried": index + 1, RESTART_KEY: True}
    return {"verdicts": verdicts, "tried": len(verdicts)}


def _try(original: Op, references: Any, trial: Trial, need: int, seed: int,
         overrides: Mapping[str, Tolerance], device: str,
         lenient: Leniency | None) -> tuple[Verdict, bool]:
    free = _free_bytes(device)
    if need > free * MEMORY_SHARE:
        return Verdict(trial, "memory", f"it needs about {_gib(need)} on the {device}, more "
                       f"than {MEMORY_SHARE:.0%} of the {_gib(free)} free"), False
    try:
        args, kwargs = values_for(trial, seed, device)
        inputs = InputSet(trial.label, args, kwargs, tests=trial.signature.tests,
                          via=trial.signature.via)
        reference = references(inputs)
        why = wrong_output(original, original, reference, inputs, overrides, lenient)
        if why is not None:
            return Verdict(trial, "wrong", _said(why)), False
        if wrong_output(original, original, reference, inputs, _halved(overrides),
                        lenient) is not None:
            return Verdict(trial, "narrow", "within the tolerance, but not within half of it"), \
                False
    except (RuntimeError, ValueError, TypeError) as exc:
        kind = cuda_error_kind(str(exc))
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        if kind == "oom":
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()
            return Verdict(trial, "memory", f"it ran out of GPU memory ({text})"), False
        if kind is not None:
            return Verdict(trial, "cuda-error", text), True
        return Verdict(trial, "raises", text), False
    return Verdict(trial), False


def _free_bytes(device: str) -> int:
    if device == "cpu":
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(torch.cuda.mem_get_info()[0])


def _said(why: str | None) -> str:
    return (why or "").removeprefix("the output differs from the ")


def _halved(overrides: Mapping[str, Tolerance]) -> dict[str, Tolerance]:
    return {name: Tolerance(t.atol / 2, t.rtol / 2)
            for name, t in ((n, tolerance_for(n, overrides)) for n in DEFAULT_TOLERANCES)}


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"
