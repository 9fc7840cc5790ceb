"""Changing how a kernel is launched, together with the kernel: the structural rewrites
split work differently, so the grid and the block of every launch must follow.

A kernel's launches can be changed only when all of them are plain `<<<grid, block>>>`
launches in the same file, and the kernel is used nowhere else (not passed as a
function pointer, not launched from inside a macro, where tree-sitter does not see
the launch). Its `__launch_bounds__`, if any, becomes the new block size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kfbot.search.rewrites import syntax as sx

Grid = Callable[[dict[str, sx.Node]], "str | None"]  # the launch's args by parameter name


@dataclass(frozen=True)
class LaunchPlan:
    grid: Grid  # the new grid expression for one launch, or None when it cannot say
    block: str  # the new block expression
    threads: int  # threads per block, for __launch_bounds__


def kernel_launch_edits(root: sx.Node, kernel: sx.Node, plan: LaunchPlan) -> list[sx.Edit] | None:
    """The edits giving every launch of `kernel` the plan's grid and block, or None when
    a launch cannot be changed."""
    name = sx.fn_name(kernel)
    launches = sx.launches(root, name)
    if not launches or not _only_launched(root, name, len(launches)):
        return None
    edits: list[sx.Edit] = []
    for launch in launches:
        config = sx.named(launch)
        args = sx.launch_arguments(launch, kernel)
        if len(config) < 2 or args is None or any(_side_effects(a) for a in args.values()):
            return None
        grid = plan.grid(args)
        if grid is None:
            return None
        edits.append((config[0].start_byte, config[0].end_byte, grid.encode()))
        edits.append((config[1].start_byte, config[1].end_byte, plan.block.encode()))
        edits += _dead_declarations(launch, config[:2])
    return edits + bounds_edits(kernel, plan.threads)


def bounds_edits(kernel: sx.Node, threads: int, add: bool = False) -> list[sx.Edit]:
    """The kernel's `__launch_bounds__` made `threads`; with `add`, given one when it has
    none (up to 255 registers a thread for a kernel that keeps many sums in them)."""
    bounds = next((c for c in kernel.children if c.type == "launch_bounds"), None)
    text = f"__launch_bounds__({threads})".encode()
    if bounds is not None:
        return [(bounds.start_byte, bounds.end_byte, text)]
    decl = sx.field(kernel, "declarator")
    return [(decl.start_byte, decl.start_byte, text + b" ")] if add and decl is not None else []


def _only_launched(root: sx.Node, name: str, launches: int) -> bool:
    """`name` appears only where it is declared, defined or launched `<<<...>>>`."""
    uses = 0
    for node in sx.walk(root):
        if node.type in ("preproc_arg", "string_literal", "raw_string_literal") \
                and name in sx.text(node):
            return False
        if node.type != "identifier" or sx.text(node) != name:
            continue
        parent = node.parent
        if parent is not None and parent.type == "function_declarator":
            continue
        if parent is not None and parent.type == "template_function":
            parent = parent.parent
        if parent is not None and parent.type == "call_expression" \
                and any(c.type == "kernel_call_syntax" for c in parent.children):
            uses += 1
            continue
        return False
    return uses == launches


def _dead_declarations(launch: sx.Node, replaced: list[sx.Node]) -> list[sx.Edit]:
    """The declarations of grid and block variables and constants (local, or at file
    level) that nothing reads once the launch's old configuration is gone, and in turn
    those only they read."""
    fn = sx.enclosing_function(launch)
    root = launch
    while root.parent is not None:
        root = root.parent
    gone: list[sx.Node] = list(replaced)
    names = [sx.text(n) for arg in replaced for n in sx.walk(arg) if n.type == "identifier"]
    edits: list[sx.Edit] = []
    progress = True
    while progress:
        progress = False
        for name in dict.fromkeys(names):
            statement = None
            if fn is not None:
                statement = _sole_declaration(fn, name, gone, ("compound_statement",))
            if statement is None:
                statement = _sole_declaration(root, name, gone,
                                              ("translation_unit", "declaration_list"))
            if statement is None:
                continue
            gone.append(statement)
            names += [sx.text(n) for n in sx.walk(statement) if n.type == "identifier"]
            edits.append(_whole_lines(statement))
            progress = True
    return edits


def _sole_declaration(scope: sx.Node, name: str, gone: list[sx.Node],
                      containers: tuple[str, ...]) -> sx.Node | None:
    """The declaration of `name` directly in one of `containers` under `scope`, when it is
    the only use of `name` left there."""
    uses = [n for n in sx.walk(scope) if n.type in ("identifier", "type_identifier")
            and sx.text(n) == name
            and not any(g.start_byte <= n.start_byte < g.end_byte for g in gone)]
    if len(uses) != 1:
        return None
    statement = uses[0].parent
    # `dim3 block(16, 16);` is an init_declarator; `dim3 block(B, B);` with B a macro
    # parses as a function declarator (the most vexing parse): both declare `block`.
    if statement is not None and statement.type in ("init_declarator", "function_declarator") \
            and sx.field(statement, "declarator") == uses[0]:
        statement = statement.parent
    if statement is None or statement.type != "declaration" \
            or len(statement.children_by_field_name("declarator")) != 1 \
            or statement.parent is None or statement.parent.type not in containers:
        return None
    return statement


def _whole_lines(statement: sx.Node) -> sx.Edit:
    """The edit deleting a statement, with its line when it stands alone on it."""
    block = statement.parent
    assert block is not None
    text, base = sx.text(block).encode(), block.start_byte
    start, end = statement.start_byte - base, statement.end_byte - base
    line_start = text.rfind(b"\n", 0, start) + 1
    line_end = text.find(b"\n", end)
    if not text[line_start:start].strip() and line_end >= 0 and not text[end:line_end].strip():
        return base + line_start, base + line_end + 1, b""
    return statement.start_byte, statement.end_byte, b""


def _side_effects(arg: sx.Node) -> bool:
    return any(n.type in ("assignment_expression", "update_expression") for n in sx.walk(arg))


Condition = Callable[[dict[str, sx.Node]], "tuple[str, str] | None"]


@dataclass(frozen=True)
class Dispatch:
    """Small problems keep the original kernel: a launch becomes a choice between it,
    copied under another name and launched as written, and the rewritten kernel."""

    small: str  # the copy's name
    # (a declaration computing the launch's amount of work, the condition that chooses
    # the copy), in the launch's own expressions; None when they cannot be said
    condition: Condition
    why: str  # a comment on the choice


def dispatched_launch_edits(root: sx.Node, kernel: sx.Node, plan: LaunchPlan,
                            dispatch: Dispatch) -> list[sx.Edit] | None:
    """The edits turning every `kernel<<<...>>>(...);` statement into `if (small work)`
    the copy with the launch as written `else` the kernel with the plan's grid and block,
    which gets `__launch_bounds__` of the plan's threads; None when a launch is not a
    statement of its own or cannot be changed."""
    name = sx.fn_name(kernel)
    launches = sx.launches(root, name)
    if not launches or not _only_launched(root, name, len(launches)):
        return None
    src = root.text or b""
    edits: list[sx.Edit] = []
    for launch in launches:
        edit = _dispatched(src, launch, kernel, plan, dispatch)
        if edit is None:
            return None
        edits.append(edit)
    # The copy keeps the original's bounds, from the text copied.
    return edits + bounds_edits(kernel, plan.threads, add=True)


def _dispatched(src: bytes, launch: sx.Node, kernel: sx.Node, plan: LaunchPlan,
                dispatch: Dispatch) -> sx.Edit | None:
    call = launch.parent
    statement = call.parent if call is not None else None
    config, args = sx.named(launch), sx.launch_arguments(launch, kernel)
    if call is None or statement is None or statement.type != "expression_statement" \
            or len(config) < 2 or args is None or any(_side_effects(a) for a in args.values()):
        return None
    grid, chosen = plan.grid(args), dispatch.condition(args)
    function = sx.field(call, "function")
    callee = sx.field(function, "name") if function is not None \
        and function.type == "template_function" else function
    if grid is None or chosen is None or callee is None:
        return None
    base, text = call.start_byte, (call.text or b"")
    small = sx.splice(text, [(callee.start_byte - base, callee.end_byte - base,
                              dispatch.small.encode())]).decode()
    tiled = sx.splice(text, [(config[0].start_byte - base, config[0].end_byte - base,
                              grid.encode()),
                             (config[1].start_byte - base, config[1].end_byte - base,
                              plan.block.encode())]).decode()
    work, condition = chosen
    ind = sx.indent_at(src, statement)
    lines = ["{", f"    {work}", f"    if ({condition}) {{  // {dispatch.why}",
             f"        {small};", "    } else {", f"        {tiled};", "    }", "}"]
    return statement.start_byte, statement.end_byte, ("\n" + ind).join(lines).encode()
