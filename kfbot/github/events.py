"""Webhook payloads, as the runner saves them at `$GITHUB_EVENT_PATH`, read into records.

Only the fields kfbot acts on are read, and each is checked: a payload that is not
JSON, lacks a field or has one of the wrong type is an error naming the file and the
field (`event.json: comment.user.login: missing`), never a KeyError later on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfbot.errors import KfbotError

EVENT_NAMES = ("issue_comment", "pull_request", "schedule", "workflow_dispatch")


@dataclass(frozen=True)
class CommentEvent:
    action: str  # created, edited, deleted
    repository: str  # owner/name
    number: int  # the issue or pull request
    is_pull_request: bool
    comment_id: int
    body: str
    author: str
    author_type: str  # User, Bot, Organization

    @property
    def from_bot(self) -> bool:
        return self.author_type == "Bot" or self.author.endswith("[bot]")


@dataclass(frozen=True)
class PullRequestEvent:
    action: str  # opened, synchronize, reopened, ...
    repository: str
    number: int
    head_sha: str
    head_ref: str
    head_repository: str | None  # None when the fork was deleted
    base_sha: str
    base_ref: str
    draft: bool = False

    @property
    def from_fork(self) -> bool:
        return self.head_repository != self.repository


@dataclass(frozen=True)
class ScheduleEvent:
    repository: str
    cron: str


@dataclass(frozen=True)
class DispatchEvent:
    repository: str
    ref: str
    inputs: dict[str, str] = field(default_factory=dict)


Event = CommentEvent | PullRequestEvent | ScheduleEvent | DispatchEvent


def load_event(name: str, path: Path, repository: str) -> Event:
    """The event `name` from its payload file; `repository` ($GITHUB_REPOSITORY) fills gaps."""
    if name not in EVENT_NAMES:
        raise KfbotError(f"event '{name}' (GITHUB_EVENT_NAME) is not handled; "
                         f"kfbot runs on {', '.join(EVENT_NAMES)}")
    payload = _Payload(_read(path), str(path))
    if name == "issue_comment":
        return _comment(payload)
    if name == "pull_request":
        return _pull_request(payload)
    repo = payload.optional_str("repository.full_name") or repository
    if name == "schedule":
        return ScheduleEvent(repo, payload.optional_str("schedule") or "")
    inputs = payload.get("inputs", dict, required=False) or {}
    return DispatchEvent(repo, payload.optional_str("ref") or "",
                         {str(k): "" if v is None else str(v) for k, v in inputs.items()})


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KfbotError(f"{path}: event file not found (GITHUB_EVENT_PATH)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KfbotError(f"{path}: cannot read the event file: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise KfbotError(f"{path}: not a valid event payload: invalid JSON at line "
                         f"{exc.lineno} column {exc.colno}: {exc.msg}") from None


def _comment(p: _Payload) -> CommentEvent:
    issue = p.get("issue", dict)
    return CommentEvent(
        action=p.text("action"),
        repository=p.text("repository.full_name"),
        number=p.number("issue.number"),
        # An issue comment on a pull request carries `issue.pull_request`; on an issue not.
        is_pull_request=isinstance(issue.get("pull_request"), dict),
        comment_id=p.number("comment.id"),
        body=p.get("comment.body", str, required=False) or "",
        author=p.text("comment.user.login"),
        author_type=p.text("comment.user.type"),
    )


def _pull_request(p: _Payload) -> PullRequestEvent:
    head_repo = p.get("pull_request.head.repo", dict, required=False)
    return PullRequestEvent(
        action=p.text("action"),
        repository=p.text("repository.full_name"),
        number=p.number("pull_request.number"),
        head_sha=p.sha("pull_request.head.sha"),
        head_ref=p.text("pull_request.head.ref"),
        head_repository=p.text("pull_request.head.repo.full_name") if head_repo else None,
        base_sha=p.sha("pull_request.base.sha"),
        base_ref=p.text("pull_request.base.ref"),
        draft=bool(p.get("pull_request.draft", bool, required=False)),
    )


class _Payload:
    """Dotted-path access to the JSON with errors that name the file and the field."""

    def __init__(self, data: Any, shown: str) -> None:
        if not isinstance(data, dict):
            raise KfbotError(f"{shown}: not a valid event payload: expected a JSON object")
        self.data = data
        self.shown = shown

    def get(self, dotted: str, kind: type, required: bool = True) -> Any:
        value: Any = self.data
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            if required:
                raise KfbotError(f"{self.shown}: {dotted}: missing from the event payload")
            return None
        # JSON has no bool/int distinction problem except that bool is an int in Python.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise KfbotError(f"{self.shown}: {dotted}: expected {_KINDS[kind]}, "
                             f"got {json.dumps(value)[:60]}")
        return value

    def text(self, dotted: str) -> str:
        value: str = self.get(dotted, str)
        if not value:
            raise KfbotError(f"{self.shown}: {dotted}: empty in the event payload")
        return value

    def optional_str(self, dotted: str) -> str | None:
        value: str | None = self.get(dotted, str, required=False)
        return value

    def number(self, dotted: str) -> int:
        value: int = self.get(dotted, int)
        return value

    def sha(self, dotted: str) -> str:
        value = self.text(dotted)
        if len(value) != 40 or any(ch not in "0123456789abcdef" for ch in value):
            raise KfbotError(f"{self.shown}: {dotted}: expected a 40-character commit SHA, "
                             f"got {value[:60]!r}")
        return value


_KINDS = {str: "a string", int: "an integer", dict: "an object", bool: "true or false"}
