"""The repository's C++ call graph: which host functions reach which launchers.

A call is resolved the way a C++ reader looks a name up: from inside `a::b`, `launch`
is `a::b::launch`, else `a::launch`, else `launch`, else a `using namespace`'s; the
innermost scope that defines the name wins, so five ops that each have a `launch` in
their own namespace stay apart. Among names equally near, overloads that cannot take
the call's number of arguments are dropped. A call that no scope resolves falls back
to the one function of that name in the repository, if there is exactly one.

Functions are the nodes, by qualified name (overloads share a node); an edge keeps
where it is written and the conditions it is under, for the chains `scan --explain`
prints and for the kernels an op chooses between.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from kfbot.scan.model import CudaFileFacts, HostCall, HostFunction

MAX_CALL_DEPTH = 10


@dataclass(frozen=True)
class Edge:
    """`caller` calls (or hands over) `callee`, at file:line, under `conditions`."""

    caller: str
    callee: str
    file: str
    line: int
    conditions: tuple[str, ...]


def lookup_names(name: str, scope: str, using: Iterable[str] = ()) -> list[list[str]]:
    """The qualified names `name` can mean from inside `scope`, nearest first, grouped
    by how near they are (the names of one group are equally near)."""
    if name.startswith("::"):
        return [[name[2:]]]
    parts = scope.split("::") if scope else []
    groups = [["::".join([*parts[:i], name])] for i in range(len(parts), -1, -1)]
    extra = [f"{u}::{name}" for u in using]
    return groups + ([extra] if extra else [])


class CallGraph:
    def __init__(self, cuda: list[CudaFileFacts]) -> None:
        self.defined: dict[str, list[HostFunction]] = defaultdict(list)
        self.by_last: dict[str, list[str]] = defaultdict(list)
        for facts in cuda:
            for fn in facts.functions:
                if fn.name not in self.defined:
                    self.by_last[fn.name.rsplit("::", 1)[-1]].append(fn.name)
                self.defined[fn.name].append(fn)
        self.using = {f.file: f.using_namespaces for f in cuda if f.using_namespaces}
        self._resolved: dict[tuple[str, str, str, int, bool], list[str]] = {}
        self.callers: dict[str, list[Edge]] = defaultdict(list)
        for facts in cuda:
            for call in facts.host_calls:
                self._add(facts.file, call)

    def _add(self, file: str, call: HostCall) -> None:
        for callee in self.resolve(call.callee, call.scope, file, call.arity,
                                   anywhere=not call.bare):
            if callee != call.caller:
                self.callers[callee].append(
                    Edge(call.caller, callee, file, call.line, call.conditions))

    def resolve(self, name: str, scope: str, file: str, arity: int = -1,
                anywhere: bool = True) -> list[str]:
        """The defined functions a call of `name` from `scope` in `file` means; with
        `anywhere`, the one function of that name in the repository as a last resort."""
        # The same names are called from the same scopes again and again; files matter
        # only through their using-namespaces.
        key = (name, scope, file if file in self.using else "", arity, anywhere)
        found = self._resolved.get(key)
        if found is None:
            found = self._resolved[key] = self._resolve(name, scope, file, arity, anywhere)
        return found

    def _resolve(self, name: str, scope: str, file: str, arity: int,
                 anywhere: bool) -> list[str]:
        for group in lookup_names(name, scope, self.using.get(file, ())):
            found = [n for n in group if n in self.defined]
            if found:
                return self._fitting(found, arity) or found
        if not anywhere:
            return []
        last = name.rsplit("::", 1)[-1]
        suffix = "::" + name.lstrip(":")
        named = [n for n in self.by_last.get(last, ())
                 if n == name.lstrip(":") or n.endswith(suffix)]
        named = self._fitting(named, arity) or named
        return named if len(named) == 1 else []

    def _fitting(self, names: list[str], arity: int) -> list[str]:
        if arity < 0:
            return names
        return [n for n in names
                if any(f.required <= arity <= len(f.params) for f in self.defined[n])]

    def reach(self, launchers: Iterable[str]) -> dict[str, Edge | None]:
        """Every function that reaches one of `launchers`, each with the edge it takes
        one step towards it (None for a launcher itself): nearest first."""
        reached: dict[str, Edge | None] = {name: None for name in launchers}
        frontier = list(reached)
        for _ in range(MAX_CALL_DEPTH):
            nxt = []
            for callee in frontier:
                for edge in self.callers.get(callee, ()):
                    if edge.caller not in reached:
                        reached[edge.caller] = edge
                        nxt.append(edge.caller)
            if not nxt:
                break
            frontier = nxt
        return reached


def path(reached: dict[str, Edge | None], start: str) -> list[Edge]:
    """The edges from `start` down to a launcher, following `reach`'s steps."""
    out: list[Edge] = []
    at = start
    while (edge := reached.get(at)) is not None and len(out) <= MAX_CALL_DEPTH:
        out.append(edge)
        at = edge.callee
    return out
