"""The static anti-cheating rules: read from rules/anticheat.yaml and validated strictly.

A rule file is data a person edits, so every mistake in it (an unknown key, a query
that does not compile, a check that does not exist) stops kfbot with a message naming
the file, the rule and the problem, instead of silently checking less.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args

import tree_sitter as ts

from kfbot.anticheat.findings import Severity
from kfbot.datafiles import check_unique_ids, read_entries, rules_dir
from kfbot.errors import KfbotError
from kfbot.scan import treesitter as tsx

Scope = Literal["device", "host", "any"]
Mode = Literal["new", "always"]
When = Literal["fp32-op"]

RULES_FILE = "anticheat.yaml"
# Structural checks implemented in Python (kfbot.anticheat.static_builtin.CHECKS).
BUILTIN_CHECKS = frozenset(
    {"unlaunched-kernel", "no-kernel-launch", "fast-math", "edit-outside-task", "python-edit",
     "size-special-case", "size-literal"})
_KEYS = frozenset({"id", "severity", "what", "why", "query", "check", "scope", "mode", "when"})
_REQUIRED = ("id", "severity", "what", "why")
_ID = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
# The capture a pattern reports; `@hit.host` / `@hit.device` narrow one pattern's scope.
HIT = "hit"
HIT_SCOPES: dict[str, Scope | None] = {HIT: None, "hit.host": "host", "hit.device": "device"}
# Builds the error for one rule: the message is prefixed with the file and the rule.
Fail = Callable[[str], KfbotError]


@dataclass(frozen=True)
class Rule:
    """One entry of the rule file: a tree-sitter query or a named built-in check."""

    id: str
    severity: Severity
    what: str
    why: str
    query: str | None = None
    check: str | None = None
    scope: Scope = "any"
    mode: Mode = "new"
    when: When | None = None
    # Scope of each pattern of `query`: the rule's, or the one its @hit.host/@hit.device says.
    pattern_scopes: tuple[Scope, ...] = ()


@dataclass(frozen=True)
class RuleQuery:
    """The query rules joined into one query: one walk of each tree runs them all."""

    text: str
    owner: tuple[tuple[int, Scope], ...]  # per pattern: (index of its rule, its scope)


def load_rules(path: Path | None = None) -> tuple[Rule, ...]:
    """The rules in `path` (default: the shipped anticheat.yaml, read once per process)."""
    if path is None:
        return _default_rules()
    return _load(path)


@cache
def _default_rules() -> tuple[Rule, ...]:
    return _load(rules_dir() / RULES_FILE)


def _load(path: Path) -> tuple[Rule, ...]:
    rules = tuple(_rule(path, i, entry) for i, entry in enumerate(read_entries(path, "rule")))
    check_unique_ids(path, "rule", (r.id for r in rules))
    return _with_pattern_scopes(path, rules)


def rule_query(rules: tuple[Rule, ...]) -> RuleQuery:
    """The query rules of `rules` as one query, with each pattern's rule and scope."""
    if any(r.query is not None and not r.pattern_scopes for r in rules):
        rules = _with_pattern_scopes(Path("<rules given in code>"), rules)  # built by hand
    query_rules = [(i, r) for i, r in enumerate(rules) if r.query is not None]
    return RuleQuery(text="\n".join(str(r.query) for _, r in query_rules),
                     owner=tuple((i, scope) for i, r in query_rules for scope in r.pattern_scopes))


def _with_pattern_scopes(path: Path, rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
    """Compile all queries as the one query static checks will run (compiling is slow:
    tens of milliseconds per query), and read each pattern's @hit capture off it."""
    text = "\n".join(str(r.query) for r in rules if r.query is not None)
    try:
        compiled = tsx.query(text)
    except ts.QueryError as e:
        _blame(path, rules)  # compiling one rule at a time names the broken one
        raise KfbotError(f"{path}: the rules' queries do not compile together: {e}") from e
    spans, start = [], 0
    for rule in rules:
        if rule.query is not None:
            spans.append((start, start + len(rule.query.encode()), rule))
            start += len(rule.query.encode()) + 1
    scopes: dict[str, list[Scope]] = {r.id: [] for r in rules}
    for pattern in range(compiled.pattern_count):
        at = compiled.start_byte_for_pattern(pattern)
        rule = next(r for begin, end, r in spans if begin <= at < end)
        scopes[rule.id].append(_pattern_scope(path, rule, compiled, pattern))
    return tuple(replace(r, pattern_scopes=tuple(scopes[r.id])) for r in rules)


def _pattern_scope(path: Path, rule: Rule, compiled: ts.Query, pattern: int) -> Scope:
    if compiled.pattern_settings(pattern) or compiled.pattern_assertions(pattern):
        # Not used by the checks, and py-tree-sitter 0.26 corrupts memory freeing a query
        # whose pattern has #set! after a text predicate.
        raise KfbotError(f"{path}: rule {rule.id}: #set! and #is? directives are not "
                         "supported; use @hit.host / @hit.device to scope one pattern")
    hits = [name for name in _captures(compiled, pattern) if name in HIT_SCOPES]
    if len(hits) != 1:
        problem = "has no @hit capture (the node to report)" if not hits else \
            f"has more than one of {', '.join('@' + h for h in hits)}"
        raise KfbotError(f"{path}: rule {rule.id}: a query pattern {problem}")
    return HIT_SCOPES[hits[0]] or rule.scope


def _captures(compiled: ts.Query, pattern: int) -> list[str]:
    """Capture names used by one pattern of a query."""
    names = []
    for index in range(compiled.capture_count):
        try:
            quantifier = compiled.capture_quantifier(pattern, index)
        except SystemError:
            continue  # py-tree-sitter 0.26 raises for TSQuantifierZero: not in this pattern
        if quantifier is not None:
            names.append(compiled.capture_name(index))
    return names


def _blame(path: Path, rules: tuple[Rule, ...]) -> None:
    for rule in rules:
        if rule.query is None:
            continue
        try:
            tsx.query(rule.query)
        except ts.QueryError as e:
            raise KfbotError(f"{path}: rule {rule.id}: the query does not compile: "
                             f"{' '.join(str(e).split())}") from e


def _rule(path: Path, index: int, entry: Any) -> Rule:
    name = entry.get("id") if isinstance(entry, dict) else None
    label = f"rule {name}" if isinstance(name, str) and name else f"rule #{index + 1}"

    def fail(problem: str) -> KfbotError:
        return KfbotError(f"{path}: {label}: {problem}")

    if not isinstance(entry, dict):
        raise fail("expected a mapping of keys to values")
    _check_keys(entry, fail)
    query, check = entry.get("query"), entry.get("check")
    return Rule(
        id=_text(entry, "id", fail),
        severity=_choice(entry, "severity", Severity, None, fail),
        what=_text(entry, "what", fail),
        why=_text(entry, "why", fail),
        query=_query(query, fail) if query is not None else None,
        check=_check(check, fail) if check is not None else None,
        scope=_choice(entry, "scope", Scope, "any", fail),
        mode=_choice(entry, "mode", Mode, "new", fail),
        when=_choice(entry, "when", When, None, fail) if "when" in entry else None,
    )


def _check_keys(entry: dict[Any, Any], fail: Fail) -> None:
    unknown = sorted(str(k) for k in entry if k not in _KEYS)
    if unknown:
        raise fail(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KEYS))}")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise fail(f"missing {', '.join(missing)}")
    if ("query" in entry) == ("check" in entry):
        raise fail("needs exactly one of `query` and `check`")
    if "check" in entry and ("scope" in entry or "mode" in entry):
        raise fail("`scope` and `mode` apply to `query` rules only")
    if not _ID.match(str(entry["id"])):
        raise fail("the id must be kebab-case (lower-case words joined by '-')")


def _text(entry: dict[Any, Any], key: str, fail: Fail) -> str:
    value = entry[key]
    if not isinstance(value, str) or not value.strip() or "\n" in value.strip():
        raise fail(f"`{key}` must be one non-empty line of text")
    return value.strip()


def _choice(entry: dict[Any, Any], key: str, kind: Any, default: str | None, fail: Fail) -> Any:
    value = entry.get(key, default)
    allowed: tuple[str, ...] = get_args(kind)
    if value not in allowed:
        raise fail(f"`{key}` is {value!r}; expected one of {', '.join(allowed)}")
    return value


def _query(query: Any, fail: Fail) -> str:
    if not isinstance(query, str) or not query.strip():
        raise fail("`query` must be a tree-sitter query string")
    return query


def _check(check: Any, fail: Fail) -> str:
    if check not in BUILTIN_CHECKS:
        raise fail(f"unknown built-in check {check!r}; known: {', '.join(sorted(BUILTIN_CHECKS))}")
    return str(check)
