"""`kfbot lessons`: print what earlier runs learnt, from the committed experience file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from kfbot.commands.options import add_repo_argument
from kfbot.errors import EXIT_OK
from kfbot.listing import record_lines, table_fits
from kfbot.search.experience import DEFAULT_PATH, Lesson, read_lessons
from kfbot.text import printable

# rich is imported only where the table is drawn.


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("lessons", help="print the lessons of the experience file",
                       description="Print what earlier runs learnt: one lesson per thing "
                                   "tried, from the repository's experience file.")
    add_repo_argument(p)
    p.add_argument("--file", type=Path, default=None, metavar="FILE",
                   help=f"experience file (default: REPO/{DEFAULT_PATH.as_posix()})")
    p.add_argument("--kernel", action="append", default=[], metavar="NAME",
                   help="only this kernel (file::name, ns::name or name); repeatable "
                        "(default: every kernel)")
    p.add_argument("--json", action="store_true", help="print a JSON list of the lessons")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path: Path = args.file if args.file is not None else args.repo / DEFAULT_PATH
    if not path.exists():
        _nothing(f"no lessons yet in {path}", args.json)
        return EXIT_OK
    lessons = read_lessons(path)
    if args.kernel:
        lessons = [x for x in lessons if any(_matches(x.kernel, name) for name in args.kernel)]
        if not lessons:
            _nothing(f"no lessons for {', '.join(args.kernel)} in {path}", args.json)
            return EXIT_OK
    if not lessons:
        _nothing(f"no lessons yet in {path}", args.json)
    elif args.json:
        sys.stdout.write(json.dumps([_as_json(x) for x in lessons], indent=2) + "\n")
    else:
        _table(lessons, path)
    return EXIT_OK


def _matches(kernel: str, name: str) -> bool:
    """`csrc/a.cu::ns::k` is named by itself, `k`, `ns::k`, `a.cu::ns::k` and so on."""
    return kernel == name or kernel.endswith(("::" + name, "/" + name))


def _nothing(message: str, as_json: bool) -> None:
    # JSON goes to a program: it gets an empty list, and the person the message.
    if as_json:
        sys.stdout.write("[]\n")
        print(message, file=sys.stderr)
    else:
        print(message)


def _as_json(lesson: Lesson) -> dict[str, object]:
    data = dataclasses.asdict(lesson)
    data["tags"] = list(lesson.tags)
    return data


def _table(lessons: Sequence[Lesson], path: Path) -> None:
    """A table; a list where a table would break a name (see kfbot.listing)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # A pipe or a file gets a wide table rather than rich's 80-column default.
    wide = sys.stdout.isatty() or "COLUMNS" in os.environ
    console = Console(width=None if wide else 200)
    title = f"{len(lessons)} lessons in {printable(str(path))}"
    header = ("kernel", "GPU", "change", "outcome", "date")
    rows = [tuple(printable(c) for c in (x.kernel, x.gpu, x.change, _outcome(x), x.date))
            for x in lessons]
    if not table_fits(header, rows, console.width):
        console.print(Text(title, style="bold"), soft_wrap=True)
        for x in lessons:
            lines = record_lines(printable(x.kernel), [
                ("GPU", printable(x.gpu)), ("change", printable(x.change)),
                ("outcome", printable(_outcome(x))), ("date", x.date)], console.width)
            console.print()
            console.print(Text(lines[0], style="bold"), soft_wrap=True)
            for line in lines[1:]:
                console.print(Text(line, style=_style(x) or ""), soft_wrap=True)
        return
    table = Table(title=Text(title), title_justify="left")
    for column in header:
        table.add_column(column, overflow="fold")
    for x, row in zip(lessons, rows, strict=True):
        table.add_row(*(Text(c) for c in row), style=_style(x))
    console.print(table)


def _outcome(lesson: Lesson) -> str:
    return lesson.summary() + (f": {lesson.reason}" if lesson.reason else "")


def _style(lesson: Lesson) -> str | None:
    return "red" if lesson.failed else "green" if lesson.outcome == "faster" else None
