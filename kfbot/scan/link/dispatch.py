"""Ops that run one of several kernels, and what chooses between them.

An op reaches several kernels; where the paths to them pass through different branches
(an `if` on an argument, a `switch` on the dtype, a size test, an `#if`), the op
dispatches: each of those kernels gets a `Dispatch` naming the op, its sibling kernels,
the conditions on its own path and the op's arguments they read. Kernels an op reaches
with no condition on the way all run on every call: that is not a dispatch. A guard
that only skips an empty launch (`if (n > 0)`) chooses nothing and is left out; a
kernel left with no condition while a sibling has one is the op's default (it runs
when the siblings' conditions do not hold, e.g. after an early return).
"""

from __future__ import annotations

import re
from collections import defaultdict

from kfbot.scan.link.kernel_paths import BoundPath
from kfbot.scan.model import Dispatch, HostFunction

_WORD = re.compile(r"[A-Za-z_]\w*")
_DTYPE = re.compile(r"scalar_type|dtype|ScalarType|\bk(?:Float|Half|BFloat16|Double|Int|Long|"
                    r"Byte|Char|Bool|Float8\w*)\b|is_same|sizeof")
_GUARD = re.compile(r"^if \((?:[\w.\->]+(?:\(\))?) *(?:> *0|>= *1|!= *0)\)$")
_SIZE = re.compile(r"numel|\bsizes?\b|size\(|shape|\brows\b|\bcols\b|\blen(?:gth)?\b|\bn\b|"
                   r"\bN\b|\bcount\b|\bdim\(|stride|batch|seq_?len|hidden|% *\d|alignment|"
                   r"aligned|uintptr_t")


def kind_of(condition: str, arguments: set[str]) -> str:
    """What a condition tests: "preprocessor", "dtype", "size", "argument" or "other"."""
    if condition.startswith("#"):
        return "preprocessor"
    if _DTYPE.search(condition):
        return "dtype"
    if _SIZE.search(condition):
        return "size"
    if arguments & set(_WORD.findall(condition)):
        return "argument"
    return "other"


def dispatches(paths: list[tuple[str, BoundPath]],
               functions: dict[str, list[HostFunction]]) -> dict[str, list[Dispatch]]:
    """Per kernel id, the ops that choose it among others; `paths` pairs each kernel id
    with one path by which a binding reaches it."""
    by_op: dict[tuple[str, str], list[tuple[str, BoundPath]]] = defaultdict(list)
    for kernel, bound in paths:
        b = bound.binding
        by_op[(b.module, b.name)].append((kernel, bound))
    out: dict[str, list[Dispatch]] = defaultdict(list)
    for (module, name), reached in by_op.items():
        kernels = tuple(dict.fromkeys(k for k, _ in reached))
        choices = [(kernel, bound, _choosing(bound.conditions)) for kernel, bound in reached]
        if len(kernels) < 2 or not any(conditions for _, _, conditions in choices):
            continue
        for kernel, bound, conditions in choices:
            params = {p for f in functions.get(bound.function, ()) for p in f.params if p}
            read = _arguments(bound, params)
            where = _innermost(bound)
            out[kernel].append(Dispatch(
                op=f"{module}.{name}", kernels=kernels, conditions=conditions,
                arguments=read, by=tuple(kind_of(c, params) for c in conditions),
                file=where[0], line=where[1]))
    return out


def _choosing(conditions: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(c for c in conditions if not _GUARD.match(c))


def _arguments(bound: BoundPath, params: set[str]) -> tuple[str, ...]:
    """The bound function's parameters read by the conditions written in it."""
    own = [c for e in bound.edges if e.caller == bound.function
           for c in _choosing(e.conditions)]
    if not bound.edges:
        own += _choosing(bound.site.conditions)
    words = [w for c in own for w in _WORD.findall(c)]
    return tuple(dict.fromkeys(w for w in words if w in params))


def _innermost(bound: BoundPath) -> tuple[str, int]:
    if bound.site.conditions:
        return bound.site.file, bound.site.line
    conditional = [e for e in bound.edges if e.conditions]
    edge = conditional[-1] if conditional else None
    return (edge.file, edge.line) if edge is not None else (bound.site.file, bound.site.line)
