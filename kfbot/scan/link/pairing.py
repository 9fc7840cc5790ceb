"""Pair each reference test with the kernels its op reaches, and say why or why not.

A test that calls the repository's own Python code (`ReferenceTest.target`) is followed
through the modules (`graph`) to the ops it reaches, and each op to the bindings of
that name in that module; only where the call never leads into the repository's Python
code is an op matched by its name alone, at a lower confidence. Every pairing keeps the
whole chain, test to kernel: the Python steps, then the binding's path of calls down to
the launch (`kernel_paths`).

A kernel left without a reference gets the first link that could not be followed
(`Kernel.unpaired`): no launch, a launcher no binding reaches, an op no test calls.
"""

from __future__ import annotations

import posixpath
from collections import defaultdict
from collections.abc import Iterable

from kfbot.scan.link.join import Linker, match_reference, module_names
from kfbot.scan.link.kernel_paths import BoundPath
from kfbot.scan.model import Binding, Kernel, ReferenceTest, Step, evolve
from kfbot.scan.python.graph import PyGraph

Candidates = dict[str, list[tuple[Binding, set[str]]]]
Pair = tuple[Binding, ReferenceTest, tuple[Step, ...]]


def attach_references(linker: Linker, kernels: list[Kernel], bindings: list[Binding],
                      paths: dict[str, dict[Binding, BoundPath]]) -> list[Kernel]:
    # Grouped by op name: a reference only ever pairs with bindings of the name it calls.
    candidates: Candidates = defaultdict(list)
    for b in bindings:
        candidates[b.name].append((b, module_names(b, linker.builds_of(b.file))))
    # A kernel-builder package is named like its extension, which Python reaches only
    # through the package's generated `_ops`: the name is the package's, not an op's.
    packages = {b.name for b in linker.builds if b.kind == "kernel_builder"}
    extensions = ({b.name for b in linker.builds} | {b.module for b in bindings}) - packages
    graph = PyGraph(linker.python, linker.builds, extensions, linker.inventory)
    holders: dict[Binding, list[int]] = defaultdict(list)
    for i, k in enumerate(kernels):
        for b in k.bindings:
            holders[b].append(i)
    refs: dict[int, dict[tuple[str, int, str], ReferenceTest]] = defaultdict(dict)
    cpp_steps: dict[tuple[int, Binding], tuple[Step, ...]] = {}
    for facts in linker.python:
        for ref in facts.references:
            for binding, paired, steps in _pairs(ref, graph, candidates, linker.unfollowed):
                for i in holders.get(binding, ()):
                    key = (paired.file, paired.line, paired.op)
                    below = cpp_steps.get((i, binding))
                    if below is None:
                        bound = paths.get(kernels[i].id, {}).get(binding)
                        below = bound.steps(kernels[i].definition) if bound else ()
                        cpp_steps[(i, binding)] = below
                    old = refs[i].get(key)
                    chain = (_test_step(paired), *steps, *below)
                    if old is None or len(old.chain) < len(chain):  # the binding with a path
                        refs[i][key] = evolve(paired, chain=chain)
    linker.problems += graph.problems
    return [evolve(k, references=tuple(refs[i].values())) if i in refs
            else evolve(k, unpaired=_unpaired(k, paths.get(k.id, {})))
            for i, k in enumerate(kernels)]


def _pairs(ref: ReferenceTest, graph: PyGraph, candidates: Candidates,
           unfollowed: list[str]) -> list[Pair]:
    ref = _confirm_helper(ref, graph)
    if ref.target is None:
        return [(b, r, ()) for b, r in match_reference(ref, candidates.get(ref.op_name, []))]
    resolution = graph.resolve(ref.file, ref.target, ref.line, ref.backward)
    found: list[Pair] = []
    for end in resolution.endpoints:
        for b, modules in candidates.get(end.name, []):
            if end.module in modules or end.module.rsplit(".", 1)[-1] in modules:
                found.append((b, _through(ref, end.module, end.name, end.steps), end.steps))
    if found:
        return found
    by_name: list[Pair] = [(b, r, ()) for b, r in
                           match_reference(ref, candidates.get(ref.op_name, []))]
    if resolution.entered and resolution.dead_end is None:
        # Followed to its end through the repository's own Python code, the call reached
        # no binding: a binding of the op's name in a module the call does not name is a
        # CPU twin's namesake (or a pure-PyTorch version's), not what this test checks.
        by_name = [(b, r, steps) for b, r, steps in by_name if r is ref]
    if not by_name:
        unfollowed.append(_not_followed(ref, graph))
    return by_name


def summarised(unfollowed: list[str]) -> list[str]:
    """One line per call that reached no op, the calls of one name that stop at the same
    link counted on the first's line."""
    by_what: dict[str, list[str]] = {}
    for line in unfollowed:
        what = line.partition(": ")[2]
        by_what.setdefault(what.split(" calls ", 1)[-1], []).append(line)
    return [lines[0] + (f" (and {len(lines) - 1} more calls of it)" if len(lines) > 1 else "")
            for lines in by_what.values()]


def _not_followed(ref: ReferenceTest, graph: PyGraph) -> str:
    resolution = graph.resolve(ref.file, ref.target or "", ref.line, ref.backward)
    if resolution.dead_end is not None:
        return (f"{ref.file}:{ref.line}: {ref.test} calls {ref.target}; the first link not "
                f"followed: {resolution.dead_end}")
    ops = ", ".join(sorted({f"{e.module}.{e.name}" for e in resolution.endpoints})) or \
        "no op"
    return (f"{ref.file}:{ref.line}: {ref.test} calls {ref.target}, which reaches {ops}: no "
            "binding of that name and module was found")


def _through(ref: ReferenceTest, module: str, name: str,
             steps: tuple[Step, ...]) -> ReferenceTest:
    """The reference as pairing found it: the op reached, and a firmer confidence now
    that the way from the test to it is known."""
    via = " -> ".join(s.name for s in steps)
    why = f"{ref.why}; reaches {module}.{name}" + (f" through {via}" if via else "")
    return evolve(ref, op_name=name, module_hint=module, why=why,
                  confidence=round(min(ref.confidence + 0.1, 0.9), 2))


def _confirm_helper(ref: ReferenceTest, graph: PyGraph) -> ReferenceTest:
    """A comparison through a helper read elsewhere (`check` from a conftest fixture)
    keeps its confidence once the helper is seen to compare its arguments."""
    if ref.helper is None or "(" in ref.helper:
        return ref
    found = _compare_helper(ref, graph)
    if found is not None:
        return evolve(ref, helper=found)
    return evolve(ref, confidence=round(ref.confidence * 0.8, 2),
                   why=f"{ref.why} (`{ref.helper}` taken as a comparison by its name)")


def _compare_helper(ref: ReferenceTest, graph: PyGraph) -> str | None:
    name = ref.helper or ""
    folder = posixpath.dirname(ref.file)
    while True:
        conftest = posixpath.join(folder, "conftest.py") if folder else "conftest.py"
        symbol = graph.symbols.get(conftest, {}).get(name)
        if symbol is not None and _compares(graph, conftest, symbol.name, 0):
            return f"{name} ({conftest}:{symbol.line})"
        if not folder:
            return None
        folder = posixpath.dirname(folder)


def _compares(graph: PyGraph, file: str, name: str, depth: int) -> bool:
    """The function compares two of its arguments, or returns one that does (a fixture)."""
    symbol = graph.symbols.get(file, {}).get(name)
    if symbol is None or depth > 3:
        return False
    if symbol.compares is not None:
        return True
    own = posixpath.splitext(posixpath.basename(file))[0]
    return any(_compares(graph, file, target.rsplit(".", 1)[-1], depth + 1)
               for target, _ in symbol.targets if target.startswith(f".{own}."))


def _test_step(ref: ReferenceTest) -> Step:
    return Step("test", f"{ref.test} calls {ref.op}", ref.file, ref.line)


def _unpaired(kernel: Kernel, bound: dict[Binding, BoundPath]) -> tuple[str, ...]:
    d = kernel.definition
    if not kernel.launch_sites:
        return (f"{d.file}:{d.line}: no launch of {d.name} was found (neither <<<...>>>, "
                "cudaLaunchKernel, a function pointer nor a macro of the repository)",)
    if not kernel.bindings:
        return tuple(_unbound(kernel))
    ops = sorted({f"{b.module}.{b.name}" for b in kernel.bindings})
    where = [f"{b.file}:{b.line}" for b in bound] or [f"{kernel.bindings[0].file}:"
                                                        f"{kernel.bindings[0].line}"]
    return (f"{where[0]}: op {', '.join(ops)} reaches this kernel, but no test or script "
            "compares it with a reference (or they call it through code the scan could not "
            "follow: `kfbot scan --explain` lists those calls)",)


def _unbound(kernel: Kernel) -> Iterable[str]:
    for site in kernel.launch_sites[:3]:
        yield (f"{site.file}:{site.line}: {site.host_function or 'file-scope code'} "
               f"launches {kernel.name}, but no pybind11 def or TORCH_LIBRARY op reaches "
               f"{site.host_function or 'it'} through host calls")
