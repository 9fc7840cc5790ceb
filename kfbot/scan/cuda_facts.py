"""Per-file facts from CUDA/C++ source: kernels, launches, bindings, tunables.

Everything is read off the tree-sitter CUDA parse with compiled queries, so the
work per node happens in C; Python only visits the matches. Names are kept as
written (with their namespace scope) and resolved across files by `link`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kfbot.scan import treesitter as tsx
from kfbot.scan.model import (
    Binding,
    CudaFileFacts,
    HostCall,
    KernelDef,
    LaunchSite,
    Param,
    Problem,
    TemplateParam,
    Tunable,
    TunableKind,
)
from kfbot.scan.treesitter import Node

KERNEL_Q = '(function_definition "__global__") @fn'
FUNCTION_Q = "(function_definition) @fn"
LAUNCH_Q = """(call_expression function: (_) @callee (kernel_call_syntax) @cfg
  arguments: (argument_list) @args) @call"""
LAUNCH_API_Q = """(call_expression function: (identifier) @api arguments: (argument_list) @args
  (#match? @api "^cuda(LaunchKernel|LaunchKernelEx|LaunchCooperativeKernel)(_ptsz)?$")) @call"""
CALL_Q = """(call_expression function: [(identifier) (qualified_identifier) (template_function)]
  @callee) @call"""
DEFINE_Q = "(preproc_def name: (identifier) @name value: (preproc_arg) @value) @def"
CONST_Q = """(declaration declarator: (init_declarator declarator: (identifier) @name
  value: (number_literal) @value)) @decl"""
INCLUDE_Q = "(preproc_include path: (string_literal) @path)"
USING_Q = '(using_declaration "namespace" (_) @ns)'
BINDING_MACROS = frozenset(
    {"PYBIND11_MODULE", "TORCH_LIBRARY", "TORCH_LIBRARY_IMPL", "TORCH_LIBRARY_FRAGMENT"})
BINDING_Q = """(function_definition declarator: (function_declarator declarator: (identifier) @macro
  parameters: (parameter_list) @params) body: (compound_statement) @body
  (#match? @macro "^(PYBIND11_MODULE|TORCH_LIBRARY|TORCH_LIBRARY_IMPL|TORCH_LIBRARY_FRAGMENT)$"))"""
MEMBER_CALL_Q = """(call_expression function: (field_expression argument: (identifier) @obj
  field: (field_identifier) @method) arguments: (argument_list) @args) @call"""
IDENT_Q = "[(identifier) (type_identifier) (namespace_identifier)] @id"

INT_TYPES = frozenset({
    "int", "unsigned", "unsigned int", "long", "long long", "short", "size_t", "int32_t",
    "int64_t", "uint32_t", "uint64_t", "index_t",
})
NUMBER = re.compile(r"^\(?\s*-?(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\s*\)?$")
_SCOPE_NODES = frozenset({"namespace_definition", "class_specifier", "struct_specifier"})
# Calls that only re-type their argument: `&f` inside is the function being bound/launched.
CAST_FUNCTIONS = frozenset({"reinterpret_cast", "static_cast", "const_cast", "overload_cast",
                            "TORCH_FN"})
_WRAPPERS = frozenset({"cast_expression", "parenthesized_expression", "pointer_expression"})


def extract_cuda_facts(rel_path: str, source: bytes, line_offset: int = 0) -> CudaFileFacts:
    """Read one CUDA/C++ source. `line_offset` shifts lines for code held in Python strings."""
    tree = tsx.parse_cuda(source)
    root = tree.root_node
    ctx = _Ctx(rel_path, line_offset)
    return CudaFileFacts(
        file=rel_path,
        kernels=tuple(_kernel(ctx, m["fn"]) for m in tsx.matches(KERNEL_Q, root)),
        launches=tuple(_launches(ctx, root)),
        bindings=tuple(_bindings(ctx, root)),
        tunables=tuple(_tunables(ctx, root)),
        includes=tuple(tsx.text(m["path"]).strip('"') for m in tsx.matches(INCLUDE_Q, root)),
        host_functions=tuple(_host_functions(root)),
        host_calls=tuple(_host_calls(root)),
        using_namespaces=tuple(_compact(tsx.text(m["ns"])) for m in tsx.matches(USING_Q, root)),
        problems=tuple(_syntax_problems(ctx, tree)),
    )


class _Ctx:
    def __init__(self, file: str, line_offset: int) -> None:
        self.file = file
        self.line_offset = line_offset

    def line(self, node: Node) -> int:
        return tsx.line(node) + self.line_offset


def _syntax_problems(ctx: _Ctx, tree: tsx.Tree) -> Iterable[Problem]:
    if not tree.root_node.has_error:
        return []
    lines = [n + ctx.line_offset for n in tsx.error_lines(tree)]
    where = ", ".join(str(n) for n in lines) or "unknown"
    return [Problem(ctx.file, lines[0] if lines else None,
                    f"syntax errors (lines {where}); facts from the rest of the file are kept")]


# --- names and scopes ------------------------------------------------------------------


def _compact(s: str) -> str:
    """Drop whitespace inside a C++ name or type so equal names compare equal."""
    return re.sub(r"\s+(?=[<>,:*&])|(?<=[<>,:*&(])\s+", "", " ".join(s.split()))


def scope_of(node: Node) -> list[str]:
    """Enclosing namespaces and classes, outermost first; anonymous namespaces are skipped."""
    names: list[str] = []
    for anc in tsx.ancestors(node):
        if anc.type in _SCOPE_NODES:
            name = anc.child_by_field_name("name")
            if name is not None:
                names.append(_compact(tsx.text(name)))
    return list(reversed(names))


def _declarator_name(node: Node | None) -> Node | None:
    """Descend declarator wrappers (pointer, reference, array, function) to the name."""
    while node is not None and node.type not in (
        "identifier", "field_identifier", "qualified_identifier", "destructor_name",
        "operator_name", "template_function",
    ):
        inner = node.child_by_field_name("declarator")
        if inner is None:
            inner = next((c for c in node.named_children if "declarator" in c.type
                          or c.type == "identifier"), None)
        node = inner
    return node


def function_name(fn: Node) -> str | None:
    """Qualified name of a function definition, scope included: e.g. "ns::S::run"."""
    name = _declarator_name(fn.child_by_field_name("declarator"))
    if name is None:
        return None
    parts = [*scope_of(fn), _compact(tsx.text(name))]
    return "::".join(p for p in parts if p)


def _enclosing_function(node: Node) -> Node | None:
    return next((a for a in tsx.ancestors(node) if a.type == "function_definition"), None)


def _is_device_only(fn: Node) -> bool:
    kinds = {c.type for c in fn.children}
    if "__global__" in kinds:
        return True
    return "__device__" in kinds and "__host__" not in kinds


def _split_template(node: Node) -> tuple[str, tuple[str, ...]]:
    """`ns::k<16, float>` -> ("ns::k", ("16", "float"))."""
    args_node = _last_template_args(node)
    if args_node is None:
        return _compact(tsx.text(node)), ()
    full = tsx.text(node)
    start = args_node.start_byte - node.start_byte
    end = args_node.end_byte - node.start_byte
    name = full[:start] + full[end:]
    args = tuple(_compact(tsx.text(a)) for a in args_node.named_children)
    return _compact(name), args


def _last_template_args(node: Node) -> Node | None:
    if node.type == "template_function":
        return node.child_by_field_name("arguments")
    if node.type == "qualified_identifier":
        name = node.child_by_field_name("name")
        return _last_template_args(name) if name is not None else None
    return None


def _identifiers(node: Node) -> tuple[str, ...]:
    found = {tsx.text(m["id"]) for m in tsx.matches(IDENT_Q, node)}
    return tuple(sorted(found))


# --- kernels ---------------------------------------------------------------------------


def _kernel(ctx: _Ctx, fn: Node) -> KernelDef:
    declarator = fn.child_by_field_name("declarator")
    name_node = _declarator_name(declarator)
    params_node = _params_node(declarator)
    bounds = next((c for c in fn.children if c.type == "launch_bounds"), None)
    return KernelDef(
        name=_compact(tsx.text(name_node)).split("::")[-1],
        namespace="::".join(scope_of(fn)),
        file=ctx.file,
        line=ctx.line(fn),
        template_params=_template_params(fn),
        params=tuple(_param(p) for p in _param_decls(params_node)),
        launch_bounds=(tuple(_compact(tsx.text(c)) for c in bounds.named_children)
                       if bounds is not None else None),
        line_offset=ctx.line_offset,
        uses=_identifiers(fn),
    )


def _params_node(declarator: Node | None) -> Node | None:
    node = declarator
    while node is not None and node.type != "function_declarator":
        node = node.child_by_field_name("declarator")
    return node.child_by_field_name("parameters") if node is not None else None


def _param_decls(params: Node | None) -> list[Node]:
    if params is None:
        return []
    return [c for c in params.named_children if c.type.endswith("parameter_declaration")]


def _param(decl: Node) -> Param:
    name = _declarator_name(decl.child_by_field_name("declarator"))
    full = tsx.text(decl)
    if name is None:
        return Param(type=_compact(full), name="")
    start, end = name.start_byte - decl.start_byte, name.end_byte - decl.start_byte
    raw = full.encode()
    type_text = (raw[:start] + raw[end:]).decode(errors="replace")
    return Param(type=" ".join(type_text.split()), name=tsx.text(name))


def _template_params(fn: Node) -> tuple[TemplateParam, ...]:
    parent = fn.parent
    if parent is None or parent.type != "template_declaration":
        return ()
    plist = parent.child_by_field_name("parameters")
    if plist is None:
        return ()
    return tuple(tp for c in plist.named_children if (tp := _template_param(c)) is not None)


def _template_param(node: Node) -> TemplateParam | None:
    if node.type in ("parameter_declaration", "optional_parameter_declaration"):
        name = _declarator_name(node.child_by_field_name("declarator"))
        default = node.child_by_field_name("default_value")
        return TemplateParam(kind="value", name=tsx.text(name),
                             type=_compact(tsx.text(node.child_by_field_name("type"))),
                             default=tsx.text(default) if default is not None else None)
    if node.type in ("type_parameter_declaration", "optional_type_parameter_declaration"):
        name = node.child_by_field_name("name") or next(
            (c for c in node.named_children if c.type == "type_identifier"), None)
        default = node.child_by_field_name("default_type")
        return TemplateParam(kind="type", name=tsx.text(name),
                             default=tsx.text(default) if default is not None else None)
    return None


# --- launches --------------------------------------------------------------------------


def _launches(ctx: _Ctx, root: Node) -> Iterable[LaunchSite]:
    for m in tsx.matches(LAUNCH_Q, root):
        cfg: list[str | None] = [_compact(tsx.text(c)) for c in m["cfg"].named_children]
        cfg += [None] * (4 - len(cfg))
        for callee, style in _resolve_callee(m["callee"], "chevron"):
            yield _launch_site(ctx, m["call"], callee, style, cfg[:4], m["args"].named_children)
    for m in tsx.matches(LAUNCH_API_Q, root):
        args = m["args"].named_children
        pick = 1 if tsx.text(m["api"]).startswith("cudaLaunchKernelEx") else 0
        if len(args) <= pick:
            continue
        grid_block: list[str | None] = [None] * 4
        if pick == 0 and len(args) >= 3:
            grid_block = [_compact(tsx.text(a)) if a is not None else None
                          for a in (args[1], args[2], _nth(args, 4), _nth(args, 5))]
        for callee, _ in _resolve_callee(args[pick], "cudaLaunchKernel"):
            yield _launch_site(ctx, m["call"], callee, "cudaLaunchKernel", grid_block, [])


def _nth(nodes: list[Node], i: int) -> Node | None:
    return nodes[i] if i < len(nodes) else None


def _launch_site(ctx: _Ctx, call: Node, callee: Node, style: str, cfg: list[str | None],
                 args: list[Node]) -> LaunchSite:
    name, targs = _split_template(callee)
    fn = _enclosing_function(call)
    return LaunchSite(
        file=ctx.file, line=ctx.line(call), kernel=name,
        style=style,  # type: ignore[arg-type]
        host_function=function_name(fn) if fn is not None else None,
        template_args=targs, grid=cfg[0], block=cfg[1], shared_mem=cfg[2], stream=cfg[3],
        args=tuple(_compact(tsx.text(a)) for a in args),
        scope="::".join(scope_of(call)),
        uses=_identifiers(fn) if fn is not None else (),
    )


def _resolve_callee(expr: Node, style: str) -> list[tuple[Node, str]]:
    """Strip casts and `&`; follow a local function-pointer variable to what it holds."""
    expr = _strip(expr)
    if expr.type == "conditional_expression":
        return [pair for field in ("consequence", "alternative")
                if (branch := expr.child_by_field_name(field)) is not None
                for pair in _resolve_callee(branch, style)]
    if expr.type == "identifier":
        held = _local_values(expr)
        if held:
            kind = "function_pointer" if style == "chevron" else style
            return [(n, kind) for value in held for n, _ in _resolve_callee(value, kind)]
    return [(expr, style)]


def _strip(expr: Node) -> Node:
    while True:
        if expr.type in _WRAPPERS:
            inner = expr.child_by_field_name("value") or expr.child_by_field_name("argument")
            inner = inner or (expr.named_children[-1] if expr.named_children else None)
        elif expr.type == "call_expression" and _is_cast_call(expr):
            args = expr.child_by_field_name("arguments")
            inner = args.named_children[0] if args is not None and args.named_children else None
        else:
            return expr
        if inner is None:
            return expr
        expr = inner


def _is_cast_call(call: Node) -> bool:
    fn = call.child_by_field_name("function")
    if fn is None:
        return False
    return _split_template(fn)[0].rsplit("::", 1)[-1] in CAST_FUNCTIONS


def _local_values(ident: Node) -> list[Node]:
    """Values assigned to a local variable named like `ident` in the same function."""
    fn = _enclosing_function(ident)
    if fn is None:
        return []
    want = tsx.text(ident)
    values: list[Node] = []
    stack = [fn]
    while stack:
        node = stack.pop()
        if node.type == "init_declarator":
            name = _declarator_name(node.child_by_field_name("declarator"))
            value = node.child_by_field_name("value")
            if name is not None and tsx.text(name) == want and value is not None:
                values.append(value)
        elif node.type == "assignment_expression":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if left is not None and right is not None and tsx.text(left) == want:
                values.append(right)
        stack.extend(node.named_children)
    return [v for v in values if v.id != ident.id]


# --- bindings --------------------------------------------------------------------------


def _bindings(ctx: _Ctx, root: Node) -> Iterable[Binding]:
    for macro, params, body in _binding_blocks(root):
        names = [_compact(tsx.text(p)) for p in _param_decls(params)]
        if len(names) < 2:
            continue
        module, handle = names[0], names[-1]
        key = names[1] if macro == "TORCH_LIBRARY_IMPL" and len(names) >= 3 else None
        for m in tsx.matches(MEMBER_CALL_Q, body):
            if tsx.text(m["obj"]) != handle:
                continue
            binding = _binding(ctx, macro, module, key, tsx.text(m["method"]), m)
            if binding is not None:
                yield binding


def _binding_blocks(root: Node) -> Iterable[tuple[str, Node, Node]]:
    for m in tsx.matches(BINDING_Q, root):
        yield tsx.text(m["macro"]), m["params"], m["body"]


def _binding(ctx: _Ctx, macro: str, module: str, key: str | None, method: str,
             m: dict[str, Node]) -> Binding | None:
    args = m["args"].named_children
    if method not in ("def", "impl") or not args or args[0].type != "string_literal":
        return None
    name = _string_value(args[0]).split("(")[0].strip()
    if "::" in name:
        name = name.split("::")[-1]
    fn = _bound_function(args[1]) if len(args) > 1 else None
    kind = {"PYBIND11_MODULE": "pybind11", "TORCH_LIBRARY_IMPL": "torch_library_impl"}.get(
        macro, "torch_library")
    return Binding(kind=kind, name=name, cpp_function=fn,  # type: ignore[arg-type]
                   module=module, file=ctx.file, line=ctx.line(m["call"]), dispatch_key=key)


def _string_value(node: Node) -> str:
    return "".join(tsx.text(c) for c in node.named_children if c.type == "string_content")


def _bound_function(arg: Node) -> str | None:
    """`&ns::f<float>` -> "ns::f"; a lambda -> the first function it calls."""
    arg = _strip(arg)
    if arg.type == "lambda_expression":
        calls = [m["callee"] for m in tsx.matches(CALL_Q, arg)]
        return _split_template(calls[0])[0] if calls else None
    if arg.type in ("identifier", "qualified_identifier", "template_function"):
        return _split_template(arg)[0]
    return None


# --- host functions and calls ----------------------------------------------------------


def _host_functions(root: Node) -> Iterable[str]:
    for m in tsx.matches(FUNCTION_Q, root):
        fn = m["fn"]
        name = function_name(fn)
        if name is not None and not _is_device_only(fn) and name not in BINDING_MACROS:
            yield name


def _is_launch(call: Node) -> bool:
    return any(c.type == "kernel_call_syntax" for c in call.children)


def _host_calls(root: Node) -> Iterable[HostCall]:
    seen: set[tuple[str, str]] = set()
    for m in tsx.matches(CALL_Q, root):
        fn = _enclosing_function(m["call"])
        if fn is None or _is_device_only(fn) or _is_launch(m["call"]):
            continue
        caller = function_name(fn)
        callee = _split_template(m["callee"])[0]
        if caller is not None and (caller, callee) not in seen:
            seen.add((caller, callee))
            yield HostCall(caller=caller, callee=callee)


# --- tunables --------------------------------------------------------------------------


def _tunables(ctx: _Ctx, root: Node) -> Iterable[Tunable]:
    for m in tsx.matches(DEFINE_Q, root):
        value = tsx.text(m["value"]).strip()
        if NUMBER.match(value):
            name = tsx.text(m["name"])
            kind: TunableKind = "ifndef_default" if _ifndef_guarded(m["def"], name) \
                else "define"
            yield Tunable(name=name, value=value.strip("()").strip(), kind=kind,
                          file=ctx.file, line=ctx.line(m["def"]))
    for m in tsx.matches(CONST_Q, root):
        const_kind = _const_kind(m["decl"])
        if const_kind is not None:
            yield Tunable(name=tsx.text(m["name"]), value=tsx.text(m["value"]), kind=const_kind,
                          file=ctx.file, line=ctx.line(m["decl"]))


def _ifndef_guarded(define: Node, name: str) -> bool:
    parent = define.parent
    if parent is None or parent.type != "preproc_ifdef":
        return False
    guard = parent.child_by_field_name("name")
    return parent.children[0].type == "#ifndef" and tsx.text(guard) == name


def _const_kind(decl: Node) -> TunableKind | None:
    quals = {tsx.text(c) for c in decl.children if c.type == "type_qualifier"}
    type_text = " ".join(tsx.text(decl.child_by_field_name("type")).split())
    if type_text not in INT_TYPES and not type_text.startswith("unsigned"):
        return None
    if "constexpr" in quals:
        return "constexpr"
    return "const" if "const" in quals else None
