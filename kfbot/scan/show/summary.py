"""What a scan means for a person: how many kernels can be optimised, and why not the rest.

A kernel is ready to optimise when it is bound to Python (an op reaches it), built (kfbot
can tell how) and has a reference test; `kfbot optimize` needs all three. The rest are
counted by the first of those they lack, and the most common reason comes with what
fixes it: a `kfbot.yaml` task where one can, filled with this repository's own names.

Also the scan's words for its own facts: a reference as the expression it compares, its
confidence in words, and what tree-sitter could not understand, counted.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kfbot.scan.model import NOT_UNDERSTOOD, Kernel, Problem, ReferenceTest, ScanReport

# The reasons a kernel is not ready, in the order they are looked for.
NOT_BOUND = "not bound to Python"
NOT_BUILT = "no build recipe kfbot can read"
NO_REFERENCE = "no reference test"


@dataclass(frozen=True)
class Readiness:
    found: int
    bound: int
    built: int
    referenced: int
    ready: int
    # Each reason with its kernels, most common first.
    reasons: tuple[tuple[str, tuple[Kernel, ...]], ...]


def readiness(kernels: Sequence[Kernel]) -> Readiness:
    by_reason: dict[str, list[Kernel]] = {}
    for k in kernels:
        why = not_ready(k)
        if why is not None:
            by_reason.setdefault(why, []).append(k)
    order = (NOT_BOUND, NOT_BUILT, NO_REFERENCE)
    reasons = sorted(by_reason.items(), key=lambda item: (-len(item[1]), order.index(item[0])))
    return Readiness(
        found=len(kernels),
        bound=sum(1 for k in kernels if _bound(k)),
        built=sum(1 for k in kernels if k.builds),
        referenced=sum(1 for k in kernels if k.references),
        ready=sum(1 for k in kernels if not_ready(k) is None),
        reasons=tuple((why, tuple(ks)) for why, ks in reasons))


def not_ready(kernel: Kernel) -> str | None:
    """The first thing `kfbot optimize` would miss for this kernel; None when ready."""
    if not _bound(kernel):
        return NOT_BOUND
    if not kernel.builds:
        return NOT_BUILT
    if not kernel.references:
        return NO_REFERENCE
    return None


def _bound(kernel: Kernel) -> bool:
    return any(b.cpp_function is not None for b in kernel.bindings)


def summary_lines(report: ScanReport) -> list[str]:
    """The scan's last words: the counts, the most common reason for the rest and its fix,
    and how many places tree-sitter did not understand."""
    r = readiness(report.kernels)
    out = [f"{_count(r.found, 'kernel')} found: {r.bound} bound to Python, {r.built} built, "
           f"{r.referenced} with a reference test; {r.ready} ready to optimise."]
    if r.reasons:
        (why, kernels), rest = r.reasons[0], r.reasons[1:]
        others = r.found - r.ready
        if others == 1:
            share = "It" if r.found == 1 else "The other one"
        elif len(kernels) == others:
            share = f"All {others}" if others == r.found else f"All the other {others}"
        else:
            share = f"Of the other {others}, {len(kernels)}"
        out.append(f"{share} {_have(len(kernels), why)}. {_fix_words(why, kernels[0])}")
        out += [f"  {line}" for line in fix_snippet(why, kernels[0]).splitlines()]
        if rest:
            out.append("Then: " + "; ".join(f"{len(ks)} {_have(len(ks), w)}" for w, ks in rest)
                       + ".")
    unread = not_understood(report.problems)
    if unread:
        places, files = unread
        out.append(f"tree-sitter did not understand {_count(places, 'place')} in "
                   f"{_count(files, 'file')} (code it cannot read may still compile; the rest "
                   "of each file was read): `kfbot scan --json` lists them.")
    return out


def _have(n: int, why: str) -> str:
    if why == NOT_BOUND:
        return "is not bound to Python" if n == 1 else "are not bound to Python"
    verb = "has" if n == 1 else "have"
    return f"{verb} {why}"


def _fix_words(why: str, kernel: Kernel) -> str:
    if why == NOT_BOUND:
        return (f"No kfbot.yaml makes an op: `kfbot scan --explain {kernel.name}` shows where "
                "the way from Python stops (a binding the scan could not follow, or none).")
    if why == NOT_BUILT:
        return "A task in kfbot.yaml that says how to build each fixes it, e.g.:"
    return ("A task in kfbot.yaml with the op and a pure-PyTorch reference fixes it (the "
            "reference is a function you write), e.g.:")


def fix_snippet(why: str, kernel: Kernel) -> str:
    """The kfbot.yaml task that fixes `why` for `kernel`, with its real names; "" where
    no config can."""
    head = ["tasks:", f"  - name: {kernel.name}", f"    kernel: {kernel.id}"]
    if why == NOT_BUILT:
        module = next((b.module for b in kernel.bindings if b.kind == "pybind11"), None)
        sources = sorted({kernel.file, *(s.file for s in kernel.launch_sites),
                          *(b.file for b in kernel.bindings)})
        return "\n".join([*head, "    build:", "      kind: load",
                          f"      name: {module or kernel.name + '_ext'}",
                          f"      sources: [{', '.join(sources)}]"])
    if why == NO_REFERENCE:
        return "\n".join([*head, f'    op: "{op_ref(kernel)}"  # the Python callable that runs it',
                          '    reference: "tests.reference:op_reference"  # yours: pure PyTorch',
                          "    shapes: [[4096], [1024, 1024]]  # what the op really sees",
                          "    dtypes: [float32]"])
    return ""


def op_ref(kernel: Kernel) -> str:
    """`module:callable` that runs the kernel's op, as a task's `op:` names it: `torch.ops`
    for a registered op; for a `load()`, the Python module that loads it, through the name
    the loaded module is bound to or else a function of the op's name there (a wrapper,
    as loaders write them); the extension `setup.py` builds."""
    binding = next(b for b in kernel.bindings if b.cpp_function is not None)
    if binding.kind != "pybind11":
        return f"torch:ops.{binding.module}.{binding.name}"
    build = kernel.builds[0] if kernel.builds else None
    if build is not None and build.kind in ("load", "load_inline") and \
            build.file.endswith(".py"):
        module = posixpath.splitext(build.file)[0].replace("/", ".").removesuffix(".__init__")
        return f"{module}:{build.variable}.{binding.name}" if build.variable else \
            f"{module}:{binding.name}"
    return f"{build.name if build is not None else binding.module}:{binding.name}"


def not_understood(problems: Sequence[Problem]) -> tuple[int, int] | None:
    """(places, files) tree-sitter did not understand; None when it read everything."""
    counts = Counter[str]()
    for p in problems:
        if p.message.startswith(NOT_UNDERSTOOD):
            counts[p.file] += _places(p.message)
    return (sum(counts.values()), len(counts)) if counts else None


def _places(message: str) -> int:
    words = message.removeprefix(NOT_UNDERSTOOD).split()
    return int(words[0]) if words and words[0].isdigit() else 1


def _count(n: int, one: str) -> str:
    return f"{n} {one}{'' if n == 1 else 's'}"


# --- references in words ------------------------------------------------------------------


def compared(ref: ReferenceTest) -> str:
    """What the reference test compares, as written: `ext.softmax vs torch.softmax(x)`."""
    if ref.reference:
        return f"{ref.op} vs {ref.reference}"
    return f"{ref.op}, checked by {ref.comparison} against a value the scan could not read"


def confidence_words(ref: ReferenceTest, signal: bool = True) -> str:
    """How sure the pairing is, and on what it rests, in words; with `signal`, also when
    a mismatch does not raise."""
    if ref.origin == "declared":
        return "declared in the config"
    if ref.origin == "observed":
        return "observed on a GPU: its test fails when the kernel writes nothing"
    level = "sure" if ref.confidence >= 0.8 else "likely" if ref.confidence >= 0.5 else "a guess"
    basis = []
    if "matched by op name only" in ref.why:
        basis.append("matched by the op's name only")
    if "taken as a comparison by its name" in ref.why:
        basis.append(f"`{ref.helper}` taken for a comparison by its name")
    if signal and ref.mismatch_signal == "printed":
        basis.append("a mismatch is only printed")
    elif signal and ref.mismatch_signal == "exit_status":
        basis.append("a mismatch is the exit status")
    return f"{level}: {', '.join(basis)}" if basis else level
