"""Scan reports for people (a table, Markdown) and for machines (versioned JSON)."""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kfbot import __version__
from kfbot.scan.forked import Forked
from kfbot.scan.json_text import ACCELERATED, JsonText, dumps_indented
from kfbot.scan.model import Kernel, Problem, ReferenceTest, ScanReport

if TYPE_CHECKING:  # rich is imported when a table is drawn: JSON output does without it
    from rich.console import Console

SCHEMA_VERSION = 1
# From this many kernels, a forked child writes half of them (see `json_text`).
FORK_KERNELS = 1000
# Kernels sit two levels down, in the report's list of kernels: what comes between two.
_KERNEL_SEPARATOR = ",\n  "


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
    }


def json_text(report: ScanReport) -> str:
    """The JSON report as `json.dumps(to_json(report), indent=1)` writes it, faster.

    The kernels are most of the text; in a large report a forked child writes the
    second half of them while this process writes the first.
    """
    if not ACCELERATED:
        return json.dumps(to_json(report), indent=1)
    kernels = report.kernels
    if len(kernels) < FORK_KERNELS:
        text = _kernels_text(kernels)
    else:
        half = len(kernels) // 2
        with Forked(lambda: _kernels_text(kernels[half:])) as rest:
            text = _kernels_text(kernels[:half]) + _KERNEL_SEPARATOR + rest.result()
    head = to_json(dataclasses.replace(report, kernels=()))
    head["kernels"] = [JsonText(text)] if kernels else []
    return dumps_indented(head, indent=1)


def _kernels_text(kernels: tuple[Kernel, ...]) -> str:
    return _KERNEL_SEPARATOR.join(dumps_indented(kernel_json(k), indent=1, depth=2)
                                  for k in kernels)


def kernel_json(k: Kernel) -> dict[str, Any]:
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
        "builds": [_record(b) for b in k.builds],
        "tunables": [_record(t) for t in k.tunables],
        "references": [_reference_json(r) for r in k.references],
        "dispatch": [_record(x) for x in k.dispatch],
        "editable_files": list(k.editable_files),
        "unpaired": list(k.unpaired),
    }


def _reference_json(ref: ReferenceTest) -> dict[str, Any]:
    out = _record(ref)
    out["chain"] = [_record(step) for step in ref.chain]
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


def print_table(report: ScanReport, console: Console) -> None:
    from rich.table import Table

    table = Table(title=f"{len(report.kernels)} kernels in {report.root}", show_lines=True)
    for col in ("kernel", "defined at", "launched from", "python", "build", "tunables",
                "reference"):
        table.add_column(col, overflow="fold")
    for k in report.kernels:
        table.add_row(_kernel_cell(k), f"{k.file}:{k.definition.line}", _launch_cell(k),
                      _binding_cell(k), _build_cell(k), _tunable_cell(k), _reference_cell(k))
    console.print(table)
    _print_footer(report, console)


def _print_footer(report: ScanReport, console: Console) -> None:
    console.print(f"{report.files_scanned} source files scanned")
    for d in report.skipped_dirs:
        console.print(f"[dim]skipped generated build folder {d}/[/dim]")
    for p in report.problems:
        console.print(f"[{_colour(p)}]{_problem_text(p)}[/]", highlight=False)


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
    return "\n".join(f"{b.kind} {b.name} ({b.file}:{b.line})"
                     + (" [declared]" if b.origin == "declared" else "") for b in k.builds)


def _tunable_cell(k: Kernel) -> str:
    return "\n".join(f"{t.name}={t.value}"
                     + (f" (seen {', '.join(t.values_seen)})" if t.values_seen else "")
                     for t in k.tunables) or "-"


def _reference_cell(k: Kernel) -> str:
    if not k.references:
        return "NO REFERENCE TEST"
    return "\n".join(f"{r.file}:{r.line} {r.test} vs {r.reference} ({r.confidence:.1f})"
                     for r in k.references)


def to_markdown(report: ScanReport) -> str:
    lines = [f"# kfbot scan: {len(report.kernels)} kernels", "",
             "| kernel | defined at | launches | python | tunables | reference |",
             "|---|---|---|---|---|---|"]
    for k in report.kernels:
        cells = [k.definition.qualified_name, f"`{k.file}:{k.definition.line}`",
                 str(len(k.launch_sites)), _binding_cell(k), _tunable_cell(k),
                 _reference_cell(k)]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    lines += ["", f"{report.files_scanned} source files scanned."]
    if report.problems:
        lines += ["", "## Problems", ""] + [f"- {_md(_problem_text(p))}" for p in report.problems]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")
