"""Static anti-cheating: the rules' tree-sitter queries on the candidate's C++/CUDA.

Every unit of the op's build is parsed once, as it is now and with the candidate's edits;
all query rules run as one combined query per unit, and a rule in `new` mode reports
only what the candidate has more of than the original, so an op that already called a
library may keep calling it. Structural checks that a query cannot express live in
`static_builtin`. Working on the parse means a comment or a string literal can neither
hide a forbidden call nor fake one.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from kfbot.anticheat import static_builtin
from kfbot.anticheat.findings import Finding
from kfbot.anticheat.rules import HIT_SCOPES, Rule, RuleQuery, Scope, load_rules, rule_query
from kfbot.scan import treesitter as tsx
from kfbot.scan.treesitter import Node

# Facts every unit needs besides the rules: device functions (for `scope`), kernels and
# launches (for the built-in checks) and macro bodies (parsed as code of their own).
DEVICE_FN_Q = """[(function_definition "__global__") (function_definition "__device__")] @fn"""
KERNEL_Q = """(function_definition "__global__"
  declarator: (function_declarator declarator: (_) @name)) @fn"""
LAUNCH_Q = "(call_expression function: (_) @callee (kernel_call_syntax)) @call"
LAUNCH_API_Q = """(call_expression function: (identifier) @api arguments: (argument_list) @args
  (#match? @api "^cuda(LaunchKernel(Ex|ExC)?|LaunchCooperativeKernel)(_ptsz)?$"))"""
MACRO_Q = """[(preproc_def value: (preproc_arg) @body)
  (preproc_function_def value: (preproc_arg) @body)]"""
FACT_QUERIES = (DEVICE_FN_Q, KERNEL_Q, LAUNCH_Q, LAUNCH_API_Q, MACRO_Q)
SNIPPET_CHARS = 60
# Tokens no space is put after / before when a hit's text is normalised.
TIGHT_AFTER = frozenset({"::", ".", "->", "(", "[", "~", "!", "&", "*"})
TIGHT_BEFORE = frozenset({"::", ".", "->", "(", ")", "[", "]", ",", ";"})
TEMPLATE_LISTS = frozenset({"template_argument_list", "template_parameter_list"})
WHOLE_TOKENS = frozenset({"string_literal", "raw_string_literal", "char_literal",
                          "number_literal", "concatenated_string"})
FLOAT_DTYPES = frozenset({"float32", "float64"})
DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "double": "float64", "fp64": "float64",
                 "half": "float16", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Source:
    path: str  # repo-relative; an inline source is labelled "softmax_inline.py#cuda_sources"
    text: str
    line_offset: int = 0  # added to tree-sitter line numbers (inline strings start inside a .py)


@dataclass(frozen=True)
class StaticInput:
    original: tuple[Source, ...]  # every C++/CUDA unit of the op's build as it is now
    candidate: tuple[Source, ...]  # the same units with the candidate's edits applied
    # path -> (original text or None if new, candidate text) for every file the candidate edits
    changed: Mapping[str, tuple[str | None, str]]
    allowed: tuple[str, ...]  # files the task allows it to edit
    original_flags: tuple[str, ...] = ()  # nvcc/cxx flags of the original build
    candidate_flags: tuple[str, ...] = ()  # flags with the candidate's edits/params
    op_dtypes: tuple[str, ...] = ()  # dtypes the op is verified with, e.g. ("float32",)


@dataclass(frozen=True)
class Hit:
    """One match of a rule: its text (the key `new` mode counts) and where it is."""

    key: str
    path: str
    line: int  # 1-based line in the file, line_offset applied
    source_line: str


class Unit:
    """One parsed text: a source, or the bodies of its macros laid out on their own lines."""

    def __init__(self, source: Source, text: str, *, macros: bool = False) -> None:
        self.source = source
        self.macros = macros
        self.tree = tsx.parse_cuda(text.encode())
        self.root: Node = self.tree.root_node
        self.lines = source.text.split("\n")  # tree-sitter counts "\n" only
        self.hits: dict[str, list[Hit]] = {}
        self.kernels: list[dict[str, Node]] = []  # {"fn", "name"} per __global__ definition
        self.launches: list[dict[str, Node]] = []  # {"callee", "call"} per <<<...>>> call
        self.api_launches: list[dict[str, Node]] = []  # {"api", "args"} per cudaLaunchKernel
        self.macro_bodies: list[Node] = []
        self._device: list[tuple[int, int]] = []
        self._device_starts: list[int] = []

    def set_device_functions(self, functions: Iterable[Node]) -> None:
        self._device = sorted((f.start_byte, f.end_byte) for f in functions)
        self._device_starts = [start for start, _ in self._device]

    def in_scope(self, node: Node, scope: Scope) -> bool:
        """Macro bodies may be expanded anywhere, so they are in every scope."""
        if scope == "any" or self.macros:
            return True
        return (scope == "device") == self._in_device_function(node)

    def _in_device_function(self, node: Node) -> bool:
        i = bisect.bisect_right(self._device_starts, node.start_byte) - 1
        # Device functions do not nest, but a lambda or a local struct may sit in one.
        while i >= 0:
            start, end = self._device[i]
            if start <= node.start_byte and node.end_byte <= end:
                return True
            i -= 1
        return False

    def hit(self, node: Node) -> Hit:
        row = tsx.line(node)
        text = self.lines[row - 1] if row <= len(self.lines) else ""
        return Hit(normalized(node), self.source.path, row + self.source.line_offset,
                   text.strip())


def static_findings(inp: StaticInput, rules: Sequence[Rule] | None = None) -> list[Finding]:
    """Findings of every rule on the candidate, compared with the original."""
    rules = load_rules() if rules is None else tuple(rules)
    original = analyse(tuple(inp.original), rules)
    candidate = analyse(tuple(inp.candidate), rules)
    old_lines = _lines_by_path(original)
    findings: list[Finding] = []
    for rule in rules:
        if not _applies(rule, inp, original):
            continue
        if rule.check is not None:
            findings.extend(static_builtin.run(rule, inp, original, candidate))
        else:
            findings.extend(_query_findings(rule, original, candidate, old_lines))
    return findings


@lru_cache(maxsize=8)
def analyse(sources: tuple[Source, ...], rules: tuple[Rule, ...]) -> tuple[Unit, ...]:
    """Parse each source (and its macro bodies) once and run every query on it once.

    Kept for a few calls: every candidate of an op is compared with the same original.
    """
    joined = rule_query(rules)
    units: list[Unit] = []
    for source in sources:
        unit = Unit(source, source.text)
        _run_queries(unit, rules, joined)
        units.append(unit)
        if unit.macro_bodies:
            macros = Unit(source, _macro_text(unit.macro_bodies), macros=True)
            _run_queries(macros, rules, joined)
            units.append(macros)
    return tuple(units)


def _run_queries(unit: Unit, rules: Sequence[Rule], joined: RuleQuery) -> None:
    device_fns, unit.kernels, unit.launches, unit.api_launches, macros = (
        tsx.matches_by_pattern(FACT_QUERIES, unit.root))
    unit.set_device_functions(m["fn"] for m in device_fns)
    unit.macro_bodies = [m["body"] for m in macros]
    found: dict[int, list[Node]] = {i: [] for i, r in enumerate(rules) if r.query is not None}
    if joined.text:
        for pattern, captures in tsx.pattern_matches(joined.text, unit.root):
            which, scope = joined.owner[pattern]
            node = _hit_node(captures)
            if node is not None and unit.in_scope(node, scope):
                found[which].append(node)
    for which, nodes in found.items():
        unit.hits[rules[which].id] = [unit.hit(n) for n in _outermost(nodes)]


def _hit_node(captures: Mapping[str, Node]) -> Node | None:
    for name in HIT_SCOPES:
        if name in captures:
            return captures[name]
    return None


def _outermost(nodes: list[Node]) -> list[Node]:
    """Drop nodes inside another one: `at::cuda::x` is one hit, not also `cuda::x`."""
    out: list[Node] = []
    for node in sorted(nodes, key=lambda n: (n.start_byte, -n.end_byte)):
        if out and node.end_byte <= out[-1].end_byte:
            continue
        out.append(node)
    return out


def _macro_text(bodies: list[Node]) -> str:
    """Macro bodies on their own lines, so a hit in one reports the `#define`'s line.

    A `;` ends each body so that one body cannot run into the next (`at::gelu` followed
    by `printf(...)` would otherwise read as a declaration of type `at::gelu`).
    """
    lines: list[str] = []
    for body in bodies:
        row = int(body.start_point[0])
        lines.extend("" for _ in range(row - len(lines)))
        text = tsx.text(body).replace("\\\r\n", " \n").replace("\\\n", " \n")
        lines.extend(f"{text};".split("\n"))
    return "\n".join(lines)


def normalized(node: Node) -> str:
    """The node's tokens without comments, one space apart except around `::`, `.`, `(`...

    Two spellings of the same code give the same text, so `new` mode counts them as one.
    """
    out: list[str] = []
    stack: list[tuple[Node, bool]] = [(node, False)]  # (node, is a template's bracket)
    glue = False  # the previous token wants no space after it
    while stack:
        current, bracket = stack.pop()
        if current.type == "comment":
            continue
        if current.child_count == 0 or current.type in WHOLE_TOKENS:
            token = tsx.text(current)
            if out and not glue and not bracket and token not in TIGHT_BEFORE:
                out.append(" ")
            out.append(token)
            glue = bracket or token in TIGHT_AFTER
        else:
            template = current.type in TEMPLATE_LISTS
            stack.extend((c, template and c.type in ("<", ">")) for c in reversed(current.children))
    return "".join(out)


def _applies(rule: Rule, inp: StaticInput, original: Sequence[Unit]) -> bool:
    """`when: fp32-op`: the op is verified in float32/float64 only.

    Without dtypes, the original's own hits decide: an op whose source already uses
    half precision is not a float32 op.
    """
    if rule.when != "fp32-op":
        return True
    dtypes = {_dtype(d) for d in inp.op_dtypes}
    if dtypes:
        return dtypes <= FLOAT_DTYPES
    return not any(unit.hits.get(rule.id) for unit in original)


def _dtype(name: str) -> str:
    short = name.strip().removeprefix("torch.")
    return DTYPE_ALIASES.get(short, short)


def _query_findings(rule: Rule, original: Sequence[Unit], candidate: Sequence[Unit],
                    old_lines: Mapping[str, set[str]]) -> list[Finding]:
    before = Counter(h.key for u in original for h in u.hits[rule.id])
    after: dict[str, list[Hit]] = {}
    for unit in candidate:
        for h in unit.hits[rule.id]:
            after.setdefault(h.key, []).append(h)
    findings = []
    for key, hits in after.items():
        if rule.mode == "new" and len(hits) <= before[key]:
            continue
        # Point at an occurrence the original did not have, where one can be told apart.
        fresh = [h for h in hits if h.source_line not in old_lines.get(h.path, set())]
        findings.append(query_finding(rule, (fresh or hits)[0]))
    return findings


def _lines_by_path(units: Sequence[Unit]) -> dict[str, set[str]]:
    """The original's lines by file, to tell a new occurrence from one it already had."""
    out: dict[str, set[str]] = {}
    for unit in units:
        if not unit.macros:
            out.setdefault(unit.source.path, set()).update(s.strip() for s in unit.lines)
    return out


def query_finding(rule: Rule, hit: Hit) -> Finding:
    new = " is new in the candidate" if rule.mode == "new" else ""
    snippet = static_builtin.cut(hit.key, SNIPPET_CHARS)
    return Finding(check=rule.id, layer="static", severity=rule.severity,
                   reason=f"`{snippet}`{new} — {rule.what}: {rule.why}",
                   evidence=static_builtin.evidence(hit.path, hit.line, hit.source_line))
