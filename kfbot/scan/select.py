"""Naming kernels on the command line: `name`, `ns::name`, `file::name` or the full id."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from kfbot.errors import KfbotError
from kfbot.scan.model import Kernel
from kfbot.text import shown

LISTED = 20  # kernel names an unknown name's error lists before it says how many more


def find_kernels(kernels: Sequence[Kernel], spec: str) -> list[Kernel]:
    """Every kernel the spec names; more than one means the spec is ambiguous."""
    spec = spec.strip()
    exact = [k for k in kernels if k.id == spec]
    if exact:
        return exact
    if "::" in spec:
        head, _, tail = spec.partition("::")
        by_file = [k for k in kernels if k.file == head and _name_matches(k, tail)]
        if by_file:
            return by_file
        return [k for k in kernels if k.definition.qualified_name == spec]
    return [k for k in kernels if k.name == spec]


def _name_matches(kernel: Kernel, name: str) -> bool:
    return name in (kernel.name, kernel.definition.qualified_name)


def select_kernel(kernels: Sequence[Kernel], spec: str, where: str = "") -> Kernel:
    """The one kernel `spec` names, or a KfbotError that lists what was meant."""
    found = find_kernels(kernels, spec)
    prefix = f"{where}: " if where else ""
    if len(found) == 1:
        return found[0]
    if found:
        ids = "\n  ".join(k.id for k in found)
        raise KfbotError(f"{prefix}kernel '{shown(spec)}' is ambiguous; name one of:\n  {ids}")
    raise KfbotError(f"{prefix}unknown kernel '{shown(spec)}'{_suggestions(kernels, spec)}")


def _suggestions(kernels: Sequence[Kernel], spec: str) -> str:
    names = sorted({k.name for k in kernels} | {k.id for k in kernels})
    close = difflib.get_close_matches(spec.rsplit("::", 1)[-1], names, n=5, cutoff=0.5)
    close += [n for n in difflib.get_close_matches(spec, names, n=3, cutoff=0.6)
              if n not in close]
    if close:
        return "; close matches: " + ", ".join(close)
    if not kernels:
        return "; the scan found no kernels"
    known = sorted({k.definition.qualified_name for k in kernels})
    more = f" and {len(known) - LISTED} more (`kfbot scan` lists them)" \
        if len(known) > LISTED else ""
    return f"; the kernels are: {', '.join(known[:LISTED])}{more}"
