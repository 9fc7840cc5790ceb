"""`kfbot scan --explain <kernel>`: how the scan reached one kernel, or where it stopped.

For each reference: the chain from the test to the kernel, one line per link (test,
Python wrappers, binding, host calls, launch, kernel), each with file:line. Without a
reference: the first link that could not be followed, and the calls from tests into
the repository's Python code that reached no op, which is what a person reads when
pairing fails.
"""

from __future__ import annotations

from kfbot.scan.model import Kernel, ReferenceTest, ScanReport, Step

_SIGNALS = {"exception": "a mismatch raises", "exit_status": "a mismatch is the exit status",
            "printed": "a mismatch is only printed"}
_SHOWN = 8  # unfollowed calls listed


def explain(report: ScanReport, kernel: Kernel) -> str:
    lines = [*_summary(kernel), ""]
    for i, ref in enumerate(kernel.references, 1):
        lines += [*_reference(ref, i, len(kernel.references)), ""]
    if not kernel.references:
        lines += [*_unpaired(report, kernel), ""]
    for d in kernel.dispatch:
        siblings = ", ".join(k for k in d.kernels if k != kernel.id)
        when = " and ".join(f"`{c}`" for c in d.conditions) or "no other kernel's condition holds"
        lines.append(f"dispatch: op {d.op} runs this kernel when {when} ({d.file}:{d.line}"
                     f"{'; ' + ', '.join(d.by) if d.by else ''}); otherwise {siblings}")
    return "\n".join(lines).rstrip("\n") + "\n"


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


def _reference(ref: ReferenceTest, i: int, n: int) -> list[str]:
    how = _SIGNALS.get(ref.mismatch_signal, ref.mismatch_signal)
    head = (f"reference {i} of {n}: {ref.file}:{ref.line} {ref.test} ({ref.kind}, confidence "
            f"{ref.confidence:.2f}; {how})")
    out = [head, f"  why         {ref.why}"]
    if ref.helper:
        out.append(f"  compared by {ref.helper}")
    steps = ref.chain or (Step("test", f"{ref.test} calls {ref.op}", ref.file, ref.line),)
    width = max(len(f"{s.file}:{s.line}") for s in steps)
    out += [f"  {s.kind:<8}  {f'{s.file}:{s.line}':<{width}}  {s.name}" for s in steps]
    return out


def _unpaired(report: ScanReport, kernel: Kernel) -> list[str]:
    out = ["NO REFERENCE TEST. The first link the scan could not follow:"]
    out += [f"  {gap}" for gap in kernel.unpaired] or ["  (none recorded)"]
    related, other = _unfollowed(report, kernel)
    if related:
        out.append("Calls from tests that may be meant for this kernel but reached no op:")
        out += [f"  {u}" for u in related[:_SHOWN]]
    elif other:
        out.append(f"Calls from tests that reached no op ({len(other)}; none names this "
                   "kernel's op):")
        out += [f"  {u}" for u in other[:_SHOWN]]
    return out


def _unfollowed(report: ScanReport, kernel: Kernel) -> tuple[list[str], list[str]]:
    names = {b.name for b in kernel.bindings} | {kernel.name}
    related = [u for u in report.unfollowed if any(n in u for n in names)]
    return related, [u for u in report.unfollowed if u not in related]
