"""Per-file facts from CUDA/C++ source: kernels, launches, bindings, tunables, calls.

Everything is read off the tree-sitter CUDA parse with compiled queries, so the
work per node happens in C; Python only visits the matches. Names are kept as
written (with their namespace scope) and resolved across files by `link`.
The work is shared with `attrs` (attributes the grammar does not know),
`bindings`, `calls` (host functions and calls), `conditions` (the
branches a launch is under) and `macros` (launches written in macros).
Those readers see the file through `context.FileContext`, which `Ctx` implements,
so they sit below this module rather than in a circle with it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable

from kfbot.scan import treesitter as tsx
from kfbot.scan.cuda import bindings as cuda_bindings
from kfbot.scan.cuda import calls as cuda_calls
from kfbot.scan.cuda import conditions as cuda_conditions
from kfbot.scan.cuda import macros as cuda_macros
from kfbot.scan.cuda.attrs import Attribute, attributes_between, blank_attributes
from kfbot.scan.cuda.conditions import Conditions
from kfbot.scan.cuda.syntax import (
    compact,
    declarator_name,
    expr,
    param_decls,
    params_node,
    split_template,
    strip,
)
from kfbot.scan.model import (
    NOT_UNDERSTOOD,
    CudaFileFacts,
    KernelDef,
    LaunchSite,
    Param,
    Problem,
    TemplateParam,
    Tunable,
    TunableKind,
)
from kfbot.scan.treesitter import Node

FUNCTION_Q = "(function_definition) @fn"
LAUNCH_Q = """(call_expression function: (_) @callee (kernel_call_syntax) @cfg
  arguments: (argument_list) @args) @call"""
# A call of these by name launches the kernel its argument names (a call as CALL_Q finds).
LAUNCH_API = re.compile(r"^cuda(LaunchKernel|LaunchKernelEx|LaunchCooperativeKernel)(_ptsz)?$")
DEFINE_Q = "(preproc_def name: (identifier) @name value: (preproc_arg) @value) @def"
CONST_Q = """(declaration declarator: (init_declarator declarator: (identifier) @name
  value: (number_literal) @value)) @decl"""
INCLUDE_Q = "(preproc_include path: (string_literal) @path)"
USING_Q = '(using_declaration "namespace" (_) @ns)'
ASSIGN_Q = """[(init_declarator declarator: (_) @target value: (_) @value)
  (assignment_expression left: (identifier) @target right: (_) @value)]"""
CPP_KEYWORDS = frozenset({
    "if", "else", "for", "while", "do", "return", "int", "float", "double", "void", "const",
    "unsigned", "char", "bool", "auto", "struct", "class", "template", "typename", "static",
    "constexpr", "inline", "__global__", "__device__", "__host__", "__shared__",
    "__restrict__", "sizeof", "break", "continue"})
_WORD_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_BLANK_NON_WORD = bytes(b if b in _WORD_BYTES else 0x20 for b in range(256))
_LETTERS_START = ord("A")  # below it, of the word bytes: the digits
_KEYWORD_BYTES = frozenset(k.encode() for k in CPP_KEYWORDS)

SCOPE_Q = "[(namespace_definition) (class_specifier) (struct_specifier)] @s"
TEMPLATE_Q = """(template_declaration parameters: (template_parameter_list) @params
  (function_definition) @fn)"""
LINKAGE_Q = "(linkage_specification) @l"
# Compiling a query costs tens of ms in every process (more than matching it on a file),
# but a pattern added to a query costs a few: all patterns but ASSIGN_Q (seldom needed)
# are one query, matched once per file; the matches inside one node are taken from it.
# Which functions are kernels, which #defines an #ifndef guards and which calls are
# cudaLaunchKernel are read off the functions, conditionals and calls it finds anyway:
# as patterns of their own (an anonymous child, a predicate) they cost a third of the
# compile and a tenth of the matching.
FILE_PATTERNS = (FUNCTION_Q, LAUNCH_Q, DEFINE_Q, CONST_Q, INCLUDE_Q,
                 USING_Q, SCOPE_Q, TEMPLATE_Q, LINKAGE_Q, *cuda_bindings.PATTERNS,
                 *cuda_calls.PATTERNS, *cuda_conditions.PATTERNS, *cuda_macros.PATTERNS)
INT_TYPES = frozenset({
    "int", "unsigned", "unsigned int", "long", "long long", "short", "size_t", "int32_t",
    "int64_t", "uint32_t", "uint64_t", "index_t",
})
NUMBER = re.compile(r"^\(?\s*-?(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\s*\)?$")
_NAME_VALUE = re.compile(r"^[A-Za-z_]\w*$")
_FILE_QUERY = "\n".join(FILE_PATTERNS)


def compile_queries() -> None:
    """Compile the query every file needs, e.g. once before forking workers."""
    tsx.query(_FILE_QUERY)


def extract_cuda_facts(rel_path: str, source: bytes, line_offset: int = 0) -> CudaFileFacts:
    """Read one CUDA/C++ source. `line_offset` shifts lines for code held in Python strings."""
    parsed, attributes = blank_attributes(source)
    tree = tsx.parse_cuda(parsed)
    root = tree.root_node
    ctx = Ctx(rel_path, line_offset, root, parsed, attributes)
    return CudaFileFacts(
        file=rel_path,
        kernels=tuple(_kernel(ctx, fn) for _, _, fn in ctx.functions if ctx.is_kernel(fn)),
        launches=tuple(_launches(ctx)),
        bindings=tuple(cuda_bindings.bindings(ctx)),
        tunables=tuple(_tunables(ctx)),
        includes=tuple(tsx.text(m["path"]).strip('"') for m in ctx.found(INCLUDE_Q)),
        host_calls=tuple(cuda_calls.host_calls(ctx)),
        using_namespaces=tuple(compact(tsx.text(m["ns"])) for m in ctx.found(USING_Q)),
        problems=tuple(_syntax_problems(ctx, tree)),
        functions=tuple(cuda_calls.host_functions(ctx)),
        macros=tuple(cuda_macros.macro_defs(ctx)),
        macro_uses=tuple(cuda_macros.macro_uses(ctx, ctx.found(cuda_calls.CALL_Q))),
        aliases=tuple(_aliases(ctx)),
    )


class Ctx:
    """Per-file lookups built once from queries.

    tree-sitter's `Node.parent` searches down from the root, so walking ancestors
    is quadratic on a large file; scopes and enclosing functions are found by
    byte ranges instead.
    """

    call_pattern = cuda_calls.CALL_Q

    def __init__(self, file: str, line_offset: int, root: Node, source: bytes,
                 attributes: list[Attribute]) -> None:
        self.file = file
        self.source = source
        self.line_offset = line_offset
        self.attributes = attributes
        # One pass of one multi-pattern query: each query pass costs a walk of the tree.
        self._found = tsx.matches_by_pattern(FILE_PATTERNS, root)
        self.scopes = [(n.start_byte, n.end_byte, compact(tsx.text(name)))
                       for m in self.found(SCOPE_Q)
                       if (name := (n := m["s"]).child_by_field_name("name")) is not None]
        self.functions = sorted(((m["fn"].start_byte, m["fn"].end_byte, m["fn"])
                                 for m in self.found(FUNCTION_Q)), key=lambda t: t[0])
        self.starts = [f[0] for f in self.functions]
        # The specifiers written before each function's name, by its start byte.
        self._heads = {start: {c.type for c in fn.children} for start, _, fn in self.functions}
        self.template_lists = {m["fn"].id: m["params"] for m in self.found(TEMPLATE_Q)}
        self.guarded = _guarded(self.found(cuda_conditions.PREPROC_Q))
        self.linkage = [(m["l"].start_byte, m["l"].end_byte) for m in self.found(LINKAGE_Q)
                        if '"C"' in tsx.text(m["l"].child_by_field_name("value"))]
        self.conditions = Conditions([self.found(p) for p in cuda_conditions.PATTERNS])

        self._uses: dict[int, tuple[str, ...]] = {}
        self._names: dict[int, str | None] = {}
        self._assigned: dict[tuple[int, bytes], list[Node]] = {}
        self.params: dict[int, tuple[str, ...]] = {}  # by function start: parameter names
        self.root = root

    def line(self, node: Node) -> int:
        return tsx.line(node) + self.line_offset

    def found(self, pattern: str) -> list[dict[str, Node]]:
        return self._found[FILE_PATTERNS.index(pattern)]

    def found_in(self, pattern: str, capture: str, node: Node) -> list[dict[str, Node]]:
        """The matches of `pattern` whose `capture` lies inside `node`, in file order."""
        start, end = node.start_byte, node.end_byte
        return [m for m in self.found(pattern)
                if start <= (c := m[capture]).start_byte and c.end_byte <= end]

    def conditions_at(self, node: Node, fn: Node | None) -> tuple[str, ...]:
        within = (fn.start_byte, fn.end_byte) if fn is not None else None
        return self.conditions.at(node.start_byte, node.end_byte, within)

    def uses(self, fn: Node) -> tuple[str, ...]:
        """Identifier-like words inside function `fn`.

        Only used to decide which tunables a kernel or launcher refers to, so a lexical
        pass over the function's bytes is enough, and far cheaper than visiting every
        identifier node of the file.
        """
        found = self._uses.get(fn.start_byte)
        if found is None:
            found = self._uses[fn.start_byte] = _words(self.source[fn.start_byte:fn.end_byte])
        return found

    def assigned(self, fn: Node, ident: Node) -> list[Node]:
        """Values assigned inside `fn` to a local variable named like `ident`."""
        name = ident.text or b""
        key = (fn.start_byte, name)
        found = self._assigned.get(key)
        if found is None:
            found = self._assigned[key] = self._find_assigned(fn, name)
        return found

    def _find_assigned(self, fn: Node, name: bytes) -> list[Node]:
        # An assignment writes the name once more than the use being resolved. Most
        # launches name a kernel, written once in the launching function, so the
        # query below (a walk of the function) seldom runs.
        if self.source.count(name, fn.start_byte, fn.end_byte) < 2:
            return []
        text = name.decode("utf-8", errors="replace")
        found = []
        for m in tsx.matches(ASSIGN_Q, fn):
            target = declarator_name(m["target"]) if "target" in m else None
            if target is None or tsx.text(target) != text:
                continue
            owner = self.enclosing_function(m["value"])  # not a function nested in `fn`
            if owner is not None and owner.start_byte == fn.start_byte:
                found.append(m["value"])
        return found

    def scope_of(self, node: Node) -> list[str]:
        """Enclosing namespaces and classes, outermost first (anonymous ones skipped)."""
        at = node.start_byte
        inside = [(start, name) for start, end, name in self.scopes
                  if start < at and end >= node.end_byte]
        return [name for _, name in sorted(inside)]

    def enclosing_function(self, node: Node) -> Node | None:
        i = bisect.bisect_left(self.starts, node.start_byte) - 1
        while i >= 0:
            _, end, fn = self.functions[i]
            if end >= node.end_byte:
                return fn
            i -= 1
        return None

    def device_only(self, fn: Node) -> bool:
        kinds = self._kinds(fn)
        return "__global__" in kinds or ("__device__" in kinds and "__host__" not in kinds)

    def is_kernel(self, fn: Node) -> bool:
        """A `__global__` function (the specifier is a child of the definition)."""
        return "__global__" in self._kinds(fn)

    def _kinds(self, fn: Node) -> set[str]:
        kinds = self._heads.get(fn.start_byte)
        # Not a function definition of the file's query.
        return kinds if kinds is not None else {c.type for c in fn.children}

    def function_name(self, fn: Node) -> str | None:
        """Qualified name of a function definition, scope included: e.g. "ns::S::run"."""
        if fn.start_byte not in self._names:
            name = declarator_name(fn.child_by_field_name("declarator"))
            parts = [*self.scope_of(fn), _declared(compact(tsx.text(name)))] \
                if name is not None else []
            self._names[fn.start_byte] = "::".join(p for p in parts if p) or None
        return self._names[fn.start_byte]


def _words(code: bytes) -> tuple[str, ...]:
    """The distinct words of `code` that are not keywords, sorted: the names
    `re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)` finds in its text.

    Words are ASCII, so they are found in the bytes: every byte that is no word character
    made a blank, the runs split apart, and the digits before a letter dropped (`0.5f`
    holds the word `f`). A third faster than the regular expression, on every function."""
    words = set(code.translate(_BLANK_NON_WORD).split())
    numbers = [w for w in words if w[0] < _LETTERS_START]
    if numbers:
        words.difference_update(numbers)
        words.update(w for n in numbers if (w := n.lstrip(b"0123456789")))
    words.difference_update(_KEYWORD_BYTES)
    return tuple(sorted(w.decode() for w in words))


def _declared(name: str) -> str:
    """The function's own name where an export macro before the return type
    (`CLUSTER_API torch::Tensor fps(...)`) made the parser read the type into it."""
    if " " in name and not name.startswith("operator") and "<" not in name:
        return name.rsplit(" ", 1)[-1]
    return name


def _syntax_problems(ctx: Ctx, tree: tsx.Tree) -> Iterable[Problem]:
    if not tree.root_node.has_error:
        return []
    places = tsx.syntax_errors(tree, limit=1000)
    lines = sorted({first + ctx.line_offset for first, _, _ in places})
    where = ", ".join(str(n) for n in lines[:5]) + (" ..." if len(lines) > 5 else "")
    count = f"{len(places)} place{'s' if len(places) != 1 else ''}"
    # Info, not a warning: most such places are valid code the grammar does not know.
    return [Problem(ctx.file, lines[0] if lines else None,
                    f"{NOT_UNDERSTOOD} {count} (line{'s' if len(lines) != 1 else ''} "
                    f"{where or 'unknown'}); the rest of the file was read", "info")]


def _guarded(conditionals: list[dict[str, Node]]) -> set[int]:
    """The `#define X` written directly in an `#ifndef X` (a default the build may set),
    by node id."""
    found: set[int] = set()
    for m in conditionals:
        node, name = m["pp"], m["cond"]
        if node.type != "preproc_ifdef" or name.type != "identifier":
            continue
        children = node.children
        at = next(i for i, c in enumerate(children) if c.id == name.id)
        if not any(c.type == "#ifndef" for c in children[:at]):
            continue
        guard = tsx.text(name)
        found.update(c.id for c in children[at + 1:] if c.type == "preproc_def"
                     and (d := c.child_by_field_name("name")) is not None
                     and d.type == "identifier" and tsx.text(d) == guard)
    return found


# --- kernels ---------------------------------------------------------------------------


def _kernel(ctx: Ctx, fn: Node) -> KernelDef:
    declarator = fn.child_by_field_name("declarator")
    name_node = declarator_name(declarator)
    bounds = next((c for c in fn.children if c.type == "launch_bounds"), None)
    head_end = name_node.start_byte if name_node is not None else fn.start_byte
    return KernelDef(
        name=compact(tsx.text(name_node)).split("::")[-1],
        namespace="::".join(ctx.scope_of(fn)),
        file=ctx.file,
        line=ctx.line(fn),
        template_params=_template_params(ctx.template_lists.get(fn.id)),
        params=tuple(_param(p) for p in param_decls(params_node(declarator))),
        launch_bounds=(tuple(expr(tsx.text(c)) for c in bounds.named_children)
                       if bounds is not None else None),
        line_offset=ctx.line_offset,
        uses=ctx.uses(fn),
        attributes=attributes_between(ctx.attributes, fn.start_byte, head_end),
        extern_c=any(s <= fn.start_byte and fn.end_byte <= e for s, e in ctx.linkage),
        preprocessor=ctx.conditions_at(fn, None),
    )


def _param(decl: Node) -> Param:
    name = declarator_name(decl.child_by_field_name("declarator"))
    full = tsx.text(decl)
    if name is None:
        return Param(type=compact(full), name="")
    start, end = name.start_byte - decl.start_byte, name.end_byte - decl.start_byte
    raw = full.encode()
    type_text = (raw[:start] + raw[end:]).decode(errors="replace")
    return Param(type=" ".join(type_text.split()), name=tsx.text(name))


def _template_params(plist: Node | None) -> tuple[TemplateParam, ...]:
    if plist is None:
        return ()
    return tuple(tp for c in plist.named_children if (tp := _template_param(c)) is not None)


def _template_param(node: Node) -> TemplateParam | None:
    if node.type in ("parameter_declaration", "optional_parameter_declaration"):
        name = declarator_name(node.child_by_field_name("declarator"))
        default = node.child_by_field_name("default_value")
        return TemplateParam(kind="value", name=tsx.text(name),
                             type=compact(tsx.text(node.child_by_field_name("type"))),
                             default=tsx.text(default) if default is not None else None)
    if node.type in ("type_parameter_declaration", "optional_type_parameter_declaration"):
        name = node.child_by_field_name("name") or next(
            (c for c in node.named_children if c.type == "type_identifier"), None)
        default = node.child_by_field_name("default_type")
        return TemplateParam(kind="type", name=tsx.text(name),
                             default=tsx.text(default) if default is not None else None)
    return None


# --- launches --------------------------------------------------------------------------


def _launches(ctx: Ctx) -> Iterable[LaunchSite]:
    for m in ctx.found(LAUNCH_Q):
        cfg: list[str | None] = [expr(tsx.text(c)) for c in m["cfg"].named_children]
        cfg += [None] * (4 - len(cfg))
        for callee, style in _resolve_callee(ctx, m["callee"], "chevron"):
            yield _launch_site(ctx, m["call"], callee, style, cfg[:4], m["args"].named_children)
    for m in _api_launches(ctx):
        args = m["args"].named_children
        pick = 1 if tsx.text(m["callee"]).startswith("cudaLaunchKernelEx") else 0
        if len(args) <= pick:
            continue
        grid_block: list[str | None] = [None] * 4
        if pick == 0 and len(args) >= 3:
            grid_block = [expr(tsx.text(a)) if a is not None else None
                          for a in (args[1], args[2], _nth(args, 4), _nth(args, 5))]
        for callee, _ in _resolve_callee(ctx, args[pick], "cudaLaunchKernel"):
            yield _launch_site(ctx, m["call"], callee, "cudaLaunchKernel", grid_block, [])


def _api_launches(ctx: Ctx) -> list[dict[str, Node]]:
    """The calls of cudaLaunchKernel and its kin by name."""
    if b"cudaLaunch" not in ctx.source:  # nearly every file
        return []
    return [m for m in ctx.found(cuda_calls.CALL_Q) if m["callee"].type == "identifier"
            and LAUNCH_API.match(tsx.text(m["callee"]))]


def _nth(nodes: list[Node], i: int) -> Node | None:
    return nodes[i] if i < len(nodes) else None


def _launch_site(ctx: Ctx, call: Node, callee: Node, style: str, cfg: list[str | None],
                 args: list[Node]) -> LaunchSite:
    name, targs = split_template(callee)
    fn = ctx.enclosing_function(call)
    return LaunchSite(
        file=ctx.file, line=ctx.line(call), kernel=name,
        style=style,  # type: ignore[arg-type]
        host_function=ctx.function_name(fn) if fn is not None else None,
        template_args=targs, grid=cfg[0], block=cfg[1], shared_mem=cfg[2], stream=cfg[3],
        args=tuple(expr(tsx.text(a)) for a in args),
        scope="::".join(ctx.scope_of(call)),
        uses=ctx.uses(fn) if fn is not None else (),
        conditions=ctx.conditions_at(callee, fn),
    )


def _resolve_callee(ctx: Ctx, callee: Node, style: str) -> list[tuple[Node, str]]:
    """Strip casts and `&`; follow a local function-pointer variable to what it holds."""
    callee = strip(callee)
    if callee.type == "conditional_expression":
        return [pair for field in ("consequence", "alternative")
                if (branch := callee.child_by_field_name(field)) is not None
                for pair in _resolve_callee(ctx, branch, style)]
    if callee.type == "identifier":
        held = _local_values(ctx, callee)
        if held:
            kind = "function_pointer" if style == "chevron" else style
            return [(n, kind) for value in held for n, _ in _resolve_callee(ctx, value, kind)]
    return [(callee, style)]


def _local_values(ctx: Ctx, ident: Node) -> list[Node]:
    """Values assigned to a local variable named like `ident` in the same function."""
    fn = ctx.enclosing_function(ident)
    if fn is None:
        return []
    return [v for v in ctx.assigned(fn, ident) if v.id != ident.id]


# --- tunables and aliases --------------------------------------------------------------


def _tunables(ctx: Ctx) -> Iterable[Tunable]:
    for m in ctx.found(DEFINE_Q):
        value = tsx.text(m["value"]).strip()
        if NUMBER.match(value):
            name = tsx.text(m["name"])
            kind: TunableKind = "ifndef_default" if m["def"].id in ctx.guarded else "define"
            yield Tunable(name=name, value=value.strip("()").strip(), kind=kind,
                          file=ctx.file, line=ctx.line(m["def"]))
    for m in ctx.found(CONST_Q):
        const_kind = _const_kind(m["decl"])
        if const_kind is not None:
            yield Tunable(name=tsx.text(m["name"]), value=tsx.text(m["value"]), kind=const_kind,
                          file=ctx.file, line=ctx.line(m["decl"]))


def _aliases(ctx: Ctx) -> Iterable[tuple[str, str]]:
    """`#define KFOPS_NAMESPACE kfops`: a name for a name (a library's namespace)."""
    for m in ctx.found(DEFINE_Q):
        value = tsx.text(m["value"]).strip()
        if _NAME_VALUE.match(value):
            yield tsx.text(m["name"]), value


def _const_kind(decl: Node) -> TunableKind | None:
    quals = {tsx.text(c) for c in decl.children if c.type == "type_qualifier"}
    type_text = " ".join(tsx.text(decl.child_by_field_name("type")).split())
    if type_text not in INT_TYPES and not type_text.startswith("unsigned"):
        return None
    if "constexpr" in quals:
        return "constexpr"
    return "const" if "const" in quals else None
