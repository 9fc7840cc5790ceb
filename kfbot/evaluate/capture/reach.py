"""Which captured calls reach the kernel under optimization.

One op may dispatch to several kernels: by an integer argument, by the dtype, by the
input size. A call that launches another kernel says nothing about this one, and
timing it would credit (or blame) a candidate for code it did not change. The worker
lists the kernels each captured signature launches on the original (the profiler
listing of the anti-cheating checks); this module keeps the signatures that launch the
kernel and says how many were dropped, and why.

This module never imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kfbot.evaluate.capture.signature import CallSignature


@dataclass(frozen=True)
class Reach:
    kept: tuple[CallSignature, ...]
    dropped: int
    others: tuple[str, ...]  # the kernels the dropped calls launched instead
    observed: bool  # the profiler saw kernels at all

    @property
    def none(self) -> bool:
        """No captured call launches the kernel (while the profiler saw others)."""
        return self.observed and not self.kept

    def summary(self, kernel: str) -> str:
        if not self.observed:
            return "the profiler saw no kernel launched by the captured calls: all are kept"
        others = ", ".join(self.others[:4]) or "no kernel"
        if self.none:
            return f"none of the captured calls launches {kernel}: they launch {others}"
        if not self.dropped:
            return f"all {len(self.kept)} launch {kernel}"
        return (f"kept {len(self.kept)} that launch {kernel}; dropped {self.dropped} that "
                f"launch {others} instead (the op chooses its kernel by its arguments)")


def split_by_launch(
    signatures: Sequence[CallSignature], launched: Sequence[Sequence[str]], kernel: str
) -> Reach:
    """`launched[i]`: the kernel names (identifiers) signature i launched."""
    observed = any(launched)
    if not observed:
        return Reach(tuple(signatures), 0, (), False)
    kept = [s for s, names in zip(signatures, launched, strict=True) if kernel in names]
    others = sorted({n for names in launched if kernel not in names for n in names})
    return Reach(tuple(kept), len(signatures) - len(kept), tuple(others), True)
