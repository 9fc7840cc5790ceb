"""The sticky status comment: one per pull request and command, edited as a run goes.

The comment carries a hidden marker (`kfbot:status pr=7 command=optimize:softmax`), so
a run finds the comment an earlier run of the same command wrote and edits it rather
than adding another. Only comments written by a bot account are considered: anyone
can paste a marker into a comment, and kfbot must not try to edit theirs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from github.Issue import Issue
from github.IssueComment import IssueComment

from kfbot.github.api import DEFAULT_RETRY, GitHubError, Retry, call
from kfbot.github.markers import find_status_marker, status_marker
from kfbot.text import shown, utf8_safe

# GitHub refuses comment bodies over 65,536 characters.
COMMENT_LIMIT = 65_000

State = Literal["running", "done", "passed", "failed", "refused"]
ICONS = {"running": "⏳", "done": "🚀", "passed": "✅", "failed": "😕", "refused": "😕"}


@dataclass
class StatusReport:
    """What the status comment says: the request, its steps so far, and the result."""

    command: str  # the command line as written, or what kfbot was asked to do
    requester: str | None = None  # who asked, for a comment command
    head: str | None = None  # short SHA once pinned
    run_url: str | None = None  # the workflow run doing the work
    steps: list[str] = field(default_factory=list)
    state: State = "running"
    headline: str = "working on it"
    details: str = ""  # Markdown under the headline: a table, the usage, an error

    def markdown(self) -> str:
        where = f" at `{self.head}`" if self.head else ""
        run = f" · [workflow run]({self.run_url})" if self.run_url else ""
        who = f" from @{self.requester}" if self.requester else ""
        lines = [f"**{ICONS[self.state]} kfbot: {self.headline}**", "",
                 f"`{shown(self.command)}`{who}{where}{run}", ""]
        lines += [f"- {step}" for step in self.steps] + ([""] if self.steps else [])
        if self.details:
            lines += [self.details.rstrip()]
        return "\n".join(lines) + "\n"


class StatusComment:
    """kfbot's comment for one command on one pull request."""

    def __init__(self, issue: Issue, key: str, redact: Callable[[str], str],
                 retry: Retry = DEFAULT_RETRY) -> None:
        self.issue = issue
        self.key = redact(key)  # a command can quote anything, a secret included
        self.marker = status_marker(issue.number, self.key)
        self.redact = redact
        self.retry = retry
        self.comment: IssueComment | None = None
        self.url: str | None = None

    def show(self, report: StatusReport) -> str:
        """Create or edit the comment to say `report`; its URL."""
        body = self.marker + "\n" + fit_comment(utf8_safe(self.redact(report.markdown())))
        if self.comment is None:
            self.comment = self._find()
        comment = self.comment
        if comment is not None:
            try:
                call(lambda: comment.edit(body), "updating kfbot's status comment", self.retry)
                self.url = comment.html_url
                return self.url
            except GitHubError as exc:
                if exc.status not in (403, 404):  # gone or not ours: write a new one
                    raise
        number = self.issue.number
        self.comment = call(lambda: self.issue.create_comment(body),
                            f"commenting on pull request #{number}", self.retry)
        self.url = self.comment.html_url
        return self.url

    def show_if_exists(self, report: StatusReport) -> None:
        """Edit the comment an earlier run wrote to say `report`; write none if there is none."""
        if self.exists():
            self.show(report)

    def exists(self) -> bool:
        """Whether an earlier run wrote this comment (it is then kept up to date)."""
        if self.comment is None:
            self.comment = self._find()
        return self.comment is not None

    def _find(self) -> IssueComment | None:
        number = self.issue.number

        def mine() -> IssueComment | None:
            for comment in self.issue.get_comments():
                if comment.user is not None and comment.user.type == "Bot" and \
                        find_status_marker(comment.body, number, self.key) is not None:
                    return comment
            return None

        return call(mine, f"reading the comments of pull request #{number}", self.retry)


class StatusSink(Protocol):
    """Where a status goes: the comment itself, or the handoff the publish job posts from."""

    def show(self, report: StatusReport) -> object:
        """Say `report`."""

    def show_if_exists(self, report: StatusReport) -> None:
        """Say `report` only where an earlier run already said something."""


WITHHELD = ("This pull request comes from a fork, so kfbot posts no output of the code it "
            "ran here: the run's log has it{where}.")


def withheld(report: StatusReport) -> StatusReport:
    """`report` for a fork's pull request: the outcome and kfbot's own steps, and instead
    of anything the pull request's code printed (test output, reasons that quote it), a
    link to the run's log."""
    where = f": {report.run_url}" if report.run_url else ""
    headline = {"done": "done", "passed": "passed", "failed": "failed", "refused": "refused",
                "running": "working on it"}[report.state]
    return dataclasses.replace(report, headline=headline, details=WITHHELD.format(where=where))


def fit_comment(markdown: str) -> str:
    if len(markdown) <= COMMENT_LIMIT:
        return markdown
    cut = markdown[:COMMENT_LIMIT]
    cut = cut[: cut.rfind("\n") + 1] or cut
    return cut + "\n> **Truncated** to fit a comment; the job summary has the rest.\n"
