"""Static anti-cheating: the rules' tree-sitter queries on the candidate's C++/CUDA.

Every unit of the op's build is parsed once, as it is now and with the candidate's edits;
all query rules run as one combined query per unit, and a rule in `new` mode reports
only what the candidate has more of than the original, so an op that already called a
library may keep calling it. Structural checks that a query cannot express live in
`static_builtin`; both read the parsed units of `units`. Working on the parse means a
comment or a string literal can neither hide a forbidden call nor fake one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from functools import lru_cache

from kfbot.anticheat import static_builtin
from kfbot.anticheat.findings import Finding
from kfbot.anticheat.rules import HIT_SCOPES, Rule, RuleQuery, load_rules, rule_query
from kfbot.anticheat.units import Hit, Source, StaticInput, Unit
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
FLOAT_DTYPES = frozenset({"float32", "float64"})
DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "double": "float64", "fp64": "float64",
                 "half": "float16", "fp16": "float16", "bf16": "bfloat16"}


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
