"""`kfbot scan --explain <kernel>`: how the scan reached one kernel, or where it stopped.

With observations from a GPU (`kfbot scan --observe`, kept per commit), the tests
seen launching the kernel, each with what its mutant showed, and the test files that
could not run.

For each reference: the chain from the test to the kernel, one line per link (test,
Python wrappers, binding, host calls, launch, kernel), each with file:line. References
whose chains differ only in the test are one chain, "and 4 more like it". Without a
reference: the first link that could not be followed, and the calls from tests into
the repository's Python code that reached no op, which is what a person reads when
pairing fails. Lines fit the terminal (kfbot.terminal).
"""

from __future__ import annotations

from kfbot.scan.model import Kernel, Observations, ReferenceTest, ScanReport, Step
from kfbot.scan.show.summary import compared, confidence_words
from kfbot.terminal import and_more, fitted, wrapped

_SIGNALS = {"exception": "a mismatch raises", "exit_status": "a mismatch is the exit status",
            "printed": "a mismatch is only printed"}
_SHOWN = 8  # unfollowed calls listed
_ALIKE = 3  # tests named for a chain that several share


def explain(report: ScanReport, kernel: Kernel, columns: int | None = None) -> str:
    lines = [*_summary(kernel), ""]
    groups = _alike(kernel.references)
    for i, (ref, others) in enumerate(groups, 1):
        lines += [*_reference(ref, i, len(groups), others, columns), ""]
    if not kernel.references:
        lines += [*_unpaired(report, kernel), ""]
    if report.observed is not None:
        lines += [*_observed(report.observed, kernel), ""]
    for d in kernel.dispatch:
        siblings = ", ".join(k for k in d.kernels if k != kernel.id)
        when = " and ".join(f"`{c}`" for c in d.conditions) or "no other kernel's condition holds"
        lines.append(f"dispatch: op {d.op} runs this kernel when {when} ({d.file}:{d.line}"
                     f"{'; ' + ', '.join(d.by) if d.by else ''}); otherwise {siblings}")
    return "\n".join(fitted(lines, columns)).rstrip("\n") + "\n"


def _summary(kernel: Kernel) -> list[str]:
    d = kernel.definition
    out = [f"{kernel.id}  ({d.file}:{d.line})"]
    extra = [*d.attributes, *(["extern \"C\""] if d.extern_c else []), *d.preprocessor]
    if extra:
        out.append(f"  declared    {', '.join(extra)}")
    for s in kernel.launch_sites or ():
        via = f" through macro {s.macro}" if s.macro else ""
        out.append(f"  launched    {s.file}:{s.line} in {s.host_function or 'file scope'}{via}")
    if not kernel.launch_sites:
        out.append("  launched    nowhere the scan could see")
    for b in kernel.bindings:
        fn = f" -> {b.cpp_function}" if b.cpp_function else " (schema)"
        out.append(f"  bound       {b.module}.{b.name}{fn} ({b.file}:{b.line})")
    for build in kernel.builds:
        out.append(f"  built       {build.kind} {build.name or build.file} "
                   f"({build.file}:{build.line})")
        out += [f"              cannot tell: {note}" for note in build.cannot_tell]
    return out


def _alike(refs: tuple[ReferenceTest, ...]) -> list[tuple[ReferenceTest, list[ReferenceTest]]]:
    """The references, those whose way from the op down to the kernel is the same as an
    earlier one's (tests of one op through one wrapper) kept with that one."""
    groups: dict[object, tuple[ReferenceTest, list[ReferenceTest]]] = {}
    for ref in refs:
        key = (ref.chain[1:], ref.kind, ref.mismatch_signal) if ref.chain else ref
        if key in groups:
            groups[key][1].append(ref)
        else:
            groups[key] = (ref, [])
    return list(groups.values())


def _reference(ref: ReferenceTest, i: int, n: int, others: list[ReferenceTest],
               columns: int | None) -> list[str]:
    how = _SIGNALS.get(ref.mismatch_signal, ref.mismatch_signal)
    head = (f"reference {i} of {n}: {ref.file}:{ref.line} {ref.test} ({ref.kind}; "
            f"{confidence_words(ref, signal=False)}; {how})")
    out = [head, f"  compares    {compared(ref)}", f"  why         {ref.why}"]
    if ref.helper:
        out.append(f"  compared by {ref.helper}")
    steps = ref.chain or (Step("test", f"{ref.test} calls {ref.op}", ref.file, ref.line),)
    width = max(len(f"{s.file}:{s.line}") for s in steps)
    # A link's name, wrapped, goes on under itself.
    hang = 8 + 2 + width + 2
    out += [line for s in steps for line in wrapped(
        f"  {s.kind:<8}  {f'{s.file}:{s.line}':<{width}}  {s.name}", columns, hang)]
    if others:
        named = [f"{r.file}:{r.line} {r.test}" for r in others]
        out.append(f"  the same way down from the op: {and_more(named[:_ALIKE], len(named))}")
    return out


def _observed(observed: Observations, kernel: Kernel) -> list[str]:
    """What running the tests on a GPU showed about this kernel."""
    out = [f"observed on a GPU at {observed.key} ({observed.tests_run} tests run"
           + (f"; {observed.note}" if observed.note else "") + "):"]
    out += [f"  {t.line()}" for t in kernel.observed] or ["  no test launched this kernel"]
    out += [f"  {line}" for line in observed.files]
    return out


def _unpaired(report: ScanReport, kernel: Kernel) -> list[str]:
    out = ["NO REFERENCE TEST. The first link the scan could not follow:"]
    out += [f"  {gap}" for gap in kernel.unpaired] or ["  (none recorded)"]
    related, other = _unfollowed(report, kernel)
    if related:
        out.append("Calls from tests that may be meant for this kernel but reached no op:")
        out += [f"  {u}" for u in related[:_SHOWN]]
        if len(related) > _SHOWN:
            out.append(f"  and {len(related) - _SHOWN} more like them")
    elif other:
        out.append(f"Calls from tests that reached no op ({len(other)}; none names this "
                   "kernel's op):")
        out += [f"  {u}" for u in other[:_SHOWN]]
        if len(other) > _SHOWN:
            out.append(f"  and {len(other) - _SHOWN} more like them")
    return out


def _unfollowed(report: ScanReport, kernel: Kernel) -> tuple[list[str], list[str]]:
    names = {b.name for b in kernel.bindings} | {kernel.name}
    related = [u for u in report.unfollowed if any(n in u for n in names)]
    return related, [u for u in report.unfollowed if u not in related]
