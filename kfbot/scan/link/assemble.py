"""Build `Kernel` records from linked facts: one pass per kind of fact."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from kfbot.scan.cuda.facts import NUMBER
from kfbot.scan.link.dispatch import dispatches
from kfbot.scan.link.join import Linker, inline_bindings, torch_extension_module
from kfbot.scan.link.kernel_paths import BoundPath, Reach
from kfbot.scan.link.pairing import attach_references
from kfbot.scan.model import (
    Binding,
    BuildRecipe,
    CudaFileFacts,
    Kernel,
    KernelDef,
    LaunchSite,
    Tunable,
)


def assemble(linker: Linker) -> list[Kernel]:
    launches = _launches_by_kernel(linker)
    bindings = _all_bindings(linker)
    reach = Reach(linker, [b for b in bindings if b.cpp_function or b.reaches])
    schemas = [b for b in bindings if b.cpp_function is None and b.kind == "torch_library"]
    facts_by_file: dict[str, list[CudaFileFacts]] = defaultdict(list)
    for f in linker.cuda:
        facts_by_file[f.file].append(f)
    kernels = []
    paths: list[tuple[str, BoundPath]] = []
    by_kernel: dict[str, dict[Binding, BoundPath]] = {}
    for kdef in linker.kernels:
        sites = tuple(launches.get(kdef, ()))
        builds = _builds(linker, kdef, sites)
        bound = reach.paths(sites)
        kernel = Kernel(
            definition=kdef,
            launch_sites=sites,
            bindings=tuple(_with_schemas([p.binding for p in bound], schemas)),
            builds=tuple(builds),
            tunables=_tunables(linker, kdef, sites, builds, facts_by_file),
            editable_files=tuple(sorted({kdef.file, *(s.file for s in sites)})),
        )
        kernels.append(kernel)
        paths += [(kernel.id, p) for p in bound]
        by_kernel[kernel.id] = {p.binding: p for p in bound}
    chosen = dispatches(paths, linker.graph.defined)
    kernels = [replace(k, dispatch=tuple(chosen[k.id])) if k.id in chosen else k
               for k in kernels]
    return attach_references(linker, kernels, bindings, by_kernel)


def _launches_by_kernel(linker: Linker) -> dict[KernelDef, list[LaunchSite]]:
    out: dict[KernelDef, list[LaunchSite]] = defaultdict(list)
    for facts in [*linker.cuda, *linker.expanded]:
        for site in facts.launches:
            for kdef in linker.resolve_launch(site):
                out[kdef].append(site)
    return out


def _all_bindings(linker: Linker) -> list[Binding]:
    found = [b for f in linker.cuda for b in f.bindings] + inline_bindings(linker.builds)
    return [torch_extension_module(_aliased(linker, b), linker.builds_of(b.file))
            for b in found]


def _aliased(linker: Linker, binding: Binding) -> Binding:
    """`TORCH_LIBRARY_EXPAND(KFOPS_NAMESPACE, m)` registers the namespace the macro names."""
    value = linker.alias(binding.module, binding.file) if binding.module.isupper() else None
    return replace(binding, module=value) if value is not None else binding


def _builds(linker: Linker, kdef: KernelDef, sites: tuple[LaunchSite, ...]) -> list[BuildRecipe]:
    files = [kdef.file, *(s.file for s in sites)]
    seen: dict[tuple[str, int, str], BuildRecipe] = {}
    for f in files:
        for b in linker.builds_of(f):
            seen.setdefault((b.file, b.line, b.name), b)
    if not seen:  # none read: the repository's own build, where it has one
        own = linker.own_build(kdef.file)
        return [own] if own is not None else []
    return list(seen.values())


def _with_schemas(bound: list[Binding], schemas: list[Binding]) -> list[Binding]:
    """The bound functions, after the schemas (`m.def("op(Tensor x) -> Tensor")`) of
    the ops they implement."""
    ops = {(b.module, b.name) for b in bound}
    return [b for b in schemas if (b.module, b.name) in ops] + bound


def _tunables(linker: Linker, kdef: KernelDef, sites: tuple[LaunchSite, ...],
              builds: list[BuildRecipe], facts_by_file: dict[str, list[CudaFileFacts]]
              ) -> tuple[Tunable, ...]:
    uses = set(kdef.uses).union(*(s.uses for s in sites))
    files = set(linker.closure(kdef.file)).union(*(linker.closure(s.file) for s in sites))
    found = [t for f in sorted(files) for facts in facts_by_file.get(f, ())
             for t in facts.tunables if t.name in uses]
    found += _template_tunables(kdef, sites)
    found += _launch_tunables(sites)
    found += [Tunable(name=n, value=v, kind="build_flag", file=b.file, line=b.line,
                      origin=b.origin)
              for b in builds for n, v in b.defines if n in uses and NUMBER.match(v)]
    unique = {(t.name, t.kind, t.file, t.line): t for t in found}
    return tuple(unique.values())


def _template_tunables(kdef: KernelDef, sites: tuple[LaunchSite, ...]) -> list[Tunable]:
    out = []
    for i, tp in enumerate(kdef.template_params):
        if tp.kind != "value":
            continue
        seen = sorted({s.template_args[i] for s in sites if len(s.template_args) > i},
                      key=_numeric_key)
        value = tp.default or (seen[0] if seen else "")
        out.append(Tunable(name=tp.name, value=value, kind="template_arg", file=kdef.file,
                           line=kdef.line, values_seen=tuple(seen)))
    return out


def _numeric_key(v: str) -> tuple[int, str]:
    return (int(v), v) if v.isdigit() else (1 << 62, v)


def _launch_tunables(sites: tuple[LaunchSite, ...]) -> list[Tunable]:
    out = []
    for s in sites:
        for part, value in (("block", s.block), ("shared_mem", s.shared_mem)):
            if value and NUMBER.match(value) and not (part == "shared_mem" and value == "0"):
                name = f"{s.host_function or '<file>'}:{part}"
                out.append(Tunable(name=name, value=value, kind="launch_config", file=s.file,
                                   line=s.line))
    return out
