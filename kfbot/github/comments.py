"""The `/kfbot ...` comment commands: their grammar, and answering one.

Only a comment whose first line starts with the word `/kfbot` is a command; the rest
of the comment is free text for people. Arguments are `key=value` words after the
kernel name; an unknown key or a bad value is a `CommandError` that says which.

Answering a command: react 👀, check the commenter's permission, pin the pull
request's head (refusing forks unless the policy allows them, and then only for the
commit the command names), run it, and end with 🚀 or 😕. One status comment per
pull request and command says how far it got and, at the end, the result.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from github.IssueComment import IssueComment
from github.Repository import Repository

from kfbot.config import GithubConfig
from kfbot.errors import EXIT_FAILURE, EXIT_MISSING_TOOL, EXIT_OK, KfbotError
from kfbot.github.action_io import Annotation, Result
from kfbot.github.api import DEFAULT_RETRY, GitHubError, Retry, call
from kfbot.github.authorize import (
    Head,
    HeadMoved,
    Refused,
    authorize,
    check_checkout,
    check_head,
    pin_head,
)
from kfbot.github.events import CommentEvent
from kfbot.github.markers import find_status_marker
from kfbot.github.status import State, StatusComment, StatusReport, withheld
from kfbot.search.budget import parse_duration
from kfbot.text import shown

log = logging.getLogger(__name__)

PREFIX = "/kfbot"
Name = Literal["optimize", "scan", "bench", "help"]
NAMES: tuple[Name, ...] = ("optimize", "scan", "bench", "help")
# The key=value options each command accepts.
OPTIONS: dict[str, tuple[str, ...]] = {
    "optimize": ("budget", "time", "islands", "sha"),
    "scan": ("sha",),
    "bench": ("sha",),
    "help": (),
}
NEEDS_KERNEL = ("optimize", "bench")
RUNS_CODE = ("optimize", "bench")  # the others read files, run none
# Upper bounds keep one comment from holding a GPU runner for days.
MAX_BUDGET = 5000
MAX_ISLANDS = 32
MAX_SECONDS = 24 * 3600.0

_KERNEL = re.compile(r"[A-Za-z_][\w.+/-]*(?:::[\w.+/-]+)*")
_SHA = re.compile(r"[0-9a-f]{40}")

USAGE = """\
**kfbot commands** (first line of a comment on a pull request):

| command | what it does |
|---|---|
| `/kfbot optimize <kernel> [budget=N] [time=30m] [islands=N]` | search for a faster, \
verified version of the kernel on the GPU runner and open a pull request with it |
| `/kfbot scan` | list the CUDA kernels of the pull request's head, with their references |
| `/kfbot bench <kernel>` | benchmark the kernel at the pull request's head (GPU) |
| `/kfbot help` | this text |

`<kernel>` is a name, `namespace::name` or `file::name` as `kfbot scan` lists them.
On a pull request from a fork (when the repository allows it) add `sha=<head commit>`:
kfbot only runs the exact commit a maintainer named.
"""


class CommandError(KfbotError):
    """A comment command kfbot cannot run as written; the message says why."""


@dataclass(frozen=True)
class Command:
    name: Name
    kernel: str | None = None
    budget: int | None = None
    time: float | None = None  # seconds
    islands: int | None = None
    sha: str | None = None

    @property
    def key(self) -> str:
        """Names the sticky status comment: one per pull request and command."""
        return f"{self.name}:{self.kernel}" if self.kernel else self.name


def command_line(body: str) -> str | None:
    """The comment's first line when it is a `/kfbot` command, else None."""
    lines = body.lstrip().splitlines()
    first = lines[0].strip() if lines else ""
    word = first.split(maxsplit=1)[0] if first else ""
    return first if word == PREFIX else None


def parse_command(line: str) -> Command:
    """A command line (as `command_line` returns it) as a Command, or a CommandError."""
    words = line.split()[1:]
    if not words:
        return Command("help")
    word, rest = words[0].lower(), words[1:]
    if word not in NAMES:
        close = difflib.get_close_matches(word, NAMES, n=1)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        raise CommandError(f"unknown command `{shown(words[0])}`{hint}")
    name = NAMES[NAMES.index(word)]  # typed as the Literal
    kernel = None
    if name in NEEDS_KERNEL:
        if not rest or "=" in rest[0]:
            raise CommandError(f"`/kfbot {name}` needs a kernel name: `/kfbot {name} <kernel>`")
        kernel, rest = rest[0], rest[1:]
        if not _KERNEL.fullmatch(kernel):
            raise CommandError(f"`{shown(kernel)}` is not a kernel name")
    return Command(name, kernel, **_options(name, rest))  # type: ignore[arg-type]


def _options(name: str, words: list[str]) -> dict[str, object]:
    allowed = OPTIONS[name]
    found: dict[str, object] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            raise CommandError(f"unexpected `{shown(word)}`: options are written key=value "
                               f"({_allowed(name)})")
        if key not in allowed:
            raise CommandError(f"unknown option `{shown(key)}` for `/kfbot {name}` "
                               f"({_allowed(name)})")
        if key in found:
            raise CommandError(f"option `{shown(key)}` given twice")
        found[key] = _value(key, value)
    return found


def _allowed(name: str) -> str:
    allowed = OPTIONS[name]
    return "accepted: " + ", ".join(f"`{k}=`" for k in allowed) if allowed else "it takes none"


def _value(key: str, text: str) -> object:
    if key == "sha":
        if not _SHA.fullmatch(text):
            raise CommandError(f"`sha={shown(text)}`: expected the full 40-character commit SHA")
        return text
    if key == "time":
        try:
            seconds = parse_duration(text)
        except ValueError as exc:
            raise CommandError(f"`time={shown(text)}`: {shown(str(exc))}") from None
        if seconds > MAX_SECONDS:
            raise CommandError(f"`time={shown(text)}`: at most 24h")
        return seconds
    limit = MAX_BUDGET if key == "budget" else MAX_ISLANDS
    if not text.isdigit() or not 1 <= int(text) <= limit:
        raise CommandError(f"`{key}={shown(text)}`: expected a whole number from 1 to {limit}")
    return int(text)


# ---- handling a comment ----------------------------------------------------------------


class Work(Protocol):
    """What the commands do. The action supplies it, so this module needs no engine."""

    def scan(self) -> Result:
        """The checkout's kernel table."""

    def bench(self, command: Command) -> Result:
        """The kernel benchmarked at the checkout (GPU)."""

    def optimize(self, command: Command, policy: GithubConfig, head: Head,
                 before_publish: Callable[[], None], progress: Callable[[str], None]
                 ) -> Result:
        """The search (GPU) on `head`; `before_publish` raises if the pull request moved;
        `progress` puts a line on the status comment (every few minutes, not more)."""


@dataclass(frozen=True)
class Settings:
    root: Path  # the checkout of the pull request's head
    # The `github` config from the default branch (the pull request cannot change it),
    # read after the 👀: a broken config is then answered on the pull request.
    policy: Callable[[], GithubConfig]
    redact: Callable[[str], str]
    run_url: str | None = None
    retry: Retry = DEFAULT_RETRY
    # A job that checks nothing out only authorizes: it pins the head and stops there.
    authorize_only: bool = False
    # The head an earlier authorize job pinned: the command runs only on that commit.
    approved_head: str | None = None


def ignored_because(event: CommentEvent) -> str | None:
    """Why kfbot stays silent on this comment, or None when it is a command to answer."""
    if event.action != "created":
        return f"the comment was {event.action}, not created"
    if not event.is_pull_request:
        return f"#{event.number} is an issue, not a pull request"
    if event.from_bot:
        return f"the comment is from a bot (@{event.author})"
    if find_status_marker(event.body) is not None:
        return "the comment is kfbot's own"
    if command_line(event.body) is None:
        return "the comment is not a /kfbot command"
    return None


def handle_comment(event: CommentEvent, repo: Repository, work: Work,
                   settings: Settings) -> Result:
    """Answer one `/kfbot` comment: react, authorize, pin the head, run, report."""
    why = ignored_because(event)
    if why is not None:
        return Result(f"nothing to do: {why}")
    return _CommentRun(event, repo, work, settings).run()


class _CommentRun:
    def __init__(self, event: CommentEvent, repo: Repository, work: Work,
                 settings: Settings) -> None:
        self.event, self.repo, self.work, self.s = event, repo, work, settings
        self.line = command_line(event.body) or PREFIX
        self.report = StatusReport(self.line, event.author, run_url=settings.run_url)
        self.comment: IssueComment | None = None
        self.fork = False  # a fork's code runs: what it printed is not posted
        self.status: StatusComment | None = None

    def run(self) -> Result:
        number, cid = self.event.number, self.event.comment_id
        issue = call(lambda: self.repo.get_issue(number), f"reading #{number}", self.s.retry)
        self.comment = call(lambda: issue.get_comment(cid), f"reading comment {cid}",
                            self.s.retry)
        self._react("eyes")
        try:
            command: Command | CommandError = parse_command(self.line)
        except CommandError as exc:
            command = exc
        key = command.key if isinstance(command, Command) else "usage"
        self.status = StatusComment(issue, key, self.s.redact, self.s.retry)
        try:
            result = self._authorized(command)
        except KfbotError as exc:
            return self._finish(_failure(exc, command), "refused" if isinstance(
                exc, Refused) else "failed")
        if result.authorized_head:  # the GPU job takes it from here, status comment too
            self.report.headline = result.headline
            self._show()
            return result
        return self._finish(result, "done" if result.exit_code == EXIT_OK else "failed")

    def _authorized(self, command: Command | CommandError) -> Result:
        policy = self.s.policy()
        have = authorize(self.repo, self.event.author, policy.min_permission, self.s.retry)
        self.report.steps.append(f"✓ @{self.event.author} has `{have}` permission "
                                 f"(`{policy.min_permission}` needed)")
        if isinstance(command, CommandError):
            raise command
        if command.name == "help":
            return Result("usage", USAGE)
        head = pin_head(self.repo, self.event.number, policy, command.sha, self.s.retry)
        self.report.head = head.short
        self.fork = head.fork and command.name in RUNS_CODE
        if self.s.approved_head and head.sha != self.s.approved_head:
            raise HeadMoved(f"the head of pull request #{head.number} moved from "
                            f"{self.s.approved_head[:7]} to {head.short} after the command was "
                            "authorized; nothing was run: comment again to run on the new head")
        if self.s.authorize_only:
            self.report.steps.append(f"✓ authorized for the pull request's head `{head.short}`;"
                                     " waiting for the GPU runner")
            return Result(f"authorized: {command.key} on {head.short}",
                          authorized_head=head.sha)
        check_checkout(self.s.root, head)
        self.report.steps.append(f"✓ running on the pull request's head `{head.short}`")
        self._show()
        if command.name == "scan":
            return self.work.scan()
        if command.name == "bench":
            return self.work.bench(command)
        return self.work.optimize(command, policy, head,
                                  lambda: check_head(self.repo, head, self.s.retry),
                                  self._progress)

    def _progress(self, line: str) -> None:
        """The search's progress on the status comment. A failed edit is logged and the
        search goes on: the result is posted at the end, or said in the job's summary."""
        self.report.headline = f"searching: {line}"
        try:
            self._show()
        except GitHubError as exc:
            log.warning("the status comment was not updated: %s", exc)

    def _finish(self, result: Result, state: State) -> Result:
        self.report.state = state
        self.report.headline = result.headline
        self.report.details = result.details
        try:
            self._show()
            self._react("rocket" if state == "done" else "confused")
        except GitHubError as exc:
            return _unreported(result, exc)
        return result

    def _show(self) -> None:
        if self.status is not None:
            final = self.fork and self.report.state in ("done", "failed")
            self.status.show(withheld(self.report) if final else self.report)

    def _react(self, content: str) -> None:
        comment = self.comment
        if comment is not None:
            call(lambda: comment.create_reaction(content), f"reacting {content}",
                 self.s.retry)


def answer_handed(event: CommentEvent, approved: str | None, work: Work,
                  settings: Settings) -> tuple[Result, StatusReport | None]:
    """Answer a command in a job that holds no token to write with (the GPU job of the
    two-job workflow). The authorize job has reacted, checked the commenter's permission
    and the fork policy, and pinned the head (`approved`); this job checks that the
    checkout is that commit and runs the command. The status comment's last word comes
    back for the publish job to post; a winner goes into the handoff (`work`)."""
    why = ignored_because(event)
    if why is not None:
        return Result(f"nothing to do: {why}"), None
    line = command_line(event.body) or PREFIX
    report = StatusReport(line, event.author, run_url=settings.run_url)
    try:
        command: Command | CommandError = parse_command(line)
    except CommandError as exc:
        command = exc
    try:
        result = _run_handed(event.number, approved, command, work, settings, report)
    except KfbotError as exc:
        result = _failure(exc, command)
    report.state = "done" if result.exit_code == EXIT_OK else "failed"
    report.headline, report.details = result.headline, result.details
    return result, report


def _run_handed(number: int, approved: str | None, command: Command | CommandError,
                work: Work, settings: Settings, report: StatusReport) -> Result:
    if isinstance(command, CommandError):
        raise command
    if command.name == "help":
        return Result("usage", USAGE)
    if approved is None:
        raise KfbotError("a job without a token to write with runs a comment command only "
                         "on the head an authorize job pinned: pass that job's head-sha "
                         "output as the head-sha input")
    head = Head(number, approved, "", None, "", fork=False)
    check_checkout(settings.root, head)
    report.head = head.short
    report.steps.append(f"✓ running on the pull request's head `{head.short}`")
    if command.name == "scan":
        return work.scan()
    if command.name == "bench":
        return work.bench(command)
    return work.optimize(command, settings.policy(), head, lambda: None, lambda line: None)


def _unreported(result: Result, exc: GitHubError) -> Result:
    """The run's result, kept whole (pull request, speedup, report), when the last word on
    the pull request could not be written: the job summary and outputs still get it."""
    said = f"the result could not be posted on the pull request: {exc}"
    return dataclasses.replace(
        result, exit_code=max(result.exit_code, EXIT_FAILURE),
        details=f"{result.details.rstrip()}\n\n> **Not posted**: {said}\n".lstrip(),
        annotations=(*result.annotations, Annotation("error", said, title="kfbot")))


def _failure(exc: KfbotError, command: Command | CommandError) -> Result:
    if isinstance(exc, Refused):
        return Result(f"refused: {exc}", exit_code=EXIT_OK)
    details = ""
    if isinstance(exc, CommandError):
        details = USAGE
    elif exc.exit_code == EXIT_MISSING_TOOL and isinstance(command, Command):
        details = (f"`/kfbot {command.name}` needs a CUDA GPU and the CUDA toolkit on the "
                   "runner: run this workflow on a self-hosted GPU runner "
                   "(`runs-on: [self-hosted, gpu]`).")
    return Result(f"could not run: {exc}", details, exit_code=exc.exit_code)
