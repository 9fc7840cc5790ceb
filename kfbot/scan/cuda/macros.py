"""Launches written inside function-like macros, found by expanding the macro.

`#define LAUNCH(K, n, ...) K<<<(n + 255) / 256, 256>>>(__VA_ARGS__)` hides a launch
from the parse of the file that uses it: `LAUNCH(softplus_kernel, n, x, y)` reads as a
call of `LAUNCH`. Each file records its function-like macro definitions and the
upper-case macro-like calls in its host functions; once every file is read, a call of a
macro defined in the repository (in the same file, a header it includes, or anywhere
when the name is unique) is expanded as the preprocessor would (`#`, `##`,
`__VA_ARGS__`, nested macros) and the expansion is read for launches, attributed to
the host function that invoked the macro.

Nothing is executed: the expansion is text, parsed like any other source. A macro that
expands to itself (directly or through others) is reported once and not expanded
further.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace

from kfbot.scan import treesitter as tsx
from kfbot.scan.cuda.context import FileContext
from kfbot.scan.model import CudaFileFacts, HostCall, MacroDef, MacroUse, Problem

MACRO_DEF_Q = """(preproc_function_def name: (identifier) @name
  parameters: (preproc_params) @params) @def"""
PATTERNS = (MACRO_DEF_Q,)
MAX_BODY = 8000  # characters of a macro body kept
MAX_DEPTH = 8  # macros expanded inside one another
MAX_TEXT = 200_000  # characters an expansion may grow to
# Macro-like calls that are library checks and dispatchers, never a repository launch.
_LIBRARY = re.compile(r"^(?:TORCH_|AT_|C10_|CUDA_KERNEL_ASSERT|CHECK_|STD_TORCH_CHECK)")
_MACRO_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{2,}$")
_INVOCATION = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_TOKEN = re.compile(r'##|#\s*[A-Za-z_]\w*|[A-Za-z_]\w*|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|'
                    r"\s+|.", re.S)
_WRAPPER = "__kfbot_macro__"


# --- per file ----------------------------------------------------------------------------


def macro_defs(ctx: FileContext) -> Iterable[MacroDef]:
    for m in ctx.found(MACRO_DEF_Q):
        value = m["def"].child_by_field_name("value")
        body = tsx.text(value) if value is not None else ""
        if len(body) > MAX_BODY:
            continue
        params = tuple(tsx.text(p).strip() for p in m["params"].children
                       if p.type in ("identifier", "...") or tsx.text(p).strip() == "...")
        yield MacroDef(name=tsx.text(m["name"]), params=params,
                       body=body.replace("\\\r\n", " ").replace("\\\n", " "),
                       file=ctx.file, line=ctx.line(m["def"]))


def macro_uses(ctx: FileContext, calls: list[dict[str, tsx.Node]]) -> Iterable[MacroUse]:
    for m in calls:
        callee = m["callee"]
        if callee.type != "identifier":
            continue
        name = tsx.text(callee)
        if not _MACRO_NAME.match(name) or _LIBRARY.match(name):
            continue
        site = m["call"]
        fn = ctx.enclosing_function(site)
        if fn is not None and ctx.device_only(fn):
            continue
        yield MacroUse(name=name, args=tuple(split_args(tsx.text(m["args"])[1:-1])),
                       file=ctx.file, line=ctx.line(site),
                       host_function=ctx.function_name(fn) if fn is not None else None,
                       scope="::".join(ctx.scope_of(site)),
                       conditions=ctx.conditions_at(site, fn) if fn is not None else ())


def split_args(text: str) -> list[str]:
    """Macro arguments: split at commas outside parentheses, as the preprocessor does."""
    out, depth, start, quote = [], 0, 0, ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
        i += 1
    last = text[start:].strip()
    if last or out:
        out.append(last)
    return out


# --- expansion -----------------------------------------------------------------------


def substitute(defn: MacroDef, args: list[str]) -> str:
    """The body with the arguments put in: `#p` made a string, `a ## b` pasted."""
    params = list(defn.params)
    values: dict[str, str] = {}
    if params and params[-1].endswith("..."):
        named = params[-1][:-3].strip()
        rest = ", ".join(args[len(params) - 1:])
        values[named or "__VA_ARGS__"] = rest
        params = params[:-1]
    values.update(zip(params, args, strict=False))
    out = []
    for token in _TOKEN.findall(defn.body):
        if token.startswith("#") and token != "##":
            name = token[1:].strip()
            out.append('"' + values.get(name, name).replace('"', '\\"') + '"')
        else:
            out.append(values.get(token, token))
    return _paste("".join(out))


def _paste(text: str) -> str:
    """`a ## b` -> `ab`: each `##` goes with the blanks around it. What
    `re.sub(r"\\s*##\\s*", "", text)` does, without its scan of every run of blanks
    (most of an expansion's text) for a `##` after it."""
    parts = text.split("##")
    if len(parts) == 1:
        return text
    inner = [p.strip() for p in parts[1:-1]]
    return "".join([parts[0].rstrip(), *inner, parts[-1].lstrip()])


class MacroExpander:
    """Expands the macro calls of a repository's files and reads the launches in them."""

    def __init__(self, cuda: list[CudaFileFacts], closure: Callable[[str], set[str]],
                 extract: Callable[[str, bytes, int], CudaFileFacts]) -> None:
        self.by_name: dict[str, list[MacroDef]] = defaultdict(list)
        for facts in cuda:
            for d in facts.macros:
                self.by_name[d.name].append(d)
        self.uses = [u for f in cuda for u in f.macro_uses if u.name in self.by_name]
        self.closure = closure
        self.extract = extract
        self.problems: list[Problem] = []
        self._reported: set[str] = set()
        # Expansions by (text, file, macros being expanded): dispatch macros nest, and
        # each level rescans what the level below expanded, so the same text comes back
        # many times (on apex, 140,000 expansions of 24,000 texts).
        self._expansions: dict[tuple[str, str, tuple[str, ...]], str] = {}

    def facts(self) -> list[CudaFileFacts]:
        """Launches and calls found in the expansions, as facts of the invoking files."""
        return [found for use in self.uses if (found := self._read(use)) is not None]

    def _read(self, use: MacroUse) -> CudaFileFacts | None:
        defn = self._visible(use.name, use.file)
        if defn is None:
            return None
        # Arguments are expanded before they are put in, as the preprocessor does: a macro
        # nested in its own argument (BOOL_SWITCH(a, A, [&] { BOOL_SWITCH(...) })) is
        # not a macro expanding to itself.
        args = [self._expand(a, use.file, [], use) for a in use.args]
        text = self._expand(substitute(defn, args), use.file, [defn.name], use)
        if "<<<" not in text and "cudaLaunch" not in text:
            return None  # calls through macros are already followed by their arguments
        wrapped = f"void {_WRAPPER}() {{ {' '.join(text.split())} ; }}\n"
        found = self.extract(use.file, wrapped.encode(), use.line - 1)
        where = f"{defn.name} ({defn.file}:{defn.line})"
        launches = tuple(replace(site, host_function=use.host_function, scope=use.scope,
                                 conditions=use.conditions + site.conditions, macro=where)
                         for site in found.launches)
        calls = tuple(_from_use(call, use) for call in found.host_calls)
        return CudaFileFacts(file=use.file, launches=launches, host_calls=calls)

    def _visible(self, name: str, file: str) -> MacroDef | None:
        defs = self.by_name.get(name, [])
        if len(defs) == 1:
            return defs[0]
        seen = self.closure(file)
        local = [d for d in defs if d.file == file] or [d for d in defs if d.file in seen]
        return local[0] if local else None

    def _expand(self, text: str, file: str, stack: list[str], use: MacroUse) -> str:
        """Expand the macro calls left in `text` (rescanning, as the preprocessor does).

        The text depends only on the arguments: kept, it is not expanded again. What an
        expansion reports it reports the first time (`_report` says each macro once)."""
        key = (text, file, tuple(stack))
        found = self._expansions.get(key)
        if found is None:
            found = self._expansions[key] = self._expand_once(text, file, stack, use)
        return found

    def _expand_once(self, text: str, file: str, stack: list[str], use: MacroUse) -> str:
        out, pos = [], 0
        for match in _INVOCATION.finditer(text):
            name = match.group(1)
            if match.start() < pos or name not in self.by_name:
                continue
            close = _closing(text, match.end())
            defn = self._visible(name, file)
            if close is None or defn is None:
                continue
            if name in stack or len(stack) >= MAX_DEPTH or len(text) > MAX_TEXT:
                self._report(use, [*stack, name])
                continue
            args = [self._expand(a, file, stack, use)
                    for a in split_args(text[match.end():close - 1])]
            inner = self._expand(substitute(defn, args), file, [*stack, name], use)
            out += [text[pos:match.start()], inner]
            pos = close
        out.append(text[pos:])
        return "".join(out)

    def _report(self, use: MacroUse, chain: list[str]) -> None:
        key = chain[-1]
        if key in self._reported:
            return
        self._reported.add(key)
        loop = " -> ".join(chain)
        what = "expands to itself" if chain[-1] in chain[:-1] else \
            f"is nested more than {MAX_DEPTH} deep"
        self.problems.append(Problem(use.file, use.line, f"macro {chain[-1]} {what} "
                                     f"({loop}); not expanded further"))


def _closing(text: str, start: int) -> int | None:
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _from_use(call: HostCall, use: MacroUse) -> HostCall:
    if call.caller != _WRAPPER or use.host_function is None:
        return call
    scope = use.host_function.rsplit("::", 1)[0] if "::" in use.host_function else ""
    return replace(call, caller=use.host_function, scope=scope,
                   conditions=use.conditions + call.conditions)
