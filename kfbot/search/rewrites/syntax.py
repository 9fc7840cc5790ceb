"""The tree-sitter vocabulary every rewrite shares: finding kernels, launches, constants
and variables in a parsed CUDA source, and splicing new text in by byte ranges.

Rewrites read nodes, never the text around them, so a comment or a string that
mentions a trigger never triggers anything; `norm` gives a node's text without
whitespace, or None when a comment sits inside it, for the shapes compared as text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from kfbot.scan import treesitter as tsx

Node = tsx.Node
Edit = tuple[int, int, bytes]  # (start byte, end byte, replacement)

KERNEL_FN = '(function_definition "__global__") @fn'
DEVICE_FN = '(function_definition ["__global__" "__device__"]) @fn'
# How a CUDA source spells a zero start value.
ZERO_LITERALS = ("0", "0.0", "0.f", "0.0f", "0.")
_LAUNCH = "(call_expression function: (_) @f (kernel_call_syntax) @k) @call"


@dataclass(frozen=True)
class Target:
    """What a rewrite may touch: one kernel, the device functions only it calls, and the
    launches of it in the same file."""

    kernel: str  # the bare name of the kernel the task optimises
    # A launch of the kernel sits in another file: a rewrite that changes how the kernel
    # is launched cannot keep that launcher in step, so it proposes nothing.
    launched_elsewhere: bool = False
    rtol: float | None = None  # the task's float32 relative tolerance; None: the default


def parse(source: str) -> Node:
    return tsx.parse_cuda(source.encode()).root_node


def sole_kernel(source: str, target: Target) -> tuple[Node, Node] | None:
    """(the file's syntax tree, the target kernel) for a rewrite that changes how the
    kernel is launched: None when a launch sits in another file or the name is not one
    kernel here."""
    if target.launched_elsewhere:
        return None
    root = parse(source)
    kernels = kernels_named(root, target.kernel)
    return (root, kernels[0]) if len(kernels) == 1 else None


def splice(source: bytes, edits: list[Edit]) -> bytes:
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        source = source[:start] + new + source[end:]
    return source


def spliced(src: bytes, edits: list[Edit]) -> str | None:
    """The source with the edits, or None when there are none (the rewrite does not apply)."""
    return splice(src, edits).decode() if edits else None


def text(node: Node | None) -> str:
    return tsx.text(node)


def norm(node: Node) -> str | None:
    """The node's text without whitespace, or None when a comment sits inside it."""
    if any(n.type == "comment" for n in walk(node)):
        return None
    return "".join(text(node).split())


def walk(node: Node) -> Iterator[Node]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def named(node: Node) -> list[Node]:
    return [c for c in node.named_children if c.type != "comment"]


def field(node: Node | None, name: str) -> Node | None:
    return None if node is None else node.child_by_field_name(name)


def sole_init(decl: Node) -> tuple[Node | None, Node | None] | None:
    """(declarator, value) of a declaration with exactly one initialised declarator
    (`int i = 0;`), else None."""
    decls = decl.children_by_field_name("declarator")
    if len(decls) != 1 or decls[0].type != "init_declarator":
        return None
    return field(decls[0], "declarator"), field(decls[0], "value")


def less_than_loop(loop: Node) -> tuple[str, Node, Node, Node, Node] | None:
    """(j, start, bound, update, body) of `for (T j = start; j < bound; update) body`, the
    header every row and column loop the rewrites read has; None for any other loop."""
    init, cond, update, body = (field(loop, k)
                                for k in ("initializer", "condition", "update", "body"))
    if init is None or cond is None or update is None or body is None \
            or init.type != "declaration" or cond.type != "binary_expression":
        return None
    sole = sole_init(init)
    if sole is None or sole[1] is None:
        return None
    j, start = text(sole[0]), sole[1]
    bound = field(cond, "right")
    if bound is None or text(field(cond, "left")) != j or text(field(cond, "operator")) != "<":
        return None
    return j, start, bound, update, body


def declares_zero(decl: Node, name: str) -> bool:
    """`decl` is `T name = 0;`, zero spelt any way `ZERO_LITERALS` knows."""
    sole = sole_init(decl)
    return sole is not None and text(sole[0]) == name \
        and text(sole[1]).lower() in ZERO_LITERALS


def functions(root: Node, pattern: str = KERNEL_FN) -> list[Node]:
    return [m["fn"] for m in tsx.matches(pattern, root)]


def fn_name(fn: Node) -> str:
    return text(fn_name_node(fn))


def fn_name_node(fn: Node) -> Node | None:
    """The node of a function definition's name, through pointer and reference returns."""
    decl = field(fn, "declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = field(decl, "declarator")
    return field(decl, "declarator")


def kernels_named(root: Node, name: str) -> list[Node]:
    return [fn for fn in functions(root) if fn_name(fn) == name]


def params(fn: Node) -> list[Node]:
    decl = field(fn, "declarator")
    plist = field(decl, "parameters") if decl is not None else None
    if plist is None:
        return []
    return [p for p in named(plist) if p.type == "parameter_declaration"]


def param_name(param: Node) -> str:
    """The declared name of a parameter, through pointer and reference declarators."""
    decl = field(param, "declarator")
    while decl is not None and decl.type in ("pointer_declarator", "reference_declarator"):
        inner = field(decl, "declarator")
        if inner is None:  # a reference declarator holds its name as a plain child
            inner = next((c for c in named(decl) if c.type == "identifier"), None)
        decl = inner
    return text(decl) if decl is not None and decl.type == "identifier" else ""


def qualifiers(node: Node) -> set[str]:
    return {text(c) for c in node.children if c.type == "type_qualifier"}


def int_value(textual: str) -> int | None:
    match = re.fullmatch(r"(\d+)[uUlL]*", textual.strip())
    return int(match.group(1)) if match else None


def constants(root: Node) -> dict[str, int]:
    """Integer constants named once in the file: `#define N 128`, `constexpr int N = 128;`
    and `const int N = 128;` (a name defined twice is left out: it is ambiguous)."""
    found: dict[str, list[int | None]] = {}
    for node in walk(root):
        if node.type == "preproc_def":
            name, value = field(node, "name"), field(node, "value")
            found.setdefault(text(name), []).append(int_value(text(value)) if value else None)
        elif node.type == "declaration":
            quals = qualifiers(node)
            for d in node.children_by_field_name("declarator"):
                if d.type != "init_declarator":
                    continue
                name, value = field(d, "declarator"), field(d, "value")
                number = int_value(text(value)) if value is not None \
                    and value.type == "number_literal" else None
                if quals & {"const", "constexpr"}:
                    found.setdefault(text(name), []).append(number)
                elif name is not None:
                    found.setdefault(text(name), []).append(None)
    return {k: v[0] for k, v in found.items() if len(v) == 1 and v[0] is not None}


def value(node: Node | None, consts: Mapping[str, int]) -> int | None:
    if node is None:
        return None
    if node.type == "number_literal":
        return int_value(text(node))
    if node.type == "identifier":
        return consts.get(text(node))
    if node.type == "parenthesized_expression" and len(named(node)) == 1:
        return value(named(node)[0], consts)
    return None


def launches(root: Node, name: str) -> list[Node]:
    """The `<<<...>>>` kernel_call_syntax nodes of launches of kernel `name`."""
    out = []
    for m in tsx.matches(_LAUNCH, root):
        f = m["f"]
        callee = field(f, "name") if f.type == "template_function" else f
        if text(callee) == name:
            out.append(m["k"])
    return out


def launch_block(launch: Node, consts: Mapping[str, int]) -> int | None:
    args = named(launch)
    return value(args[1], consts) if len(args) >= 2 else None


def uniform_block(root: Node, name: str) -> int | None:
    """The one constant block size every launch of `name` in the file uses, or None."""
    consts = constants(root)
    sizes = {launch_block(k, consts) for k in launches(root, name)}
    if len(sizes) != 1:
        return None
    size = sizes.pop()
    return size if size is not None and 1 <= size <= 1024 else None


def block_values(root: Node, name: str) -> set[int] | None:
    """Every block size the launches of `name` in the file can use: a constant, or each
    branch of a conditional in the launcher (`cols >= 1024 ? 1024 : 256`); None when a
    launch's block is anything else."""
    consts = constants(root)
    out: set[int] = set()
    found = launches(root, name)
    for launch in found:
        args = named(launch)
        if len(args) < 2:
            return None
        block = strip(args[1])
        if block.type == "identifier" and value(block, consts) is None:
            block = strip(local_init(launch, text(block)) or block)
        if block.type == "conditional_expression":
            sides = [value(strip(field(block, k)), consts) for k in ("consequence", "alternative")]
        else:
            sides = [value(block, consts)]
        if any(v is None for v in sides):
            return None
        out |= {v for v in sides if v is not None}
    return out if found else None


def launch_arguments(launch: Node, kernel: Node) -> dict[str, Node] | None:
    """The launch's argument for each parameter of `kernel`, by parameter name; None when
    the counts differ (default arguments, a variadic kernel)."""
    call = launch.parent
    arglist = field(call, "arguments")
    if arglist is None:
        return None
    passed = named(arglist)
    names = [param_name(p) for p in params(kernel)]
    if len(passed) != len(names) or not all(names):
        return None
    return dict(zip(names, passed, strict=True))


def strip(node: Node | None) -> Node:
    """Remove parentheses and casts around an expression."""
    assert node is not None
    while node.type in ("parenthesized_expression", "cast_expression"):
        inner = field(node, "value") if node.type == "cast_expression" else named(node)[0]
        if inner is None:
            break
        node = inner
    return node


def enclosing_function(node: Node) -> Node | None:
    fn: Node | None = node
    while fn is not None and fn.type != "function_definition":
        fn = fn.parent
    return fn


def local_init(call: Node, name: str) -> Node | None:
    """The initialiser of `name` declared once in the function holding `call`, if the name
    is never assigned afterwards."""
    fn = enclosing_function(call)
    if fn is None:
        return None
    inits = []
    for node in walk(fn):
        if node.type == "init_declarator" and text(field(node, "declarator")) == name:
            inits.append(field(node, "value"))
        elif node.type in ("assignment_expression", "update_expression") and \
                text(field(node, "left") or field(node, "argument")) == name:
            return None
    return inits[0] if len(inits) == 1 else None


def assigned(node: Node, name: str) -> bool:
    """`name` is assigned, incremented or has its address taken anywhere under `node`."""
    for n in walk(node):
        if n.type != "identifier" or text(n) != name or n.parent is None:
            continue
        parent = n.parent
        if parent.type == "assignment_expression" and field(parent, "left") == n:
            return True
        if parent.type == "update_expression":
            return True
        if parent.type == "pointer_expression" and text(field(parent, "operator")) == "&":
            return True
    return False


def identifiers(node: Node) -> set[str]:
    return {text(n) for n in walk(node) if n.type == "identifier"}


def indent_at(src: bytes, node: Node) -> str:
    """The whitespace before `node` on its line ("" when code precedes it there)."""
    line_start = src.rfind(b"\n", 0, node.start_byte) + 1
    before = src[line_start:node.start_byte].decode()
    return before if not before.strip() else ""


def is_thread_index(fn: Node, node: Node) -> bool:
    """`node` is `threadIdx.x`, or a variable of `fn` initialised once to it."""
    if norm(node) == "threadIdx.x":
        return True
    if node.type != "identifier":
        return False
    inits = [field(d, "value") for d in walk(fn) if d.type == "init_declarator"
             and text(field(d, "declarator")) == text(node)]
    if len(inits) != 1 or inits[0] is None:
        return False
    return norm(strip(inits[0])) == "threadIdx.x"


def definition(fn: Node) -> Node:
    """The whole definition of `fn`: its `template <...>` declaration when it has one."""
    top = fn
    while top.parent is not None and top.parent.type == "template_declaration":
        top = top.parent
    return top


def insert_before_definition(fn: Node, text_: str) -> Edit:
    """An edit putting `text_` just before the definition of `fn`: before its `template`
    and the comment lines right above it, which stay with it."""
    top = definition(fn)
    while top.prev_sibling is not None and top.prev_sibling.type == "comment" \
            and top.prev_sibling.end_point[0] + 1 >= top.start_point[0]:
        top = top.prev_sibling
    return top.start_byte, top.start_byte, text_.encode()
