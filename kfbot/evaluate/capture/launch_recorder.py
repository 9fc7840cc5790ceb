"""Inside a test process under observation: what each test launched on the GPU.

The capture plugin (pytest) and the harness (scripts) start a `Recorder` when
`KFBOT_OBSERVE` asks for one. Around each test it runs torch's profiler (CUDA and CPU
activities) and, around each call of a recorded op, a profiler range
`kfbot.op:<op>`; when the test ends, each CUDA kernel is attributed to the innermost
range around the host call that launched it (the kernel's linked correlation id names
that call), and one `RunRecord` line is appended to the request's file.

With `poison`, every free block of the CUDA caching allocator is filled with NaN
before each test and before each recorded op call (`kfbot.evaluate.poison`): under the
mutant whose kernel writes nothing, its outputs then hold NaN rather than whatever an
earlier call left there, which could be the right answer.

torch is imported here only once a test runs (the tests have imported it by then).
"""

from __future__ import annotations

import contextlib
import site
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfbot.evaluate.capture.launches import Launch, ObserveRequest, Outcome, RunRecord, append

RANGE_PREFIX = "kfbot.op:"


@dataclass(frozen=True)
class HostEvent:
    """A host-side profiler event: an op or a range (`linked` 0), or a CUDA runtime
    call such as cudaLaunchKernel (`linked`: the op it was made in)."""

    correlation: int
    name: str
    start: int
    end: int
    thread: int
    linked: int = 0


@dataclass(frozen=True)
class KernelEvent:
    name: str
    linked: int  # the correlation id of the op (or range) that launched it
    correlation: int = 0  # shared with the runtime call that launched it


def attribute(kernels: Sequence[KernelEvent], host: Sequence[HostEvent]) -> tuple[Launch, ...]:
    """Each kernel with the innermost `kfbot.op:` range around the host event that
    launched it, counted; kernels launched outside every range have no op.

    The launching event is the op the kernel is linked to, else (where the profiler
    linked none) the runtime call that launched it, found by their shared id."""
    ops = {e.correlation: e for e in host if e.correlation > 0 and e.linked == 0}
    calls = {e.correlation: e for e in host if e.correlation > 0 and e.linked != 0}
    ranges = [e for e in host if e.name.startswith(RANGE_PREFIX)]
    counts: Counter[tuple[str, str | None]] = Counter()
    for kernel in kernels:
        origin = ops.get(kernel.linked) or calls.get(kernel.correlation)
        op = _innermost(origin, ranges) if origin is not None else None
        counts[(kernel.name, op)] += 1
    return tuple(Launch(name, op, n) for (name, op), n in counts.items())


def _innermost(event: HostEvent, ranges: Sequence[HostEvent]) -> str | None:
    around = [r for r in ranges if r.thread == event.thread and r.start <= event.start
              and event.end <= r.end]
    if not around:
        return None
    return max(around, key=lambda r: (r.start, -r.end)).name.removeprefix(RANGE_PREFIX)


class Recorder:
    """One process's observation: `start` and `stop` around each test, `op_range`
    around each recorded op call."""

    def __init__(self, request: ObserveRequest) -> None:
        self.request = request
        self._out = Path(request.out)
        self._profile: Any = None
        self._test = ""
        self._note = ""

    def start(self, test: str) -> None:
        self._test = test
        self._note = ""
        torch = _torch()
        if torch is None or not torch.cuda.is_available():
            self._note = "no CUDA device in the test process"
            return
        if self.request.poison:
            self._poison(0)
        if self.request.profile:
            self._profile = self._start_profiler()

    def _start_profiler(self) -> Any:
        from torch.profiler import ProfilerActivity, profile

        prof: Any = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        try:
            prof.__enter__()
        except RuntimeError as exc:  # another profiler is running (the test's own)
            self._note = f"the profiler did not start: {str(exc).splitlines()[0][:200]}"
            return None
        return prof

    def stop(self, outcome: Outcome) -> RunRecord:
        launches: tuple[Launch, ...] = ()
        prof, self._profile = self._profile, None
        if prof is not None:
            launches = self._launches(prof)
        record = RunRecord(self._test, outcome, launches, loaded_libraries(),
                            profiled=prof is not None, note=self._note)
        append(self._out, record)
        return record

    def _launches(self, prof: Any) -> tuple[Launch, ...]:
        torch = _torch()
        try:
            if torch is not None:
                torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            events = prof.profiler.kineto_results.events() if prof.profiler else []
        except RuntimeError as exc:  # a sticky CUDA error from the test: nothing to read
            self._note = f"the profile could not be read: {str(exc).splitlines()[0][:200]}"
            return ()
        kernels, host = [], []
        for e in events:
            if e.device_type().name == "CUDA":
                if _is_kernel(e.name()):
                    kernels.append(KernelEvent(e.name(), int(e.linked_correlation_id()),
                                               int(e.correlation_id())))
            else:
                host.append(HostEvent(int(e.correlation_id()), e.name(), int(e.start_ns()),
                                      int(e.end_ns()), int(e.start_thread_id()),
                                      int(e.linked_correlation_id())))
        return attribute(kernels, host)

    @contextlib.contextmanager
    def op_range(self, op: str, args: Sequence[object]) -> Iterator[None]:
        """Around one call of a recorded op."""
        if self.request.poison:
            self._poison(_input_bytes(args))
        if self._profile is None:
            yield
            return
        from torch.profiler import record_function

        with record_function(RANGE_PREFIX + op):
            yield

    def _poison(self, nbytes: int) -> None:
        torch = _torch()
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return
        from kfbot.evaluate.poison import POISON_NAN, poison

        poison(POISON_NAN, nbytes)


def _torch() -> Any:
    """torch, where the test process has it; imported at a test's start."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _is_kernel(name: str) -> bool:
    return not name.startswith(("Memcpy", "Memset", "cuda"))


def _input_bytes(args: Sequence[object]) -> int:
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


def loaded_libraries() -> tuple[tuple[str, str], ...]:
    """Extension modules loaded from outside the Python installation (the repository's
    builds, kfbot's staged builds, JIT builds), and libraries given to
    `torch.ops.load_library`, as (name, file)."""
    installed = tuple({sys.prefix, sys.base_prefix, *_site_packages()})
    found: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if file.endswith((".so", ".pyd")) and not file.startswith(installed):
            found[name] = file
    ops = sys.modules.get("torch._ops")
    for path in sorted(getattr(getattr(ops, "ops", None), "loaded_libraries", ()) or ()):
        found.setdefault(Path(path).name, str(path))
    return tuple(sorted(found.items()))


def _site_packages() -> list[str]:
    try:
        return [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:  # a virtualenv's old site module
        return []
