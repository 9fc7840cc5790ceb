"""From a kernel's launches to the bindings that reach them, with the way there.

For each launch, the host functions that reach its launcher (`cpp_graph`), and among
them the ones a binding names: each such binding reaches the kernel along a path of
calls, every call under its conditions. The paths give the C++ part of the chains
`scan --explain` prints and the kernels an op chooses between (`dispatch`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kfbot.scan.link.cpp_graph import Edge, path
from kfbot.scan.link.join import Linker
from kfbot.scan.model import Binding, KernelDef, LaunchSite, Step


@dataclass(frozen=True)
class BoundPath:
    """`binding` reaches `site` through the calls `edges` (from its function down)."""

    binding: Binding
    function: str  # the bound host function the path starts at
    edges: tuple[Edge, ...]
    site: LaunchSite

    @property
    def conditions(self) -> tuple[str, ...]:
        return tuple(c for e in self.edges for c in e.conditions) + self.site.conditions

    def steps(self, kernel: KernelDef) -> tuple[Step, ...]:
        out = [Step("binding", f"{self.binding.module}.{self.binding.name} -> {self.function}",
                    self.binding.file, self.binding.line)]
        out += [Step("host", f"{e.caller} calls {e.callee}", e.file, e.line) for e in self.edges]
        out.append(Step("launch", f"{self.site.host_function or '?'} launches "
                                  f"{self.site.kernel}", self.site.file, self.site.line))
        out.append(Step("kernel", kernel.qualified_name, kernel.file, kernel.line))
        return tuple(out)


class Reach:
    """Which bindings reach which launches, for every kernel of one linking."""

    def __init__(self, linker: Linker, bindings: list[Binding]) -> None:
        self.linker = linker
        self.by_function: dict[str, list[Binding]] = defaultdict(list)
        for b in bindings:
            for fn in dict.fromkeys(linker.bound_functions(b)):
                self.by_function[fn].append(b)
        self._reach: dict[str, dict[str, Edge | None]] = {}

    def paths(self, sites: tuple[LaunchSite, ...]) -> list[BoundPath]:
        """One path per binding that reaches any of the launches, the shortest first."""
        found: dict[Binding, BoundPath] = {}
        for site in sites:
            if site.host_function is None:
                continue
            reached = self._reached(site.host_function)
            for fn in reached:  # nearest first
                for b in self.by_function.get(fn, ()):
                    if b in found or not self.linker.related(b.file, site.file):
                        continue
                    found[b] = BoundPath(b, fn, tuple(path(reached, fn)), site)
        return sorted(found.values(), key=lambda p: (len(p.edges), p.binding.file,
                                                     p.binding.line))

    def _reached(self, launcher: str) -> dict[str, Edge | None]:
        found = self._reach.get(launcher)
        if found is None:
            found = self._reach[launcher] = self.linker.graph.reach([launcher])
        return found
