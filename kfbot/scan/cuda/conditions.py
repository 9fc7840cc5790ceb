"""The conditions a place in a C++/CUDA file runs under, as written.

An op that runs one of several kernels chooses in `if`s, `switch`es, `?:` and
preprocessor conditionals; each branch is a byte range with the text of its condition
("if (algo == 0)", "else of if (algo == 0)", "case at::kFloat of switch
(x.scalar_type())", "#if KFOPS_USE_CLUSTERS"). A launch or a call is under every range
that contains it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from kfbot.scan import treesitter as tsx
from kfbot.scan.cuda.syntax import expr
from kfbot.scan.treesitter import Node

IF_Q = "(if_statement condition: (_) @cond consequence: (_) @then) @if"
CASE_Q = """(switch_statement condition: (_) @cond
  body: (compound_statement (case_statement) @case))"""
TERNARY_Q = "(conditional_expression condition: (_) @cond consequence: (_) @then) @t"
PREPROC_Q = "[(preproc_if condition: (_) @cond) (preproc_ifdef name: (_) @cond)] @pp"
PATTERNS = (IF_Q, CASE_Q, TERNARY_Q, PREPROC_Q)
_LIMIT = 120  # characters of a condition kept

Region = tuple[int, int, str]  # start byte, end byte, condition text


def _paren(text: str) -> str:
    text = expr(text)
    if len(text) > _LIMIT:
        text = text[: _LIMIT - 3] + "..."
    return text if text.startswith("(") else f"({text})"


def _if_regions(m: dict[str, Node], branch: str = "if") -> Iterable[Region]:
    """The then and else regions of an `if` (or, with branch "t", of a ternary)."""
    cond = _paren(tsx.text(m["cond"]))
    then = m["then"]
    yield then.start_byte, then.end_byte, f"if {cond}"
    other = m[branch].child_by_field_name("alternative")
    if other is not None:
        yield other.start_byte, other.end_byte, f"else of if {cond}"


def _case_region(m: dict[str, Node]) -> Region:
    case = m["case"]
    value = case.child_by_field_name("value")
    label = f"case {expr(tsx.text(value))}" if value is not None else "default"
    return case.start_byte, case.end_byte, f"{label} of switch {_paren(tsx.text(m['cond']))}"


def _ternary_regions(m: dict[str, Node]) -> Iterable[Region]:
    return _if_regions(m, "t")


def _preproc_regions(m: dict[str, Node]) -> Iterable[Region]:
    node, cond = m["pp"], m["cond"]
    keyword = tsx.text(node.children[0]).strip() if node.children else "#if"
    text = f"{keyword} {expr(tsx.text(cond))}"
    if keyword == "#ifndef" and _include_guard(node, tsx.text(cond)):
        return
    other = node.child_by_field_name("alternative")
    body_end = other.start_byte if other is not None else node.end_byte
    yield cond.end_byte, body_end, text
    while other is not None:
        if other.type == "preproc_elif":
            inner = other.child_by_field_name("condition")
            nxt = other.child_by_field_name("alternative")
            end = nxt.start_byte if nxt is not None else other.end_byte
            start = inner.end_byte if inner is not None else other.start_byte
            yield start, end, f"#elif {expr(tsx.text(inner))} (after {text})"
            other = nxt
        else:
            yield other.start_byte, other.end_byte, f"#else of {text}"
            other = None


def _include_guard(node: Node, name: str) -> bool:
    first = next((c for c in node.named_children[1:] if c.type != "comment"), None)
    return first is not None and first.type == "preproc_def" and \
        tsx.text(first.child_by_field_name("name")) == name


class Conditions:
    """The condition regions of one file, and the conditions at a place."""

    def __init__(self, found: list[list[dict[str, Node]]]) -> None:
        if_matches, case_matches, ternaries, preprocs = found
        code: list[Region] = []
        for m in if_matches:
            code += _if_regions(m)
        code += [_case_region(m) for m in case_matches]
        for m in ternaries:
            code += _ternary_regions(m)
        code.sort()
        self.code = code
        self.starts = [r[0] for r in code]
        self.preprocessor = sorted(r for m in preprocs for r in _preproc_regions(m))

    def at(self, start: int, end: int, within: tuple[int, int] | None = None) -> tuple[str, ...]:
        """The conditions over bytes [start, end), outermost first: the preprocessor's and,
        of the code's, those written inside `within` (the function around the place)."""
        out = [(r_start, text) for r_start, r_end, text in self.preprocessor
               if r_start <= start and end <= r_end]
        if within is not None and self.code:
            lo = bisect.bisect_left(self.starts, within[0])
            hi = bisect.bisect_right(self.starts, start)
            out += [(r_start, text) for r_start, r_end, text in self.code[lo:hi]
                    if end <= r_end]
        return tuple(text for _, text in sorted(out))
