"""The original defines the contract: inputs kfbot adds are tried on it first.

kfbot verifies candidates on more than the repository's own calls: edge shapes, the
captured shapes scaled up, one large shape, the sizes a candidate compares with, and
any other distribution of values a check wants (heavy tails, wide ranges, spikes).
None of these is a promise the repository made. Each is a `Trial`, tried on the
original before any candidate sees it; where the original is wrong (against the
reference), raises, hits a CUDA error, or the input would not fit in the GPU's free
memory, the trial leaves the contract and becomes a finding about the original:

    the original is wrong at edge (16, 12) float32: 12 of 192 elements wrong (tail block)

Only admitted trials are checked on candidates. The baseline itself fails only when
the original fails the repository's own calls.

To add inputs of your own (a distribution of values, other shapes):

    trials = [Trial("heavy-tailed", f"heavy-tailed {shape_label(sig)}", sig,
                    values="heavy-tailed") for sig in signatures]
    contract = engine.admit(trials)        # tried on the original, once per trial key
    contract.admitted, contract.findings() # what candidates face; what the report says

and register how the values are drawn, in the worker, in
`kfbot.evaluate.device.values.VALUES["heavy-tailed"]` (a function of the signature,
a seed and the device, returning the call's args and kwargs, as `make_args` does).

This module never imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from kfbot.anticheat.findings import Finding
from kfbot.evaluate.baseline.steps import StepReport
from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.inputs.fresh import (
    COMPARED_SIZE,
    edge_signatures,
    large_signature,
    literal_signatures,
    scaled_signatures,
)
from kfbot.evaluate.worker.session import CUDA_KINDS, JobResult

Exclusion = Literal["wrong", "narrow", "raises", "cuda-error", "crash", "hangs", "memory",
                    "untried"]
EXCLUSIONS: tuple[Exclusion, ...] = ("wrong", "narrow", "raises", "cuda-error", "crash",
                                     "hangs", "memory", "untried")
RECORDED = "recorded"  # values drawn as the repository's own calls had them (`make_args`)
FINDING = "original-contract"
# An input is tried only when what it needs is at most this share of the free memory:
# the reference and the comparison allocate beside it.
MEMORY_SHARE = 0.5
_EDGE_SOURCES = 2  # edge shapes of the first captured signatures only


@dataclass(frozen=True)
class Trial:
    """One input kfbot adds, to be tried on the original before it binds a candidate."""

    kind: str  # "edge", "x2", "x4", "large", "compared size", or a distribution's name
    label: str  # what reports call it: "edge (16, 12) float32"
    signature: CallSignature  # its shapes; `tests` and `via` of the call it came from
    values: str = RECORDED  # how its values are drawn (`device.values.VALUES`)

    @property
    def key(self) -> tuple[str, str]:
        return self.label, self.values

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "label": self.label, "signature": self.signature.to_json(),
                "values": self.values, "bytes": estimated_bytes(self.signature)}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Trial:
        return Trial(str(data["kind"]), str(data["label"]),
                     CallSignature.from_json(data["signature"]), str(data.get("values", RECORDED)))


@dataclass(frozen=True)
class Verdict:
    """What the original did on one trial."""

    trial: Trial
    exclusion: Exclusion | None = None  # None: admitted
    detail: str = ""

    @property
    def admitted(self) -> bool:
        return self.exclusion is None

    def finding(self) -> Finding | None:
        """The finding about the original; None for an admitted trial, and for one the
        original passes only narrowly (no fault of the original's)."""
        where = f"{self.trial.label}"
        said = {
            "wrong": f"the original is wrong at {where}: {self.detail}",
            "raises": f"the original raises at {where}: {self.detail}",
            "cuda-error": f"the original hits a CUDA error at {where}: {self.detail}",
            "crash": f"the original takes its process down at {where}: {self.detail}",
            "hangs": f"the original does not finish at {where}: {self.detail}",
            "memory": f"{where} was not tried: {self.detail}",
            "untried": f"{where} could not be tried on the original: {self.detail}",
        }.get(self.exclusion or "")
        if said is None:
            return None
        return Finding(FINDING, "runtime", "warn", said,
                       "left out of the contract: candidates are not checked on this input")

    def to_json(self) -> dict[str, Any]:
        return {"trial": self.trial.to_json(), "exclusion": self.exclusion,
                "detail": self.detail}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Verdict:
        said = data.get("exclusion")
        exclusion = next((e for e in EXCLUSIONS if e == said), None)
        if said is not None and exclusion is None:
            raise ValueError(f"unknown exclusion {said!r}")
        return Verdict(Trial.from_json(data["trial"]), exclusion, str(data.get("detail", "")))


@dataclass(frozen=True)
class Contract:
    """The added inputs the original holds to, and those it does not, with why."""

    verdicts: tuple[Verdict, ...] = ()

    @property
    def admitted(self) -> tuple[Trial, ...]:
        return tuple(v.trial for v in self.verdicts if v.admitted)

    @property
    def excluded(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if not v.admitted)

    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for v in self.verdicts if (f := v.finding()) is not None)

    def of(self, trials: Iterable[Trial]) -> Contract:
        """The verdicts on `trials` (those this contract has), in their order."""
        known = {v.trial.key: v for v in self.verdicts}
        return Contract(tuple(known[t.key] for t in trials if t.key in known))

    def plus(self, verdicts: Iterable[Verdict]) -> Contract:
        known = {v.trial.key for v in self.verdicts}
        return Contract((*self.verdicts, *(v for v in verdicts if v.trial.key not in known)))

    def summary(self) -> str:
        if not self.verdicts:
            return ""
        out = [f"{len(self.admitted)} of {len(self.verdicts)} added inputs hold on the original"]
        counts: dict[str, int] = {}
        for v in self.excluded:
            counts[v.exclusion or ""] = counts.get(v.exclusion or "", 0) + 1
        words = {"wrong": "wrong", "narrow": "only narrowly right", "raises": "raises",
                 "cuda-error": "a CUDA error", "crash": "a crash", "hangs": "does not finish",
                 "memory": "too large for the free memory",
                 "untried": "not tried"}
        if counts:
            out.append("left out: " + ", ".join(f"{counts[k]} {words[k]}" for k in EXCLUSIONS
                                                if k in counts))
        return "; ".join(out)


def admitted(contract: Contract, trials: Sequence[Trial],
             run: Callable[[Sequence[Trial]], JobResult]) -> Contract:
    """`contract` with a verdict on each of `trials` it had none for: `run` tries them
    on the original (`device.contract`). Where the original takes the worker down, the
    trial it was on is left out and the others are tried again, in a fresh worker."""
    wanted = {t.key: t for t in trials}.values()
    todo = [t for t in wanted if not contract.of([t]).verdicts]
    while todo:
        verdicts, todo = judged(todo, run(todo))
        contract = contract.plus(verdicts)
    return contract


def judged(todo: Sequence[Trial], job: JobResult) -> tuple[list[Verdict], list[Trial]]:
    """The verdicts one contract job gave on `todo`, and the trials still to try.

    A job that answered judged its first trials (all of them, unless a sticky CUDA
    error ended it early). A job whose worker died or hung said last which trial it was
    on: that one leaves the contract, the others are tried again. A job that died
    before its first trial (the original would not load) leaves them all untried.
    """
    if job.ok and job.value is not None:
        verdicts = [Verdict.from_json(v) for v in job.value.get("verdicts", [])]
        return verdicts, list(todo[len(verdicts):])
    index = _announced(job.output_tail)
    if index is None or index >= len(todo):
        return [Verdict(t, "untried", job.reason) for t in todo], []
    exclusion: Exclusion = "hangs" if job.status == "timeout" else \
        "raises" if job.status == "error" else \
        "cuda-error" if job.kind in CUDA_KINDS else "crash"
    culprit = Verdict(todo[index], exclusion, f"the worker {job.reason}")
    return [culprit], [*todo[:index], *todo[index + 1:]]


def _announced(tail: str) -> int | None:
    """The index of the last trial the job said it was trying (`device.contract`)."""
    found = re.findall(r"^kfbot contract: trying (\d+)$", tail, re.MULTILINE)
    return int(found[-1]) if found else None


def with_contract(result: Evaluation, steps: Sequence[StepReport], comparison: StepReport,
                  contract: Contract) -> Evaluation:
    """The baseline with the contract's findings about the original, and its comparison
    step saying how many added inputs the original holds to."""
    if contract.verdicts:
        comparison = replace(comparison, summary=f"{comparison.summary}; {contract.summary()}",
                             evidence="\n".join(f.reason for f in contract.findings()))
    return replace(result, findings=(*result.findings, *contract.findings()),
                   steps=(*steps, comparison))


def lenient_findings(records: Iterable[Mapping[str, Any]]) -> list[Finding]:
    """Where the repository's own comparison accepted an output that kfbot's stricter one
    would not have (`device.lenient`): one warning per kind of difference."""
    said = sorted({str(r["lenient"]) for r in records if r.get("lenient")})
    return [Finding("as-the-test-compares", "runtime", "warn",
                    f"kfbot's own comparison is stricter than the test's: {note}",
                    "compared as the repository's test compares")
            for note in said]


def standard_trials(signatures: Sequence[CallSignature], block: int | None) -> list[Trial]:
    """The inputs every candidate is checked on besides the captured calls: edge shapes
    (size 1, odd, not a multiple of the block), each captured shape scaled up, and one
    large shape."""
    trials = []
    for sig in signatures[:_EDGE_SOURCES]:
        trials += [_trial("edge", "edge", v, sig) for v in edge_signatures(sig, block)]
    for sig in signatures:
        trials += [_trial(f"x{f}", f"x{f}", v, sig) for f, v in scaled_signatures(sig)]
    large = large_signature(signatures[0]) if signatures else None
    if large is not None:
        trials.append(_trial("large", "large", large, signatures[0]))
    return _unique(trials)


def size_trials(signatures: Sequence[CallSignature], sizes: Sequence[int]) -> list[Trial]:
    """Inputs of the sizes a candidate newly compares a size with (`anticheat.sizes`)."""
    trials = [_trial(COMPARED_SIZE, COMPARED_SIZE, v, sig)
              for sig in signatures[:_EDGE_SOURCES]
              for v in literal_signatures(sig, tuple(sizes))]
    return _unique(trials)


def _trial(kind: str, prefix: str, variant: CallSignature, source: CallSignature) -> Trial:
    # The variant keeps the tests and the wrapper of the call it varies: a reference
    # written over the wrapper's arguments still applies to it.
    sig = replace(variant, tests=source.tests, via=source.via)
    return Trial(kind, f"{prefix} {shape_label(sig)}", sig)


def _unique(trials: Sequence[Trial]) -> list[Trial]:
    seen: dict[tuple[str, str], Trial] = {}
    for t in trials:
        seen.setdefault(t.key, t)
    return list(seen.values())


def shape_label(sig: CallSignature) -> str:
    """`(64, 96) x (96,) float32`: the shapes of the tensor arguments and their dtypes."""
    shapes = [str(tuple(a.shape)) for a in sig.args if hasattr(a, "shape")]
    dtypes = sorted({a.dtype for a in sig.args if hasattr(a, "dtype")})
    return f"{' x '.join(shapes) or 'scalars'} {'/'.join(dtypes)}".strip()


_ELEMENT_BYTES = {"float64": 8, "int64": 8, "complex64": 8, "complex128": 16, "float32": 4,
                  "int32": 4, "float16": 2, "bfloat16": 2, "int16": 2}


def estimated_bytes(sig: CallSignature) -> int:
    """What trying the call takes on the device, at least: its inputs, the copy each
    call gets, an output as large as the largest input, and the reference's float64
    copy of the floating inputs and of that output."""
    sizes = [(t.numel * _ELEMENT_BYTES.get(t.dtype, 1), t.dtype) for t in sig.tensors()]
    inputs = sum(n for n, _ in sizes)
    largest = max((n for n, _ in sizes), default=0)
    floating = sum(n * 8 // _ELEMENT_BYTES.get(d, 8) for n, d in sizes
                   if d.startswith(("float", "bfloat")))
    return 2 * inputs + largest + floating + 2 * largest


def unverified_sizes(result: Evaluation, sizes: Sequence[int],
                     inputs: Sequence[str]) -> Evaluation:
    """A candidate that compares a size with a number is verified at that number where
    inputs of that size fit; where none did, its report says so rather than let the
    `size-literal` warning promise a check that did not run."""
    if not sizes or any(label.startswith(COMPARED_SIZE) for label in inputs):
        return result
    said = ", ".join(str(v) for v in sizes)
    return replace(result, findings=(*result.findings, Finding(
        "size-literal", "runtime", "warn", f"not verified at the sizes the candidate compares "
        f"with ({said}): inputs with a dimension that large exceed the verification limit",
        f"verified on {len(inputs)} other input sets")))
