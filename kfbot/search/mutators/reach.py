"""Which tunables reach the kernel: the numbers the params mutator may change.

The scan lists every numeric constant a kernel's file or launcher mentions by name. A
value counts only where it flows into the target kernel: its body (and the helper device
functions it calls), its template arguments, or the grid, block and shared memory of
its launches, followed through the launcher's locals (`const int threads = cols >= 1024
? 1024 : 256;`, `int block = min(cols, 1024);`, a `constexpr` in the launcher). A
constant declared inside a function that neither is the kernel, calls it from a launch,
nor is called by it never reaches it, whatever its name.

A conditional on a size in the launcher becomes tunables of its own: each branch's
block size and the size where the choice switches. A block that comes from something
kfbot cannot trace to a number in the source (a launcher's parameter, a field of a
runtime config, a call such as `x.size(1)`) makes the launch's tunables untraceable:
they are not proposed, and the plan says why.

A template argument written as a literal at the launch (`row_absmax_kernel<T, 128>
<<<(rows + 127) / 128, 128>>>`) is one knob with the launch's block and grid where they
repeat it: changed alone, the kernel's idea of its block would no longer match the
block it runs in. A constant that sizes a `__shared__` array and flows into no launch
(`__shared__ float smem[MAX_THREADS]`) is a capacity, not a block size: it is left as
it is, and the plan says so.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from kfbot.scan.model import Tunable
from kfbot.search.mutators.params import NUMBER, Knob, knobs
from kfbot.search.rewrites import cuda_text
from kfbot.search.rewrites import syntax as sx

MAX_DEPTH = 6  # locals followed through locals, this deep at most
_MINMAX = ("min", "max", "std::min", "std::max", "umin", "umax")
_CUDA_FILES = (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp", ".cxx")


@dataclass(frozen=True)
class Reach:
    knobs: tuple[Knob, ...]
    notes: tuple[str, ...]  # for the plan: tunables left out and why


@dataclass
class _Flow:
    names: set[str]  # identifiers that reach the kernel
    functions: set[tuple[str, int, int]]  # (file, first line, last line) of those that reach
    launch_lines: set[tuple[str, int]]
    extra: list[Knob]  # conditional and min/max launch values
    untraceable: list[str]
    all_functions: list[tuple[str, int, int]]  # every function of the files followed
    launches: list[tuple[str, sx.Node]] = field(default_factory=list)
    launch_names: set[str] = field(default_factory=set)  # identifiers in launch configs
    shared_sizes: dict[str, str] = field(default_factory=dict)  # size name -> array
    kernels: list[sx.Node] = field(default_factory=list)


def reaching_knobs(files: Mapping[str, str], editable: Sequence[str], kernel: str,
                   tunables: Sequence[Tunable], shared: Collection[str] = ()) -> Reach:
    """The knobs of `tunables` (and of the launcher's conditionals) that reach `kernel`."""
    flow = _flow(files, editable, kernel.rsplit("::", 1)[-1])
    if flow is None:  # no CUDA text to follow (a kernel in a Python string): as scanned
        return Reach(tuple(knobs(tunables, shared)), ())
    kept: list[Tunable] = []
    notes: list[str] = []
    tied: list[Knob] = []
    for t in tunables:
        why = _why_not(t, flow)
        together = _tied_knobs(t, flow) if why is None and t.kind == "template_arg" else []
        if together:
            tied += together
            lines = ", ".join(str(k.line) for k in together)
            notes.append(f"{t.name} ({t.kind}, {t.file}:{t.line}) is tuned at its launch "
                         f"(line {lines}) as one knob with the block and grid that repeat it")
        elif why is None:
            kept.append(t)
        else:
            notes.append(f"{t.name} ({t.kind}, {t.file}:{t.line}) left out: {why}")
    at_tied = {(k.file, k.line) for k in tied}
    found = [k for k in knobs(kept, shared)
             if not (k.kind == "launch_config" and (k.file, k.line) in at_tied)] + tied
    if flow.untraceable:
        found = [k for k in found if k.kind not in ("launch_config", "launch_tied")]
        notes += flow.untraceable
    else:
        taken = {(k.file, k.line) for k in found}
        found += [k for k in flow.extra if (k.file, k.line) not in taken]
    return Reach(tuple(sorted(found, key=lambda k: (k.file, k.line, k.name))),
                 tuple(dict.fromkeys(notes)))


def _why_not(t: Tunable, flow: _Flow) -> str | None:
    if t.kind == "template_arg":
        return None
    if t.kind == "launch_config":
        return None if (t.file, t.line) in flow.launch_lines else \
            "not a launch of this kernel"
    bare = t.name.rsplit(":", 1)[-1]
    if bare not in flow.names:
        return "its value flows neither into the kernel nor into its launches"
    if bare in flow.shared_sizes and bare not in flow.launch_names:
        return (f"it sizes the shared array `{flow.shared_sizes[bare]}` and no launch: a "
                "capacity the blocks must fit in, not a block size")
    owner = _function_at(flow, t.file, t.line)
    if owner is False:
        return "declared in a function that neither launches the kernel nor is called by it"
    return None


def _function_at(flow: _Flow, file: str, line: int) -> bool | None:
    """True: inside a reaching function; False: inside another; None: at file scope or in
    a file not followed."""
    inside = [f for f in flow.all_functions if f[0] == file and f[1] <= line <= f[2]]
    if not inside:
        return None
    return any(f in flow.functions for f in inside)


def _flow(files: Mapping[str, str], editable: Sequence[str], name: str) -> _Flow | None:
    flow = _Flow(set(), set(), set(), [], [], [])
    seen_kernel = False
    for path in editable:
        if path not in files or not path.endswith(_CUDA_FILES):
            continue
        code = cuda_text(path, files[path])
        if code is None:
            continue
        root = sx.parse(code)
        flow.all_functions += [(path, fn.start_point[0] + 1, fn.end_point[0] + 1)
                  for fn in sx.functions(root, "(function_definition) @fn")]
        for fn in sx.kernels_named(root, name):
            seen_kernel = True
            flow.kernels.append(fn)
            for reached in _with_helpers(root, fn):
                flow.functions.add(_span(path, reached))
                flow.names |= sx.identifiers(reached)
                top = sx.definition(reached)
                flow.names |= sx.identifiers(top)
                flow.shared_sizes.update(_shared_sizes(reached))
        for launch in sx.launches(root, name):
            flow.launches.append((path, launch))
            _follow_launch(path, launch, flow)
            flow.launch_names |= _config_names(launch)
    return flow if seen_kernel else None


def _span(path: str, fn: sx.Node) -> tuple[str, int, int]:
    return path, fn.start_point[0] + 1, fn.end_point[0] + 1


def _with_helpers(root: sx.Node, kernel: sx.Node) -> list[sx.Node]:
    """The kernel and the device functions it calls, transitively."""
    helpers = {sx.fn_name(fn): fn for fn in sx.functions(root, sx.DEVICE_FN)}
    out, todo = [kernel], [kernel]
    while todo:
        fn = todo.pop()
        for node in sx.walk(fn):
            if node.type == "call_expression":
                callee = helpers.get(sx.text(sx.field(node, "function")))
                if callee is not None and callee not in out:
                    out.append(callee)
                    todo.append(callee)
    return out


def _follow_launch(path: str, launch: sx.Node, flow: _Flow) -> None:
    flow.launch_lines.add((path, launch.start_point[0] + 1))
    fn = sx.enclosing_function(launch)
    if fn is not None:
        flow.functions.add(_span(path, fn))
    config = sx.named(launch)
    call = launch.parent
    function = sx.field(call, "function") if call is not None else None
    if function is not None and function.type == "template_function":
        targs = sx.field(function, "arguments")
        if targs is not None:
            _follow(targs, fn, flow, 0)
    for i, part in enumerate(config[:3]):
        if i == 1:
            _follow_block(path, part, fn, flow)
        else:
            _follow(part, fn, flow, 0)


def _follow(expr: sx.Node, fn: sx.Node | None, flow: _Flow, depth: int) -> None:
    for ident in [n for n in sx.walk(expr) if n.type == "identifier"]:
        name = sx.text(ident)
        if name in flow.names:
            continue
        flow.names.add(name)
        init = sx.local_init(ident, name) if fn is not None and depth < MAX_DEPTH else None
        if init is not None:
            _follow(init, fn, flow, depth + 1)


def _follow_block(path: str, block: sx.Node, fn: sx.Node | None, flow: _Flow) -> None:
    """The block's flow, its conditionals and min/max made knobs, or why it is
    untraceable."""
    _follow(block, fn, flow, 0)
    if fn is None:
        return
    source = _source_of(block, fn, 0)
    if isinstance(source, str):
        flow.untraceable.append(
            f"the block size of {sx.fn_name(fn) or 'the launch'}'s launch "
            f"(line {block.start_point[0] + 1}) comes from {source}, a value kfbot cannot "
            "trace to a number in the source: its launch tunables are not proposed")
        return
    if source is not None:
        flow.extra += _choice_knobs(path, fn, source)


def _source_of(expr: sx.Node, fn: sx.Node, depth: int) -> sx.Node | str | None:
    """The conditional or min/max the block comes from (a node), what makes it
    untraceable (a string), or None (a number, a constant or an expression of them)."""
    expr = sx.strip(expr)
    if expr.type in ("conditional_expression",) or _minmax(expr):
        return expr
    if expr.type in ("field_expression", "subscript_expression"):
        return f"`{sx.text(expr)}`"
    if expr.type == "call_expression":
        callee = sx.text(sx.field(expr, "function"))
        if callee != "dim3":
            return f"`{sx.text(expr)}`"
    if expr.type == "identifier":
        name = sx.text(expr)
        if name in _param_names(fn):
            return f"`{name}`, a parameter of {sx.fn_name(fn)}"
        init = sx.local_init(expr, name) if depth < MAX_DEPTH else None
        if init is not None:
            return _source_of(init, fn, depth + 1)
    if expr.type in ("call_expression", "binary_expression", "argument_list"):
        for child in sx.named(expr):
            found = _source_of(child, fn, depth + 1) if child.type != "identifier" \
                or sx.text(child) != "dim3" else None
            if found is not None:
                return found
    return None


def _param_names(fn: sx.Node) -> set[str]:
    return {sx.param_name(p) for p in sx.params(fn)}


def _minmax(expr: sx.Node) -> bool:
    return expr.type == "call_expression" and sx.text(sx.field(expr, "function")) in _MINMAX


def _choice_knobs(path: str, fn: sx.Node, expr: sx.Node) -> list[Knob]:
    """Knobs for the number literals of a conditional's branches and the size it compares
    with, or of a min/max's bounds: each edited by its place among the line's numbers."""
    line = expr.start_point[0] + 1
    if expr.end_point[0] != expr.start_point[0]:
        return []  # the literal of a knob is found on its line
    src = fn.text or b""
    row = src.split(b"\n")[expr.start_point[0] - fn.start_point[0]].decode(errors="replace")
    where = sx.fn_name(fn) or "<file>"
    out: list[Knob] = []
    if expr.type == "conditional_expression":
        cond = sx.field(expr, "condition")
        roles = [(sx.field(expr, "consequence"), "block if true"),
                 (sx.field(expr, "alternative"), "block otherwise")]
        threshold = [n for n in sx.walk(cond) if n.type == "number_literal"] if cond else []
        if len(threshold) == 1:
            roles.append((threshold[0], f"switches at {sx.text(cond)}"))
    else:
        roles = [(a, "bound") for a in sx.named(sx.field(expr, "arguments") or expr)]
    for node, role in roles:
        node = sx.strip(node) if node is not None else None
        if node is None or node.type != "number_literal" or sx.int_value(sx.text(node)) is None:
            continue
        # The knob's literal is the n-th number of its line, as params.py counts them.
        index = len(NUMBER.findall(row[: node.start_point[1]]))
        value = str(sx.int_value(sx.text(node)))
        block = role.startswith("block") or role == "bound"
        choices = _block_choices(value) if block else _size_choices(value)
        name = f"{where}:{_declared_name(expr)} ({role})"
        out.append(Knob(name, "launch_choice", path, line, value, choices, occurrence=index))
    return out


def _declared_name(expr: sx.Node) -> str:
    """The local the expression initialises (`threads`), else `block`."""
    node: sx.Node | None = expr
    while node is not None and node.type not in ("init_declarator", "compound_statement"):
        node = node.parent
    target = sx.field(node, "declarator") if node is not None \
        and node.type == "init_declarator" else None
    return sx.text(target) if target is not None else "block"


def _block_choices(value: str) -> tuple[str, ...]:
    return tuple(str(v) for v in sorted({32, 64, 128, 256, 512, 1024, int(value)}))


def _size_choices(value: str) -> tuple[str, ...]:
    v = int(value)
    return tuple(str(x) for x in sorted({max(1, v // 4), max(1, v // 2), v, v * 2, v * 4}))



def _config_names(launch: sx.Node) -> set[str]:
    """The names a launch's grid, block and shared memory are computed from, followed
    through the launcher's declarations (`dim3 block(TILE, TILE);` included)."""
    fn = sx.enclosing_function(launch)
    todo = [name for part in sx.named(launch)[:3] for name in sx.identifiers(part)]
    seen: set[str] = set()
    while todo and len(seen) < 64:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for decl in (sx.walk(fn) if fn is not None else ()):
            if decl.type == "declaration" and name in {
                    sx.text(sx.field(d, "declarator") or d)
                    for d in decl.children_by_field_name("declarator")}:
                todo += sx.identifiers(decl)
    return seen


def _shared_sizes(fn: sx.Node) -> dict[str, str]:
    """The names that size a `__shared__` array of `fn`, with the array's name."""
    out: dict[str, str] = {}
    for node in sx.walk(fn):
        if node.type != "declaration" or "__shared__" not in sx.qualifiers(node):
            continue
        for decl in sx.walk(node):
            if decl.type != "array_declarator":
                continue
            size = sx.field(decl, "size")
            inner: sx.Node | None = decl
            while inner is not None and inner.type == "array_declarator":
                inner = sx.field(inner, "declarator")
            for name in sx.identifiers(size) if size is not None else ():
                out[name] = sx.text(inner)
    return out


def _tied_knobs(t: Tunable, flow: _Flow) -> list[Knob]:
    """For a template argument passed as a literal: one knob per launch that passes it,
    tying the literal to the launch's block and grid where they repeat it."""
    if not t.value.isdigit():
        return []
    out = []
    for path, launch in flow.launches:
        found = _tied_at(path, launch, t, flow)
        if found is not None:
            out.append(found)
    return out


def _tied_at(path: str, launch: sx.Node, t: Tunable, flow: _Flow) -> Knob | None:
    call = launch.parent
    function = sx.field(call, "function") if call is not None else None
    if function is None or function.type != "template_function" \
            or call is None or call.start_point[0] != call.end_point[0]:
        return None
    index = _template_index(flow, t.name)
    targs = sx.named(sx.field(function, "arguments") or function)
    if index is None or index >= len(targs) or sx.text(targs[index]) != t.value:
        return None
    value = int(t.value)
    tied = [(_number_index(launch, targs[index]), 0)]
    config = sx.named(launch)
    block = sx.strip(config[1]) if len(config) > 1 else None
    if block is not None and block.type == "number_literal" and sx.int_value(sx.text(block)) \
            == value:
        for part in config[:2]:
            for n in sx.walk(part):
                v = sx.int_value(sx.text(n)) if n.type == "number_literal" else None
                if v in (value, value - 1) and value > 1:
                    tied.append((_number_index(launch, n), v - value))
    if any(i < 0 for i, _ in tied):
        return None
    fn = sx.enclosing_function(launch)
    where = sx.fn_name(fn) if fn is not None else "<file>"
    bare = t.name.rsplit(":", 1)[-1]
    blockish = len(tied) > 1
    alone = knobs([t])
    choices = _block_choices(t.value) if blockish else alone[0].choices if alone else ()
    if not choices:
        return None
    what = "template argument, block and grid" if blockish else "template argument"
    return Knob(f"{where}:{bare} ({what})", "launch_tied", path, launch.start_point[0] + 1,
                t.value, choices, tied=tuple(sorted(set(tied), key=lambda p: p[1] != 0)))


def _template_index(flow: _Flow, name: str) -> int | None:
    bare = name.rsplit(":", 1)[-1]
    for kernel in flow.kernels:
        top = sx.definition(kernel)
        plist = sx.field(top, "parameters") if top is not kernel else None
        if plist is None:
            continue
        names = [sx.text(sx.field(p, "declarator") or p) for p in sx.named(plist)]
        if bare in names:
            return names.index(bare)
    return None


def _number_index(launch: sx.Node, literal: sx.Node) -> int:
    """The literal's place among the numbers of its line, as params.py counts them."""
    if literal.start_point[0] != launch.start_point[0]:
        return -1
    root = launch
    while root.parent is not None:
        root = root.parent
    lines = (root.text or b"").split(b"\n")
    row = lines[literal.start_point[0]].decode(errors="replace")
    before = row.encode()[: literal.start_point[1]].decode(errors="replace")
    return len(NUMBER.findall(before))
