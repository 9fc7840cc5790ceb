"""`kfbot lessons`: print what earlier runs learnt, from the committed experience file;
`kfbot lessons retire RUN_ID` (or `--reverted`): retire the lessons of a run that was
reverted, so no later search reads them."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from kfbot.commands.options import add_repo_argument
from kfbot.errors import EXIT_OK, EXIT_USAGE, KfbotError
from kfbot.listing import record_lines, table_fits
from kfbot.search.branch import reverted_candidates
from kfbot.search.experience import (
    DEFAULT_PATH,
    Lesson,
    candidate_tag,
    read_lessons,
    retire_lessons,
)
from kfbot.text import printable

# rich is imported only where the table is drawn.


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("lessons", help="print (or retire) the lessons of the experience file",
                       description="Print what earlier runs learnt: one lesson per thing "
                                   "tried, from the repository's experience file. `retire "
                                   "RUN_ID` retires a run's lessons (its change was "
                                   "reverted); `retire --reverted` retires those of every "
                                   "kfbot commit that HEAD's history reverts.")
    p.add_argument("action", nargs="?", choices=("retire",),
                   help="retire: mark lessons retired; they stay in the file but no search "
                        "reads them")
    p.add_argument("run_id", nargs="?", metavar="RUN_ID",
                   help="with retire: the run whose lessons to retire (its folder's name "
                        "under .kfbot/runs, as each lesson's `run` line says)")
    p.add_argument("--reverted", action="store_true",
                   help="with retire: the lessons of every kfbot commit (named by its "
                        "`Candidate:` line) that a commit of HEAD's history reverts")
    p.add_argument("--reason", default=None, metavar="TEXT",
                   help="with retire: why, written into each retired lesson")
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
    if args.action == "retire":
        return _retire(args, path)
    if args.run_id or args.reverted or args.reason:
        raise KfbotError("RUN_ID, --reverted and --reason go with `kfbot lessons retire`",
                         EXIT_USAGE)
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


def _retire(args: argparse.Namespace, path: Path) -> int:
    if bool(args.run_id) == bool(args.reverted):
        raise KfbotError("kfbot lessons retire: give a RUN_ID or --reverted (one of them)",
                         EXIT_USAGE)
    if not path.exists():
        raise KfbotError(f"{path}: no experience file to retire lessons from", EXIT_USAGE)
    today = datetime.date.today().isoformat()
    if args.run_id:
        why = args.reason or f"run {args.run_id} was reverted"
        done = retire_lessons(path, lambda x: x.run == args.run_id, why, today)
        said = f"run {args.run_id}"
    else:
        reverted = reverted_candidates(args.repo)
        tags = {candidate_tag(digest): sha for digest, sha in reverted.items()}

        def wanted(lesson: Lesson) -> bool:
            return any(tag in tags for tag in lesson.tags)

        def why_of(lesson: Lesson) -> str:
            sha = next(tags[t] for t in lesson.tags if t in tags)
            return args.reason or f"its commit was reverted by {sha[:10]}"

        done = []
        for lesson in [x for x in read_lessons(path) if wanted(x)]:
            done += retire_lessons(path, _same_lesson(lesson), why_of(lesson), today)
        said = f"{len(reverted)} reverted kfbot commit{'s' if len(reverted) != 1 else ''}"
    if not done:
        print(f"no standing lessons of {said} in {path}")
        return EXIT_OK
    for lesson in done:
        print(f"retired: {lesson.kernel} on {lesson.gpu}: {lesson.change} "
              f"({lesson.summary()}); {lesson.retired}")
    return EXIT_OK


def _same_lesson(lesson: Lesson) -> Callable[[Lesson], bool]:
    key = lesson.key()
    return lambda other: other.key() == key


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
    # Where each was measured, once any lesson says (older files say nowhere).
    where = any(x.run or x.toolchain() for x in lessons)
    header = ("kernel", "GPU", "change", "outcome", "date", *(("measured in",) if where else ()))
    rows = [tuple(printable(c) for c in (x.kernel, x.gpu, x.change, _outcome(x), x.date,
                                         *((_where(x),) if where else ())))
            for x in lessons]
    if not table_fits(header, rows, console.width):
        console.print(Text(title, style="bold"), soft_wrap=True)
        for x in lessons:
            lines = record_lines(printable(x.kernel), [
                ("GPU", printable(x.gpu)), ("change", printable(x.change)),
                ("outcome", printable(_outcome(x))), ("date", x.date),
                ("measured in", printable(_where(x)))], console.width)
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
    said = lesson.summary() + (f": {lesson.reason}" if lesson.reason else "")
    return f"RETIRED ({lesson.retired}); {said}" if lesson.retired else said


def _where(lesson: Lesson) -> str:
    """The run and the toolchain a lesson was measured with, as far as it says (–: it
    predates provenance)."""
    parts = [f"run {lesson.run}" if lesson.run else "", lesson.toolchain()]
    return "; ".join(p for p in parts if p) or "–"


def _style(lesson: Lesson) -> str | None:
    if lesson.retired:
        return "dim"
    return "red" if lesson.failed else "green" if lesson.outcome == "faster" else None
