"""Scan reports for people (a table, Markdown) and for machines (versioned JSON)."""

from __future__ import annotations

import dataclasses
import io
import json
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from kfbot import __version__
from kfbot.listing import record_lines, table_fits
from kfbot.scan.forked import Forked
from kfbot.scan.model import (
    NOT_UNDERSTOOD,
    VERDICT_WORDS,
    Kernel,
    Observations,
    Problem,
    ReferenceTest,
    ScanReport,
)
from kfbot.scan.show.json_text import ACCELERATED, JsonText, dumps_indented
from kfbot.scan.show.summary import compared, confidence_words, summary_lines
from kfbot.text import printable

if TYPE_CHECKING:  # rich is imported when a table is drawn: JSON output does without it
    from rich.console import Console

SCHEMA_VERSION = 1
# From this many kernels, a forked child writes half of them (see `json_text`).
FORK_KERNELS = 1000
# Kernels sit two levels down, in the report's list of kernels: what comes between two.
_KERNEL_SEPARATOR = ",\n  "
# Where the kernels go in the report's text: JSON text never holds a NUL (its strings
# escape it), so splitting there finds the one place.
_KERNELS_MARK = JsonText("\0")
# A record in one of a kernel's lists: the report, its kernels, a kernel, its list.
_RECORD_DEPTH = 4


def to_json(report: ScanReport) -> dict[str, Any]:
    """The documented JSON form; see kfbot/schemas/scan-v1.json."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kfbot_version": __version__,
        "root": report.root,
        "files_scanned": report.files_scanned,
        "skipped_dirs": list(report.skipped_dirs),
        "kernels": [kernel_json(k) for k in report.kernels],
        "problems": [_record(p) for p in report.problems],
        "unfollowed": list(report.unfollowed),
        **({"observation": _observation_json(report.observed)} if report.observed else {}),
    }


def _observation_json(o: Observations) -> dict[str, Any]:
    return {"key": o.key, "tests_run": o.tests_run, "files": list(o.files),
            "foreign": list(o.foreign), "note": o.note}


def json_text(report: ScanReport) -> str:
    """The JSON report as `json.dumps(to_json(report), indent=1)` writes it."""
    out = io.StringIO()
    write_json(report, out)
    return out.getvalue()


def write_json(report: ScanReport, out: TextIO) -> None:
    """Write the JSON report to `out` as `json.dumps(to_json(report), indent=1)` writes
    it, faster.

    The kernels are most of the text: each is written as it is made, never joined into
    one string with the rest (a large report is tens of megabytes, and each copy of it
    costs a page fault per 4 KiB). In a large report a forked child writes the second
    half of them while this process writes the first.
    """
    if not ACCELERATED:
        out.write(json.dumps(to_json(report), indent=1))
        return
    head = to_json(dataclasses.replace(report, kernels=()))
    kernels = report.kernels
    if not kernels:
        out.write(dumps_indented(head, indent=1))
        return
    head["kernels"] = [_KERNELS_MARK]
    before, after = dumps_indented(head, indent=1).split(_KERNELS_MARK)
    out.write(before)
    if len(kernels) < FORK_KERNELS:
        _write_kernels(kernels, out)
    else:
        half = len(kernels) // 2
        with Forked(lambda: _kernels_text(kernels[half:])) as rest:
            _write_kernels(kernels[:half], out)
            out.write(_KERNEL_SEPARATOR)
            out.write(rest.result())
    out.write(after)


def _write_kernels(kernels: tuple[Kernel, ...], out: TextIO) -> None:
    shared: dict[int, JsonText] = {}
    for i, k in enumerate(kernels):
        if i:
            out.write(_KERNEL_SEPARATOR)
        out.write(dumps_indented(kernel_json(k, shared), indent=1, depth=2))


def _kernels_text(kernels: tuple[Kernel, ...]) -> str:
    out = io.StringIO()
    _write_kernels(kernels, out)
    return out.getvalue()


def kernel_json(k: Kernel, shared: dict[int, JsonText] | None = None) -> dict[str, Any]:
    """A kernel's JSON form. With `shared` (only where json_text.ACCELERATED), builds and
    tunables are written once per record and their text kept there by the record's
    identity: the kernels of one extension share its build, with every source listed."""
    d = k.definition
    return {
        "id": k.id,
        "name": d.name,
        "namespace": d.namespace,
        "qualified_name": d.qualified_name,
        "file": d.file,
        "line": d.line,
        "origin": k.origin,
        "task": k.task,
        "template_params": [_record(t) for t in d.template_params],
        "params": [_record(p) for p in d.params],
        "launch_bounds": list(d.launch_bounds) if d.launch_bounds is not None else None,
        "attributes": list(d.attributes),
        "extern_c": d.extern_c,
        "preprocessor": list(d.preprocessor),
        "launch_sites": [_launch_json(s) for s in k.launch_sites],
        "bindings": [_record(b) for b in k.bindings],
        "builds": _records(k.builds, shared),
        "tunables": _records(k.tunables, shared),
        "references": [_reference_json(r) for r in k.references],
        "dispatch": [_record(x) for x in k.dispatch],
        "editable_files": list(k.editable_files),
        "unpaired": list(k.unpaired),
        "observed": [_record(t) for t in k.observed],
    }


def _records(records: tuple[Any, ...], shared: dict[int, JsonText] | None) -> list[Any]:
    if shared is None:
        return [_record(r) for r in records]
    out: list[Any] = []
    for r in records:  # each alive for as long as `shared`: an identity names one record
        text = shared.get(id(r))
        if text is None:
            text = shared[id(r)] = JsonText(dumps_indented(_record(r), indent=1,
                                                           depth=_RECORD_DEPTH))
        out.append(text)
    return out


def _reference_json(ref: ReferenceTest) -> dict[str, Any]:
    out = _record(ref)
    # One string per link, "kind file:line: what": a report holds tens of thousands of
    # links, and a list of strings is written by one call of the JSON encoder.
    out["chain"] = [f"{s.kind} {s.file}:{s.line}: {s.name}" for s in ref.chain]
    return out


def _launch_json(site: Any) -> dict[str, Any]:
    out = _record(site)
    out.pop("uses")  # an implementation detail of tunable linking
    return out


def _record(obj: Any) -> dict[str, Any]:
    """A flat record's fields, tuples as lists (records here nest only tuples of str)."""
    names, values = _fields(type(obj))
    return {name: _plain(value) if type(value) is tuple else value
            for name, value in zip(names, values(obj), strict=True)}


_Fields = tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]
_FIELDS: dict[type, _Fields] = {}


def _fields(cls: type) -> _Fields:
    """A record type's field names, and a getter of all their values at once."""
    found = _FIELDS.get(cls)
    if found is None:
        names = tuple(f.name for f in dataclasses.fields(cls))
        # attrgetter of one name returns the value itself, not a 1-tuple.
        getter = operator.attrgetter(*names) if len(names) > 1 else (
            lambda obj: (getattr(obj, names[0]),))
        found = _FIELDS[cls] = (names, getter)
    return found


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


# --- people ---------------------------------------------------------------------------


_COLUMNS = ("kernel", "defined at", "launched from", "python", "build", "tunables",
            "reference")


def print_table(report: ScanReport, console: Console) -> None:
    """A table; a list where a table would break a name (see kfbot.listing)."""
    from rich.table import Table
    from rich.text import Text

    # Names and paths come from the repository: shown as plain text, never as markup or
    # terminal control sequences.
    title = f"{len(report.kernels)} kernels in {printable(report.root)}"
    rows = [tuple(printable(c) for c in _cells(k)) for k in report.kernels]
    if not table_fits(_COLUMNS, rows, console.width):
        _print_list(title, rows, console)
    else:
        table = Table(title=Text(title), show_lines=True)
        for col in _COLUMNS:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)
    _print_footer(report, console)


def _cells(k: Kernel) -> tuple[str, ...]:
    return (_kernel_cell(k), f"{k.file}:{k.definition.line}", _launch_cell(k),
            _binding_cell(k), _build_cell(k), _tunable_cell(k), _reference_cell(k))


def _print_list(title: str, rows: list[tuple[str, ...]], console: Console) -> None:
    from rich.text import Text

    console.print(Text(title, style="bold"), soft_wrap=True)
    for row in rows:
        head, *rest = row[0].splitlines()
        fields = [*(("", line) for line in rest), *zip(_COLUMNS[1:], row[1:], strict=True)]
        lines = record_lines(head, fields, console.width)
        console.print()
        console.print(Text(lines[0], style="bold"), soft_wrap=True)
        for line in lines[1:]:
            console.print(Text(line), soft_wrap=True)
    console.print()


def _print_footer(report: ScanReport, console: Console) -> None:
    from rich.text import Text

    console.print(f"{report.files_scanned} source files scanned")
    for d in report.skipped_dirs:
        console.print(Text(f"skipped generated build folder {printable(d)}/", style="dim"))
    for p in report.problems:
        if not p.message.startswith(NOT_UNDERSTOOD):  # counted in the summary
            console.print(Text(printable(_problem_text(p)), style=_colour(p)), highlight=False)
    if report.unfollowed:
        console.print(f"{len(report.unfollowed)} calls from tests into the repository's code "
                      "reached no op; `kfbot scan --explain KERNEL` shows where they stop")
    for line in observation_lines(report.observed):
        console.print(Text(printable(line)), highlight=False)
    console.print()
    for line in summary_lines(report):
        console.print(Text(printable(line)), highlight=False)


def observation_lines(o: Observations | None) -> list[str]:
    """What the observation on a GPU says about the whole repository."""
    if o is None:
        return []
    out = [f"observed on a GPU at {o.key}: {o.tests_run} tests run"
           + (f"; {o.note}" if o.note else "")]
    out += [f"  {line}" for line in o.files]
    if o.foreign:
        out.append(f"  library kernels launched (no scanned definition): "
                   f"{', '.join(o.foreign[:4])}" + (" ..." if len(o.foreign) > 4 else ""))
    return out


def _colour(p: Problem) -> str:
    return {"error": "red", "warning": "yellow"}.get(p.severity, "dim")


def _problem_text(p: Problem) -> str:
    where = f"{p.file}:{p.line}" if p.line else p.file
    return f"{p.severity}: {where}: {p.message}"


def _kernel_cell(k: Kernel) -> str:
    d = k.definition
    text = d.qualified_name
    if d.template_params:
        text = f"template<{', '.join(t.name for t in d.template_params)}> {text}"
    if d.launch_bounds:
        text += f"\n__launch_bounds__({', '.join(d.launch_bounds)})"
    if k.task:
        text += f"\n(task {k.task}, declared)"
    return text


def _launch_cell(k: Kernel) -> str:
    if not k.launch_sites:
        return "none found"
    return "\n".join(f"{s.file}:{s.line} in {s.host_function or '?'}"
                     + (f" <{', '.join(s.template_args)}>" if s.template_args else "")
                     for s in k.launch_sites)


def _binding_cell(k: Kernel) -> str:
    if not k.bindings:
        return "not bound"
    return "\n".join(f"{b.module}.{b.name}" for b in k.bindings)


def _build_cell(k: Kernel) -> str:
    if not k.builds:
        return "unknown"
    return "\n".join(f"{b.kind} {b.name or b.file} ({b.file}:{b.line})"
                     + (" [declared]" if b.origin == "declared" else "") for b in k.builds)


# A tunable's kind as a person names it; a cell lists each kind on a line of its own.
_KIND_WORDS = {"define": "#define", "ifndef_default": "#ifndef default", "constexpr": "constexpr",
               "const": "const", "template_arg": "template argument",
               "launch_config": "launch", "build_flag": "build flag"}
_TUNABLES_SHOWN = 4  # of each kind, in a cell


def _tunable_cell(k: Kernel) -> str:
    """The tunables that reach the kernel, a line per kind, the first few of each: a
    header's forty defines are a count, not forty lines."""
    by_kind: dict[str, list[str]] = {}
    for t in k.tunables:
        seen = f" (seen {', '.join(t.values_seen)})" if t.values_seen else ""
        by_kind.setdefault(_KIND_WORDS.get(t.kind, t.kind), []).append(f"{t.name}={t.value}"
                                                                       + seen)
    lines = []
    for kind, items in by_kind.items():
        more = len(items) - _TUNABLES_SHOWN
        lines.append(f"{kind}: {', '.join(items[:_TUNABLES_SHOWN])}"
                     + (f" and {more} more" if more > 0 else ""))
    return "\n".join(lines) or "-"


def _reference_cell(k: Kernel) -> str:
    lines = [f"{r.file}:{r.line} {r.test}: {compared(r)} ({confidence_words(r)})"
             if r.origin != "observed" else f"{r.file}:{r.line} {r.test} [observed]"
             for r in k.references]
    lines += [f"observed: {t.test}: {VERDICT_WORDS[t.verdict].split(':')[0]}"
              for t in k.observed if t.verdict != "checks"]
    return "\n".join(lines) if k.references else "\n".join(["NO REFERENCE TEST", *lines])


def to_markdown(report: ScanReport) -> str:
    lines = [f"# kfbot scan: {len(report.kernels)} kernels", "",
             "| kernel | defined at | launches | python | tunables | reference |",
             "|---|---|---|---|---|---|"]
    for k in report.kernels:
        cells = [k.definition.qualified_name, f"`{k.file}:{k.definition.line}`",
                 str(len(k.launch_sites)), _binding_cell(k), _tunable_cell(k),
                 _reference_cell(k)]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    lines += ["", f"{report.files_scanned} source files scanned.", ""]
    lines += [_md(line) if not line.startswith("  ") else f"    {line.strip()}"
              for line in summary_lines(report)]
    problems = [p for p in report.problems if not p.message.startswith(NOT_UNDERSTOOD)]
    if problems:
        lines += ["", "## Problems", ""] + [f"- {_md(_problem_text(p))}" for p in problems]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")
