"""Expert rewrites: rules/rewrites.yaml names them, this module implements them.

Each rewrite finds nodes with tree-sitter (CUDA grammar) and splices text by byte
ranges, so a comment or a string that mentions a trigger never triggers anything. A
rewrite that does not apply returns None and proposes nothing; every rewrite is
idempotent (its own output no longer has the shape it rewrites).

For a load_inline `.py` file the rewrite is applied to the CUDA source held in a string
literal (the assignment whose value is a string containing `__global__`), found with
`ast`; only a literal whose source text equals its value (a raw string, or one without
backslashes) is rewritten, so splicing it back cannot change its meaning.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from kfbot.datafiles import check_unique_ids, read_entries, rules_dir
from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import NVCC_FLAGS_PARAM, Candidate
from kfbot.scan import treesitter as tsx

REWRITES_FILE = "rewrites.yaml"
FAST_MATH_FLAG = "--use_fast_math"
CUDA_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp")

_KEYS = frozenset({"id", "what", "why", "applies-when", "rewrite"})
_REQUIRED = ("id", "what", "why", "applies-when", "rewrite")
_ID = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")

Node = tsx.Node
Edit = tuple[int, int, bytes]  # (start byte, end byte, replacement)


@dataclass(frozen=True)
class Rewrite:
    id: str
    what: str
    why: str
    applies_when: str
    rewrite: str


# --- loading -------------------------------------------------------------------------------


def load_rewrites(path: Path | None = None) -> tuple[Rewrite, ...]:
    """The rewrites in `path` (default: the shipped rules/rewrites.yaml, read once)."""
    if path is None:
        return _default_rewrites()
    return _load(path)


@cache
def _default_rewrites() -> tuple[Rewrite, ...]:
    return _load(rules_dir() / REWRITES_FILE)


def _load(path: Path) -> tuple[Rewrite, ...]:
    out = tuple(_entry(path, i, e) for i, e in enumerate(read_entries(path, "rewrite")))
    check_unique_ids(path, "rewrite", (r.id for r in out))
    return out


def _entry(path: Path, index: int, entry: Any) -> Rewrite:
    name = entry.get("id") if isinstance(entry, dict) else None
    label = f"rewrite {name}" if isinstance(name, str) and name else f"rewrite #{index + 1}"

    def fail(problem: str) -> KfbotError:
        return KfbotError(f"{path}: {label}: {problem}")

    if not isinstance(entry, dict):
        raise fail("expected a mapping of keys to values")
    unknown = sorted(str(k) for k in entry if k not in _KEYS)
    if unknown:
        raise fail(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KEYS))}")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise fail(f"missing {', '.join(missing)}")
    values = {}
    for key in _REQUIRED:
        value = entry[key]
        if not isinstance(value, str) or not value.strip() or "\n" in value.strip():
            raise fail(f"`{key}` must be one non-empty line of text")
        values[key] = value.strip()
    if not _ID.match(values["id"]):
        raise fail("the id must be kebab-case (lower-case words joined by '-')")
    if values["rewrite"] not in IMPLEMENTATIONS:
        raise fail(f"unknown rewrite {values['rewrite']!r}; known: "
                   f"{', '.join(sorted(IMPLEMENTATIONS))}")
    return Rewrite(id=values["id"], what=values["what"], why=values["why"],
                   applies_when=values["applies-when"], rewrite=values["rewrite"])


# --- proposing -----------------------------------------------------------------------------


def propose_rewrites(files: Mapping[str, str], editable: Sequence[str], parent: Candidate,
                     rewrites: Sequence[Rewrite] | None = None) -> list[Candidate]:
    """One candidate per rewrite that applies to at least one editable file (or the params)."""
    chosen = load_rewrites() if rewrites is None else rewrites
    paths = [p for p in editable if p in files]
    out: list[Candidate] = []
    for rewrite in chosen:
        rationale = f"{rewrite.id}: {rewrite.what}"
        if rewrite.rewrite in PARAM_REWRITES:
            params = PARAM_REWRITES[rewrite.rewrite]({p: files[p] for p in paths}, parent.params)
            if params is not None:
                out.append(Candidate(files=dict(parent.files), params=params, origin="rules",
                                     parent=parent.hash, rationale=rationale))
            continue
        fn = SOURCE_REWRITES[rewrite.rewrite]
        changed: dict[str, str] = {}
        for path in paths:
            new = apply_to_file(fn, path, files[path])
            if new is not None and new != files[path]:
                changed[path] = new
        if changed:
            out.append(Candidate(files={**parent.files, **changed}, params=dict(parent.params),
                                 origin="rules", parent=parent.hash, rationale=rationale))
    return out


SourceRewrite = Callable[[str], "str | None"]
ParamRewrite = Callable[[Mapping[str, str], Mapping[str, str]], "dict[str, str] | None"]


def apply_to_file(fn: SourceRewrite, path: str, content: str) -> str | None:
    """Apply a source rewrite to a C++/CUDA file, or to the CUDA string of a `.py` file."""
    if path.endswith(".py"):
        return _apply_to_python(fn, content)
    if path.endswith(CUDA_SUFFIXES):
        return fn(content)
    return None


def _apply_to_python(fn: SourceRewrite, content: str) -> str | None:
    found = _cuda_literal(content)
    if found is None:
        return None
    start, end, prefix, quote, value = found
    new_value = fn(value)
    if new_value is None or new_value == value:
        return None
    raw = "r" in prefix.lower()
    if quote in new_value or new_value.endswith(quote[0]) or (not raw and "\\" in new_value):
        return None
    new = content[:start] + prefix + quote + new_value + quote + content[end:]
    check = _cuda_literal(new)
    return new if check is not None and check[4] == new_value else None


def _cuda_literal(content: str) -> tuple[int, int, str, str, str] | None:
    """(start, end, prefix, quote, value) of the one string assigned that holds a kernel."""
    try:
        tree = ast.parse(content)
    except SyntaxError:
        return None
    lines = content.splitlines(keepends=True)
    starts = [0]
    for text in lines:
        starts.append(starts[-1] + len(text.encode("utf-8")))
    raw_bytes = content.encode("utf-8")
    hits = []
    for node in ast.walk(tree):
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str) \
                and "__global__" in value.value and value.end_lineno is not None \
                and value.end_col_offset is not None:
            begin = starts[value.lineno - 1] + value.col_offset
            finish = starts[value.end_lineno - 1] + value.end_col_offset
            hits.append((begin, finish, value.value))
    if len(hits) != 1:
        return None
    begin, finish, value_text = hits[0]
    source = raw_bytes[begin:finish].decode("utf-8")
    match = re.fullmatch(r"([rRuU]?)(\"\"\"|'''|\"|')(.*)\2", source, flags=re.DOTALL)
    if match is None:
        return None  # implicit concatenation, f-string or bytes: left alone
    prefix, quote, body = match.groups()
    if body != value_text:
        return None  # escapes make the source differ from the value
    start = len(raw_bytes[:begin].decode("utf-8"))
    end = len(raw_bytes[:finish].decode("utf-8"))
    return start, end, prefix, quote, body


# --- tree helpers --------------------------------------------------------------------------

_DEVICE_FN = '(function_definition ["__global__" "__device__"]) @fn'
_KERNEL_FN = '(function_definition "__global__") @fn'
_LAUNCH = "(call_expression function: (_) @f (kernel_call_syntax) @k) @call"


def _splice(source: bytes, edits: list[Edit]) -> bytes:
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        source = source[:start] + new + source[end:]
    return source


def _t(node: Node | None) -> str:
    return tsx.text(node)


def _norm(node: Node) -> str | None:
    """The node's text without whitespace, or None when a comment sits inside it."""
    if any(n.type == "comment" for n in _walk(node)):
        return None
    return "".join(_t(node).split())


def _walk(node: Node) -> Iterator[Node]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def _named(node: Node) -> list[Node]:
    return [c for c in node.named_children if c.type != "comment"]


def _field(node: Node | None, name: str) -> Node | None:
    return None if node is None else node.child_by_field_name(name)


def _functions(root: Node, pattern: str) -> list[Node]:
    return [m["fn"] for m in tsx.matches(pattern, root)]


def _fn_name(fn: Node) -> str:
    decl = _field(fn, "declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = _field(decl, "declarator")
    return _t(_field(decl, "declarator"))


def _params(fn: Node) -> list[Node]:
    decl = _field(fn, "declarator")
    plist = _field(decl, "parameters") if decl is not None else None
    if plist is None:
        return []
    return [p for p in _named(plist) if p.type == "parameter_declaration"]


def _int(textual: str) -> int | None:
    match = re.fullmatch(r"(\d+)[uUlL]*", textual.strip())
    return int(match.group(1)) if match else None


def _constants(root: Node) -> dict[str, int]:
    """Integer constants named once in the file: `#define N 128`, `constexpr int N = 128;`
    and `const int N = 128;` (a name defined twice is left out: it is ambiguous)."""
    found: dict[str, list[int | None]] = {}
    for node in _walk(root):
        if node.type == "preproc_def":
            name, value = _field(node, "name"), _field(node, "value")
            found.setdefault(_t(name), []).append(_int(_t(value)) if value else None)
        elif node.type == "declaration":
            quals = {_t(c) for c in node.children if c.type == "type_qualifier"}
            for d in node.children_by_field_name("declarator"):
                if d.type != "init_declarator":
                    continue
                name, value = _field(d, "declarator"), _field(d, "value")
                number = _int(_t(value)) if value is not None \
                    and value.type == "number_literal" else None
                if quals & {"const", "constexpr"}:
                    found.setdefault(_t(name), []).append(number)
                elif name is not None:
                    found.setdefault(_t(name), []).append(None)
    return {k: v[0] for k, v in found.items() if len(v) == 1 and v[0] is not None}


def _value(node: Node | None, constants: Mapping[str, int]) -> int | None:
    if node is None:
        return None
    if node.type == "number_literal":
        return _int(_t(node))
    if node.type == "identifier":
        return constants.get(_t(node))
    if node.type == "parenthesized_expression" and len(_named(node)) == 1:
        return _value(_named(node)[0], constants)
    return None


def _launches(root: Node, name: str) -> list[Node]:
    """The `<<<...>>>` kernel_call_syntax nodes of launches of kernel `name`."""
    out = []
    for m in tsx.matches(_LAUNCH, root):
        f = m["f"]
        callee = _field(f, "name") if f.type == "template_function" else f
        if _t(callee) == name:
            out.append(m["k"])
    return out


def _launch_block(launch: Node, constants: Mapping[str, int]) -> int | None:
    args = _named(launch)
    return _value(args[1], constants) if len(args) >= 2 else None


def _uniform_block(root: Node, name: str) -> int | None:
    constants = _constants(root)
    sizes = {_launch_block(k, constants) for k in _launches(root, name)}
    if len(sizes) != 1:
        return None
    size = sizes.pop()
    return size if size is not None and 1 <= size <= 1024 else None


# --- 1. restrict-pointers --------------------------------------------------------------------


def restrict_pointers(source: str) -> str | None:
    src = source.encode()
    root = tsx.parse_cuda(src).root_node
    declared = {_fn_name(d.parent) for d in _walk(root)
                if d.type == "function_declarator" and d.parent is not None
                and d.parent.type != "function_definition"}
    edits: list[Edit] = []
    for fn in _functions(root, _KERNEL_FN):
        body = _field(fn, "body")
        for param in _params(fn):
            ptr = _field(param, "declarator")
            if ptr is None or ptr.type != "pointer_declarator":
                continue
            inner = _field(ptr, "declarator")
            if inner is None or inner.type != "identifier":
                continue  # pointer to pointer, function pointer, ...
            quals = {_t(c) for c in ptr.children if c.type == "type_qualifier"}
            if "__restrict__" not in quals and "restrict" not in quals:
                edits.append((inner.start_byte, inner.start_byte, b"__restrict__ "))
            consts = {_t(c) for c in param.children if c.type == "type_qualifier"}
            type_node = _field(param, "type")
            if "const" not in consts and type_node is not None and body is not None \
                    and _fn_name(fn) not in declared and _only_read(body, _t(inner)):
                edits.append((type_node.start_byte, type_node.start_byte, b"const "))
    return _splice(src, edits).decode() if edits else None


def _only_read(body: Node, name: str) -> bool:
    """Every use of `name` in `body` is a read `name[...]` (never a write, never escaping)."""
    for node in _walk(body):
        if node.type != "identifier" or _t(node) != name:
            continue
        parent = node.parent
        if parent is None or parent.type != "subscript_expression" \
                or _field(parent, "argument") != node:
            return False
        user = parent.parent
        if user is None:
            return False
        if user.type == "assignment_expression" and _field(user, "left") == parent:
            return False
        if user.type == "update_expression" or (
                user.type == "pointer_expression" and _t(_field(user, "operator")) == "&"):
            return False
    return True


# --- 2. launch-bounds ------------------------------------------------------------------------


def launch_bounds(source: str) -> str | None:
    src = source.encode()
    root = tsx.parse_cuda(src).root_node
    edits: list[Edit] = []
    for fn in _functions(root, _KERNEL_FN):
        if any(c.type == "launch_bounds" for c in fn.children):
            continue
        size = _uniform_block(root, _fn_name(fn))
        decl = _field(fn, "declarator")
        if size is None or decl is None:
            continue
        edits.append((decl.start_byte, decl.start_byte, f"__launch_bounds__({size}) ".encode()))
    return _splice(src, edits).decode() if edits else None


# --- 3. unroll-constant-loops ----------------------------------------------------------------

_MAX_UNROLL = 64


def unroll_constant_loops(source: str) -> str | None:
    src = source.encode()
    root = tsx.parse_cuda(src).root_node
    constants = _constants(root)
    edits: list[Edit] = []
    for fn in _functions(root, _DEVICE_FN):
        templ = _template_ints(fn)
        for loop in _walk(fn):
            if loop.type != "for_statement" or not _constant_trip(loop, constants, templ):
                continue
            if loop.parent is None or loop.parent.type != "compound_statement":
                continue
            prev = loop.prev_named_sibling
            while prev is not None and prev.type == "comment":
                prev = prev.prev_named_sibling
            if prev is not None and prev.type == "preproc_call" \
                    and _t(_field(prev, "directive")) == "#pragma":
                continue
            line_start = src.rfind(b"\n", 0, loop.start_byte) + 1
            indent = src[line_start:loop.start_byte]
            if indent.strip():
                continue
            edits.append((loop.start_byte, loop.start_byte, b"#pragma unroll\n" + indent))
    return _splice(src, edits).decode() if edits else None


def _template_ints(fn: Node) -> set[str]:
    parent = fn.parent
    if parent is None or parent.type != "template_declaration":
        return set()
    plist = _field(parent, "parameters")
    names = set()
    for p in _named(plist) if plist is not None else []:
        if p.type in ("parameter_declaration", "optional_parameter_declaration") \
                and _t(_field(p, "type")) in ("int", "unsigned", "size_t", "int64_t"):
            names.add(_t(_field(p, "declarator")))
    return names


def _constant_trip(loop: Node, constants: Mapping[str, int], templ: set[str]) -> bool:
    init, cond, update = (_field(loop, k) for k in ("initializer", "condition", "update"))
    if init is None or cond is None or update is None:
        return False
    if init.type == "declaration":
        decls = init.children_by_field_name("declarator")
        if len(decls) != 1 or decls[0].type != "init_declarator":
            return False
        var, start = _field(decls[0], "declarator"), _field(decls[0], "value")
    elif init.type == "assignment_expression" and _t(_field(init, "operator")) == "=":
        var, start = _field(init, "left"), _field(init, "right")
    else:
        return False
    name = _t(var)
    if var is None or var.type != "identifier" or cond.type != "binary_expression" \
            or _t(_field(cond, "left")) != name \
            or _t(_field(cond, "operator")) not in ("<", "<=", ">", ">=", "!="):
        return False
    bound = _field(cond, "right")

    def known(node: Node | None) -> int | str | None:
        """The value, "template" for a template int, None when not a constant."""
        value = _value(node, constants)
        if value is not None:
            return value
        if node is not None and node.type == "identifier" and _t(node) in templ:
            return "template"
        return None

    lo, hi = known(start), known(bound)
    if lo is None or hi is None:
        return False
    if update.type == "update_expression":
        if _t(_field(update, "argument")) != name:
            return False
        step = 1
    elif update.type == "assignment_expression" and _t(_field(update, "left")) == name \
            and _t(_field(update, "operator")) in ("+=", "-="):
        value = _value(_field(update, "right"), constants)
        if value is None or value == 0:
            return False
        step = value
    else:
        return False
    body = _field(loop, "body")
    if body is not None and any(n.type == "identifier" and _t(n) == name
                                and n.parent is not None and (
                                    (n.parent.type == "assignment_expression"
                                     and _field(n.parent, "left") == n)
                                    or n.parent.type == "update_expression")
                                for n in _walk(body)):
        return False  # the body moves the counter: the trip count is not the loop header's
    if isinstance(lo, str) or isinstance(hi, str):
        return True  # a template int: constant per instantiation
    return abs(hi - lo) // step <= _MAX_UNROLL


# --- 4./5. the elementwise kernel shape --------------------------------------------------------

_INDEX = re.compile(
    r"(\((int|unsigned|int64_t|size_t|long|longlong|unsignedint|uint64_t)\))?"
    r"(blockIdx\.x\*blockDim\.x|blockDim\.x\*blockIdx\.x)\+threadIdx\.x"
    r"|threadIdx\.x\+(\((int|unsigned|int64_t|size_t|long|longlong|unsignedint|uint64_t)\))?"
    r"(blockIdx\.x\*blockDim\.x|blockDim\.x\*blockIdx\.x)")


@dataclass(frozen=True)
class _Elementwise:
    fn: Node
    decl: Node  # `T i = blockIdx.x * blockDim.x + threadIdx.x;`
    branch: Node  # `if (i < n) body`
    var: str
    var_type: str
    bound: str
    body: Node


def _elementwise(fn: Node) -> _Elementwise | None:
    body = _field(fn, "body")
    if body is None:
        return None
    stmts = _named(body)
    if len(stmts) != 2 or stmts[0].type != "declaration" or stmts[1].type != "if_statement":
        return None
    decl, branch = stmts
    if any(c.type in ("type_qualifier", "storage_class_specifier") for c in decl.children):
        return None
    decls = decl.children_by_field_name("declarator")
    if len(decls) != 1 or decls[0].type != "init_declarator":
        return None
    var, value = _field(decls[0], "declarator"), _field(decls[0], "value")
    if var is None or var.type != "identifier" or value is None:
        return None
    norm = _norm(value)
    if norm is None or not _INDEX.fullmatch(norm):
        return None
    if _field(branch, "alternative") is not None:
        return None
    cond = _field(_field(branch, "condition"), "value")
    then = _field(branch, "consequence")
    if cond is None or then is None or cond.type != "binary_expression" \
            or _t(_field(cond, "operator")) != "<" or _t(_field(cond, "left")) != _t(var):
        return None
    bound = _field(cond, "right")
    if bound is None or bound.type != "identifier":
        return None
    for node in _walk(then):
        if node.type in ("return_statement", "break_statement", "continue_statement",
                         "goto_statement"):
            return None
        if node.type == "identifier" and _t(node) in ("__syncthreads", "__syncwarp"):
            return None
        if node.type == "identifier" and _t(node) in (_t(var), _t(bound)) \
                and node.parent is not None and (
                    (node.parent.type == "assignment_expression"
                     and _field(node.parent, "left") == node)
                    or node.parent.type in ("update_expression", "pointer_expression")):
            return None
    return _Elementwise(fn=fn, decl=decl, branch=branch, var=_t(var),
                        var_type=_t(_field(decl, "type")), bound=_t(bound), body=then)


def grid_stride_loop(source: str) -> str | None:
    src = source.encode()
    root = tsx.parse_cuda(src).root_node
    edits: list[Edit] = []
    for fn in _functions(root, _KERNEL_FN):
        shape = _elementwise(fn)
        if shape is None:
            continue
        init = src[shape.decl.start_byte:shape.decl.end_byte].decode().rstrip().rstrip(";")
        body = _t(shape.body)
        i, t = shape.var, shape.var_type
        loop = f"for ({init}; {i} < {shape.bound}; {i} += ({t})blockDim.x * gridDim.x) {body}"
        edits.append((shape.decl.start_byte, shape.branch.end_byte, loop.encode()))
    return _splice(src, edits).decode() if edits else None


def vectorize_float4(source: str) -> str | None:
    src = source.encode()
    root = tsx.parse_cuda(src).root_node
    edits: list[Edit] = []
    for fn in _functions(root, _KERNEL_FN):
        shape = _elementwise(fn)
        if shape is None or _field(fn.parent, "parameters") is not None:
            continue  # not the shape, or a template kernel
        plan = _float4_plan(shape)
        if plan is None:
            continue
        inputs, outputs, subscripts = plan
        launch_edit = _quarter_grid(root, shape)
        if launch_edit is None:
            continue
        edits.append((shape.decl.start_byte, shape.branch.end_byte,
                      _float4_body(src, shape, inputs, outputs, subscripts).encode()))
        edits.append(launch_edit)
    return _splice(src, edits).decode() if edits else None


def _float4_plan(shape: _Elementwise) -> tuple[list[str], list[str], list[Node]] | None:
    """Inputs, outputs and the `p[i]` nodes of a kernel whose pointers are all `float*`,
    read only as `x[i]` or written only as a top-level `y[i] = ...;` (once each)."""
    pointers: dict[str, bool] = {}  # name -> const
    for param in _params(shape.fn):
        decl = _field(param, "declarator")
        if decl is not None and decl.type == "pointer_declarator":
            inner = _field(decl, "declarator")
            if _t(_field(param, "type")) != "float" or inner is None \
                    or inner.type != "identifier":
                return None
            pointers[_t(inner)] = "const" in {_t(c) for c in param.children
                                              if c.type == "type_qualifier"}
    if shape.var in pointers or shape.bound in pointers:
        return None
    top = _named(shape.body) if shape.body.type == "compound_statement" else [shape.body]
    reads: set[str] = set()
    writes: list[str] = []
    subscripts: list[Node] = []
    for node in _walk(shape.body):
        if node.type != "identifier":
            continue
        name = _t(node)
        if name == shape.var:
            holder = node.parent.parent if node.parent is not None else None
            if node.parent is None or node.parent.type != "subscript_argument_list" \
                    or holder is None or _t(_field(holder, "argument")) not in pointers:
                return None
            continue  # the `i` of a `p[i]`, checked from its pointer
        if name not in pointers:
            continue
        sub = node.parent
        if sub is None or sub.type != "subscript_expression":
            return None
        indices = _field(sub, "indices")
        index = _named(indices) if indices is not None else []
        if len(index) != 1 or index[0].type != "identifier" or _t(index[0]) != shape.var:
            return None
        target = _t(_field(sub, "argument"))
        if _field(sub, "argument") != node:
            return None
        subscripts.append(sub)
        user = sub.parent
        if user is not None and user.type == "assignment_expression" \
                and _field(user, "left") == sub:
            statement = user.parent
            if _t(_field(user, "operator")) != "=" or statement is None \
                    or statement not in top or statement.type != "expression_statement":
                return None
            writes.append(target)
        else:
            reads.add(target)
    outputs = sorted(set(writes))
    if not outputs or len(writes) != len(outputs) or reads & set(outputs) \
            or any(pointers[o] for o in outputs):
        return None
    return sorted(reads), outputs, subscripts


def _float4_body(src: bytes, shape: _Elementwise, inputs: list[str], outputs: list[str],
                 subscripts: list[Node]) -> str:
    body = shape.body

    def scalar(replace: Callable[[str], str], extra: int = 8) -> str:
        edits = [(s.start_byte - body.start_byte, s.end_byte - body.start_byte,
                  replace(_t(_field(s, "argument"))).encode()) for s in subscripts]
        out = _splice(src[body.start_byte:body.end_byte], edits).decode()
        out = out.replace("\n", "\n" + " " * extra)
        return out if body.type == "compound_statement" else "{ " + out + " }"

    line_start = src.rfind(b"\n", 0, shape.decl.start_byte) + 1
    ind = src[line_start:shape.decl.start_byte].decode()
    ind = ind if not ind.strip() else "    "
    i, n, t = shape.var, shape.bound, shape.var_type
    decl = src[shape.decl.start_byte:shape.decl.end_byte].decode()
    pointers = inputs + outputs
    aligned = " | ".join(f"reinterpret_cast<unsigned long long>({p})" for p in pointers)
    lines = [decl,
             f"// {i} indexes float4 groups: elements 4*{i} .. 4*{i}+3, then a scalar tail.",
             f"if ((({aligned}) & 15ull) == 0) {{",
             f"    if ({i} < {n} / 4) {{"]
    for p in inputs:
        lines.append(f"        const float4 {p}_v4 = reinterpret_cast<const float4*>({p})[{i}];")
    for p in outputs:
        lines.append(f"        float4 {p}_v4;")
    for lane in "xyzw":
        lines.append("        " + scalar(_lane_of(lane)))
    for p in outputs:
        lines.append(f"        reinterpret_cast<float4*>({p})[{i}] = {p}_v4;")
    lines += ["    }",
              f"    if ({i} < {n} % 4) {{",
              f"        const {t} {i}_s = {n} / 4 * 4 + {i};",
              "        " + scalar(lambda p: f"{p}[{i}_s]"),
              "    }",
              "} else {",
              f"    for ({t} {i}_s = {i} * 4; {i}_s < {i} * 4 + 4 && {i}_s < {n}; ++{i}_s) "
              + scalar(lambda p: f"{p}[{i}_s]", 4),
              "}"]
    return ("\n" + ind).join(lines)


def _lane_of(lane: str) -> Callable[[str], str]:
    return lambda p: f"{p}_v4.{lane}"


def _quarter_grid(root: Node, shape: _Elementwise) -> Edit | None:
    """The edit turning the launcher's `(n + B - 1) / B` grid into `((n + 3) / 4 + B - 1) / B`,
    when the kernel has one launch in the file with a constant block size B >= 4."""
    name = _fn_name(shape.fn)
    launches = _launches(root, name)
    if len(launches) != 1:
        return None
    launch = launches[0]
    constants = _constants(root)
    block = _launch_block(launch, constants)
    args = _named(launch)
    if block is None or block < 4 or len(args) != 2:
        return None
    call = launch.parent
    if call is None:
        return None
    arglist = _field(call, "arguments")
    params = [_t(_field(p, "declarator")) for p in _params(shape.fn)]
    if arglist is None or shape.bound not in params:
        return None
    passed = _named(arglist)
    if len(passed) != len(params):
        return None
    n_arg = passed[params.index(shape.bound)]
    if n_arg.type != "identifier":
        return None
    grid = _strip(args[0])
    if grid.type == "identifier":
        grid_def = _local_init(call, _t(grid))
        if grid_def is None:
            return None
        grid = _strip(grid_def)
    # (N + B - 1) / B
    if grid.type != "binary_expression" or _t(_field(grid, "operator")) != "/":
        return None
    num, den = _strip(_field(grid, "left")), _field(grid, "right")
    if _value(den, constants) != block or num.type != "binary_expression" \
            or _t(_field(num, "operator")) != "-" or _value(_field(num, "right"), constants) != 1:
        return None
    plus = _strip(_field(num, "left"))
    if plus.type != "binary_expression" or _t(_field(plus, "operator")) != "+" \
            or _value(_field(plus, "right"), constants) != block:
        return None
    count = _field(plus, "left")
    if count is None or count.type != "identifier" or _t(count) != _t(n_arg):
        return None
    return count.start_byte, count.end_byte, f"({_t(count)} + 3) / 4".encode()


def _strip(node: Node | None) -> Node:
    """Remove parentheses and casts around an expression."""
    assert node is not None
    while node.type in ("parenthesized_expression", "cast_expression"):
        inner = _field(node, "value") if node.type == "cast_expression" else _named(node)[0]
        if inner is None:
            break
        node = inner
    return node


def _local_init(call: Node, name: str) -> Node | None:
    """The initialiser of `name` declared once in the function holding `call`, if the name
    is never assigned afterwards."""
    fn: Node | None = call
    while fn is not None and fn.type != "function_definition":
        fn = fn.parent
    if fn is None:
        return None
    inits = []
    for node in _walk(fn):
        if node.type == "init_declarator" and _t(_field(node, "declarator")) == name:
            inits.append(_field(node, "value"))
        elif node.type in ("assignment_expression", "update_expression") and \
                _t(_field(node, "left") or _field(node, "argument")) == name:
            return None
    return inits[0] if len(inits) == 1 else None


# --- 6. warp-shuffle-reduction -----------------------------------------------------------------

_COMBINE = {"fmaxf", "fminf", "max", "min", "fmax", "fmin"}


def warp_shuffle_reduction(source: str) -> str | None:
    src = source.encode()
    root = tsx.parse_cuda(src).root_node
    edits: list[Edit] = []
    for fn in _functions(root, _KERNEL_FN):
        size = _uniform_block(root, _fn_name(fn))
        if size is None or size < 32 or size & (size - 1):
            continue  # needs a power-of-two block of whole warps, known from every launch
        for loop in _walk(fn):
            if loop.type == "for_statement":
                edit = _reduction(src, fn, loop)
                if edit is not None:
                    edits.extend(edit)
    return _splice(src, edits).decode() if edits else None


def _reduction(src: bytes, fn: Node, loop: Node) -> list[Edit] | None:
    init, cond, update, body = (_field(loop, k)
                                for k in ("initializer", "condition", "update", "body"))
    if init is None or cond is None or update is None or body is None \
            or init.type != "declaration" or body.type != "compound_statement":
        return None
    decls = init.children_by_field_name("declarator")
    if len(decls) != 1 or decls[0].type != "init_declarator":
        return None
    s = _t(_field(decls[0], "declarator"))
    start = _field(decls[0], "value")
    if start is None or _norm(start) not in ("blockDim.x/2", "blockDim.x>>1"):
        return None
    zero = _field(cond, "right")
    if cond.type != "binary_expression" or _t(_field(cond, "left")) != s \
            or _t(_field(cond, "operator")) != ">" or zero is None or _t(zero) != "0":
        return None
    if _norm(update) not in (f"{s}>>=1", f"{s}/=2"):
        return None
    stmts = _named(body)
    if len(stmts) != 2 or stmts[0].type != "if_statement" \
            or _norm(stmts[1]) != "__syncthreads();":
        return None
    branch = stmts[0]
    if _field(branch, "alternative") is not None:
        return None
    guard = _field(_field(branch, "condition"), "value")
    step = _field(branch, "consequence")
    if step is not None and step.type == "compound_statement" and len(_named(step)) == 1:
        step = _named(step)[0]
    if guard is None or step is None or step.type != "expression_statement" \
            or guard.type != "binary_expression" or _t(_field(guard, "operator")) != "<" \
            or _t(_field(guard, "right")) != s:
        return None
    tid_node = _field(guard, "left")
    if tid_node is None or not _is_thread_index(fn, tid_node):
        return None
    tid = _t(tid_node)
    norm = _norm(step)
    array = _t(_field(_field(_named(step)[0], "left"), "argument")) if _named(step) else ""
    if not array or norm is None:
        return None
    a, st = re.escape(array), re.escape(s)
    t = re.escape("".join(tid.split()))
    combine: str | None = None
    if re.fullmatch(rf"{a}\[{t}\]\+={a}\[{t}\+{st}\];", norm):
        combine = "+"
    else:
        match = re.fullmatch(rf"{a}\[{t}\]=(\w+)\({a}\[{t}\],{a}\[{t}\+{st}\]\);", norm)
        if match and match.group(1) in _COMBINE:
            combine = match.group(1)
    elem = _shared_type(fn, array)
    if combine is None or elem is None:
        return None

    def fold(other: str) -> str:
        return f"v += {other};" if combine == "+" else f"v = {combine}(v, {other});"

    line_start = src.rfind(b"\n", 0, loop.start_byte) + 1
    ind = src[line_start:loop.start_byte].decode()
    ind = ind if not ind.strip() else ""
    warp = [f"if ({tid} < 32) {{",
            f"    {elem} v = {array}[{tid}];",
            f"    if (blockDim.x >= 64) {fold(f'{array}[{tid} + 32]')}",
            "    for (int offset = 16; offset > 0; offset >>= 1)",
            f"        {fold('__shfl_down_sync(0xffffffffu, v, offset)')}",
            f"    if ({tid} == 0) {array}[0] = v;",
            "}",
            "__syncthreads();"]
    tail = ("\n" + ind + ("\n" + ind).join(warp)).encode()
    return [(zero.start_byte, zero.end_byte, b"32"), (loop.end_byte, loop.end_byte, tail)]


def _is_thread_index(fn: Node, node: Node) -> bool:
    if _norm(node) == "threadIdx.x":
        return True
    if node.type != "identifier":
        return False
    inits = [_field(d, "value") for d in _walk(fn) if d.type == "init_declarator"
             and _t(_field(d, "declarator")) == _t(node)]
    if len(inits) != 1 or inits[0] is None:
        return False
    value = inits[0]
    return _norm(_strip(value)) == "threadIdx.x"


def _shared_type(fn: Node, array: str) -> str | None:
    for node in _walk(fn):
        if node.type != "declaration" or "__shared__" not in {
                _t(c) for c in node.children if c.type == "type_qualifier"}:
            continue
        for d in node.children_by_field_name("declarator"):
            if d.type == "array_declarator" and _t(_field(d, "declarator")) == array:
                kind = _t(_field(node, "type"))
                return kind if kind in ("float", "double", "int", "unsigned", "unsigned int",
                                        "long long", "int64_t") else None
    return None


# --- 7. fast-math-flags --------------------------------------------------------------------------


def fast_math_flags(files: Mapping[str, str], params: Mapping[str, str]) -> dict[str, str] | None:
    current = params.get(NVCC_FLAGS_PARAM, "")
    if "use_fast_math" in current:
        return None
    has_kernel = False
    for path, content in files.items():
        if path.endswith(".py"):
            if _python_mentions_fast_math(content):
                return None
            found = _cuda_literal(content)
            has_kernel = has_kernel or (found is not None and _has_kernel(found[4]))
        elif path.endswith(CUDA_SUFFIXES):
            has_kernel = has_kernel or _has_kernel(content)
    if not has_kernel:
        return None
    return {**params, NVCC_FLAGS_PARAM: f"{current} {FAST_MATH_FLAG}".strip()}


def _has_kernel(source: str) -> bool:
    root = tsx.parse_cuda(source.encode()).root_node
    return bool(_functions(root, _KERNEL_FN))


def _python_mentions_fast_math(content: str) -> bool:
    try:
        tree = ast.parse(content)
    except SyntaxError:
        return False
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str)
               and "use_fast_math" in n.value and "__global__" not in n.value
               for n in ast.walk(tree))


SOURCE_REWRITES: dict[str, SourceRewrite] = {
    "restrict_pointers": restrict_pointers,
    "launch_bounds": launch_bounds,
    "unroll_constant_loops": unroll_constant_loops,
    "grid_stride_loop": grid_stride_loop,
    "vectorize_float4": vectorize_float4,
    "warp_shuffle_reduction": warp_shuffle_reduction,
}
PARAM_REWRITES: dict[str, ParamRewrite] = {
    "fast_math_flags": fast_math_flags,
}
IMPLEMENTATIONS = frozenset(SOURCE_REWRITES) | frozenset(PARAM_REWRITES)
