"""The repository's own variants of the op: other ops of the same extension that its
tests hold to the same reference (`ops.softmax` and `ops.softmax_v2`, both compared
with `torch.softmax(x, dim=-1)`), found by scanning the repository again.

The committed candidate is shown beside the fastest of them at every shape: a search
that beats a naive kernel by 14x may still be slower than the repository's own tuned
one, and the report says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from kfbot.config import load_config
from kfbot.errors import KfbotError
from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.evaluation import ShapeTiming
from kfbot.evaluate.task import KernelTask, OpBinding, make_task
from kfbot.scan.scanner import scan


def variant_ops(task: KernelTask) -> list[OpBinding]:
    """Ops of the task's module, other than its own, whose references are its own."""
    mine = _references(task)
    if not mine:
        return []
    config = load_config(None, task.root)
    found: dict[str, OpBinding] = {}
    for kernel in scan(task.root, config).kernels:
        if kernel.name == task.kernel_name:
            continue
        try:
            other = make_task(kernel, task.root, config)
        except KfbotError:
            continue  # a kernel kfbot cannot evaluate is no variant it can time
        op = other.op
        if (op.kind, op.module) == (task.op.kind, task.op.module) and op.name != task.op.name \
                and _references(other) == mine:
            found.setdefault(op.name, op)
    return [found[name] for name in sorted(found)]


def _references(task: KernelTask) -> frozenset[str]:
    return frozenset(str(getattr(r, "source", "")) for r in task.references
                     if getattr(r, "source", ""))


def fastest_variant_us(timings: Sequence[ShapeTiming],
                       ratios: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per shape (its label), the fastest variant's time there, as the original's time
    in `timings` divided by the variant's measured speed relative to the original."""
    out = {}
    for t, found in zip(timings, ratios, strict=True):
        if found:
            out[t.input] = t.speedup.baseline.median / max(found.values())
    return out


def signatures_of(timings: Sequence[ShapeTiming]) -> list[CallSignature] | None:
    """The call signatures the shapes were timed with; None when one is not recorded."""
    out = []
    for t in timings:
        if t.signature is None:
            return None
        out.append(CallSignature.from_json(t.signature))
    return out


@runtime_checkable
class TimesVariants(Protocol):
    def time_variants(self, variants: Sequence[OpBinding], signatures: Sequence[CallSignature]
                      ) -> list[dict[str, float]] | str: ...


def variants_where_timed(engine: object, task: KernelTask,
                         timings: Sequence[ShapeTiming]) -> tuple[dict[str, float], str]:
    """(the fastest variant's time per shape, why there is none): the variants timed at
    the shapes of `timings` (captured and held out) on the engine's GPU."""
    if not isinstance(engine, TimesVariants):
        return {}, "the repository's variants are timed only on the local GPU"
    ops = variant_ops(task)
    if not ops:
        return {}, ""
    sigs = signatures_of(timings)
    if not sigs:
        return {}, "the repository's variants were not timed: the shapes' calls are not known"
    ratios = engine.time_variants(ops, sigs)
    if isinstance(ratios, str):
        return {}, ratios
    names = ", ".join(f"`{task.op.module}.{op.name}`" for op in ops)
    return fastest_variant_us(timings, ratios), f"the repository's variants timed: {names}"
